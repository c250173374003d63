// Addresses, prefixes and traffic selectors shared by the SA and policy databases.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace xesp {

struct IpAddr {
    uint8_t family = 0;           // 0 unset, 4 or 6
    std::array<uint8_t, 16> b{};  // IPv4 uses the first 4 bytes

    static IpAddr v4(const uint8_t *p)
    {
        IpAddr a;
        a.family = 4;
        std::memcpy(a.b.data(), p, 4);
        return a;
    }
    static IpAddr v6(const uint8_t *p)
    {
        IpAddr a;
        a.family = 6;
        std::memcpy(a.b.data(), p, 16);
        return a;
    }
    size_t size() const { return family == 6 ? 16 : 4; }
    bool operator==(const IpAddr &o) const = default;

    static std::optional<IpAddr> parse(std::string_view text);
    std::string str() const;
    bool operator<(const IpAddr &o) const
    {
        return family != o.family ? family < o.family : b < o.b;
    }
};

// A destination that is delivered to a group: IPv4 multicast (224/4) and limited broadcast,
// IPv6 multicast (ff00::/8), as the classifier's is_group_dst() (bpf/parsing.h) reads it. `a`
// points at the address's first byte.
inline bool is_group_dst(uint8_t family, const uint8_t *a)
{
    if (family == 6)
        return a[0] == 0xff;
    return (a[0] >> 4) == 0xe || (a[0] == 0xff && a[1] == 0xff && a[2] == 0xff && a[3] == 0xff);
}
inline bool is_group_dst(const IpAddr &a)
{
    return is_group_dst(a.family, a.b.data());
}

// Addresses the kernel's input drops as martians, whatever its routes, from any link but lo
// (route_localnet off): for IPv4, ip_route_input_slow() and ip_mc_validate_source(); for
// IPv6, ip6_rcv_core() and, for what it forwards, ip6_forward(). `to_us`: dst is one of the
// host's own addresses (IPv6 takes an unspecified or link-local source to those, never
// further). What depends on the host's addresses (an IPv4 source that is one of them,
// fib_validate_source()) is the caller's to check.
//   IPv4: from multicast, the limited broadcast or 127/8; from 0/8 but to the limited
//         broadcast or 224.0.0.0/24 (the kernel lets IGMP to other groups through too); to
//         0/8 or 127/8.
//   IPv6: from multicast or ::1; to ::1, or a multicast group of scope 0 or 1 (RFC 4291
//         2.7); and, when not to_us and not to a group, from :: or a link-local address
//         (ip6_forward()). Stricter than the kernel, which would send them back out of the
//         link they came from: to :: or another link's link-local address (RFC 4291 2.5.6).
bool martian(const IpAddr &src, const IpAddr &dst, bool to_us);

struct Prefix {
    IpAddr addr;  // host bits cleared
    uint8_t len = 0;

    bool contains(const IpAddr &a) const;
    bool operator==(const Prefix &o) const = default;

    // "10.0.0.0/8", "2001:db8::/32", a bare address is a host prefix.
    static std::optional<Prefix> parse(std::string_view text);
    std::string str() const;
};

// The `sel ...` of an SA and the selector of a policy. Port 0 with its mask unset means any.
struct Selector {
    Prefix src;
    Prefix dst;
    uint8_t proto = 0;  // 0 = any
    bool sport_set = false;
    bool dport_set = false;
    uint16_t sport = 0;
    uint16_t dport = 0;

    // ports are host order; proto 0 in the packet means "no transport header known"
    bool matches(const IpAddr &s, const IpAddr &d, uint8_t p, uint16_t sp, uint16_t dp) const;
    bool operator==(const Selector &o) const = default;
};

}  // namespace xesp
