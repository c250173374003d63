#include "userspace/icmp.h"

#include <algorithm>

#include "userspace/wire.h"

namespace xesp {

using namespace wire;

namespace {

constexpr uint32_t kIcmpHdrLen = 8;
constexpr uint32_t kIpv4ErrorMax = 576;
constexpr uint32_t kIpv6ErrorMax = 1280;

bool is_icmp_error(const uint8_t *ip, uint32_t len)
{
    if ((ip[0] >> 4) == 4) {
        uint32_t ihl = uint32_t(ip[0] & 0x0f) * 4;
        if (ip[9] != kProtoIcmp || ihl + 1 > len)
            return false;
        uint8_t type = ip[ihl];
        return type == 3 || type == 4 || type == 5 || type == 11 || type == 12;
    }
    // An ICMPv6 error has a type below 128 (RFC 4443 2.1).
    return ip[6] == kProtoIcmpv6 && len > kIpv6Len && ip[kIpv6Len] < 128;
}

} // namespace

bool may_fragment(const Pkt &p)
{
    const uint8_t *ip = p.ip();
    return (ip[0] >> 4) == 4 && !(get16(ip + 6) & kIpv4Df);
}

bool icmp_too_big(Pkt &p, const IpAddr &from, uint32_t mtu)
{
    uint8_t *orig = p.ip();
    bool v4 = (orig[0] >> 4) == 4;
    if (from.family != (v4 ? 4 : 6) || is_icmp_error(orig, p.len))
        return false;
    uint32_t ip_len = v4 ? kIpv4Len : kIpv6Len;
    uint32_t front = ip_len + kIcmpHdrLen;
    if (p.l3 < front)
        return false;
    uint32_t quoted = std::min(p.len, (v4 ? kIpv4ErrorMax : kIpv6ErrorMax) - front);
    uint8_t *ip = orig - front;
    uint8_t *icmp = ip + ip_len;
    uint32_t total = front + quoted;
    std::memset(ip, 0, front);
    if (v4) {
        ip[0] = 0x45;
        ip[1] = 0xc0;                               // CS6: network control
        put16(ip + 2, uint16_t(total));
        ip[8] = 64;
        ip[9] = kProtoIcmp;
        std::memcpy(ip + 12, from.b.data(), 4);
        std::memcpy(ip + 16, orig + 12, 4);         // back to the sender
        ipv4_set_checksum(ip);
        icmp[0] = 3;                                // destination unreachable
        icmp[1] = 4;                                // fragmentation needed and DF set
        put16(icmp + 6, uint16_t(std::min<uint32_t>(mtu, 0xffff)));
        put16(icmp + 2, uint16_t(~csum_fold(csum_add(0, icmp, kIcmpHdrLen + quoted))));
    } else {
        ip[0] = 0x6c;                               // traffic class CS6
        put16(ip + 4, uint16_t(total - kIpv6Len));
        ip[6] = kProtoIcmpv6;
        ip[7] = 64;
        std::memcpy(ip + 8, from.b.data(), 16);
        std::memcpy(ip + 24, orig + 8, 16);
        icmp[0] = 2;                                // packet too big
        put32(icmp + 4, mtu);
        uint32_t sum = csum_add(0, ip + 8, 32) + (total - kIpv6Len) + kProtoIcmpv6;
        put16(icmp + 2, uint16_t(~csum_fold(csum_add(sum, icmp, kIcmpHdrLen + quoted))));
    }
    p.l3 -= front;
    p.len = total;
    p.verdict = Verdict::TooBig;
    return true;
}

} // namespace xesp
