#include "userspace/base/ip.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace xesp {

std::optional<IpAddr> IpAddr::parse(std::string_view text)
{
    std::string s(text);
    IpAddr a;
    if (s.find(':') != std::string::npos) {
        if (inet_pton(AF_INET6, s.c_str(), a.b.data()) != 1)
            return std::nullopt;
        a.family = 6;
    } else {
        if (inet_pton(AF_INET, s.c_str(), a.b.data()) != 1)
            return std::nullopt;
        a.family = 4;
    }
    return a;
}

std::string IpAddr::str() const
{
    char buf[INET6_ADDRSTRLEN] = "";
    if (family == 4)
        inet_ntop(AF_INET, b.data(), buf, sizeof(buf));
    else if (family == 6)
        inet_ntop(AF_INET6, b.data(), buf, sizeof(buf));
    else
        return "unset";
    return buf;
}

namespace {

bool v6_loopback(const uint8_t *a)
{
    static const uint8_t one[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return std::memcmp(a, one, 16) == 0;
}

bool v6_unspecified(const uint8_t *a)
{
    static const uint8_t zero[16] = {};
    return std::memcmp(a, zero, 16) == 0;
}

bool v6_link_local(const uint8_t *a)
{
    return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

}  // namespace

bool martian(const IpAddr &src, const IpAddr &dst, bool to_us)
{
    const uint8_t *s = src.b.data(), *d = dst.b.data();
    if (src.family == 4) {
        const bool s_limited = s[0] == 255 && s[1] == 255 && s[2] == 255 && s[3] == 255;
        if ((s[0] >> 4) == 0xe || s_limited || s[0] == 127 || d[0] == 0 || d[0] == 127)
            return true;
        const bool d_limited = d[0] == 255 && d[1] == 255 && d[2] == 255 && d[3] == 255;
        const bool d_local_group = d[0] == 224 && d[1] == 0 && d[2] == 0;
        return s[0] == 0 && !d_limited && !d_local_group;
    }
    if (s[0] == 0xff || v6_loopback(s))
        return true;
    if (v6_unspecified(d) || v6_loopback(d))
        return true;
    if (d[0] == 0xff)
        return (d[1] & 0x0f) <= 1;  // reserved or interface-local scope
    if (to_us)
        return false;
    return v6_unspecified(s) || v6_link_local(s) || v6_link_local(d);
}

bool Prefix::contains(const IpAddr &a) const
{
    if (a.family != addr.family)
        return false;
    unsigned full = len / 8, rest = len % 8;
    if (std::memcmp(a.b.data(), addr.b.data(), full) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = uint8_t(0xff << (8 - rest));
    return (a.b[full] & mask) == addr.b[full];
}

std::optional<Prefix> Prefix::parse(std::string_view text)
{
    auto slash = text.find('/');
    auto addr = IpAddr::parse(text.substr(0, slash));
    if (!addr)
        return std::nullopt;
    unsigned max = addr->family == 6 ? 128 : 32;
    unsigned len = max;
    if (slash != std::string_view::npos) {
        auto digits = text.substr(slash + 1);
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), len);
        if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() ||
            len > max)
            return std::nullopt;
    }
    Prefix p;
    p.addr = *addr;
    p.len = uint8_t(len);
    unsigned full = len / 8, rest = len % 8;
    if (full < 16) {
        if (rest)
            p.addr.b[full] &= uint8_t(0xff << (8 - rest));
        for (unsigned i = full + (rest ? 1 : 0); i < 16; i++)
            p.addr.b[i] = 0;
    }
    return p;
}

std::string Prefix::str() const
{
    return addr.str() + "/" + std::to_string(len);
}

bool Selector::matches(const IpAddr &s, const IpAddr &d, uint8_t p, uint16_t sp, uint16_t dp) const
{
    if (!src.contains(s) || !dst.contains(d))
        return false;
    if (proto && proto != p)
        return false;
    if (sport_set && sport != sp)
        return false;
    if (dport_set && dport != dp)
        return false;
    return true;
}

}  // namespace xesp
