#include "userspace/esp/icmp.h"

#include <algorithm>

#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

namespace {

constexpr uint32_t kIcmpHdrLen = 8;
constexpr uint32_t kIpv4ErrorMax = 576;
constexpr uint32_t kIpv6ErrorMax = 1280;
constexpr uint8_t kProtoAh = 51;

// Whether ip is an ICMP error, or may be one: the kernel answers neither. An ICMP type that
// is not there to read counts as one, as does an IPv4 type the kernel does not know
// (icmp_send(): above NR_ICMP_TYPES, 18).
bool is_icmp_error(const uint8_t *ip, uint32_t len)
{
    if (ip_version(ip) == 4) {
        const uint32_t ihl = ipv4_hdr_len(ip);
        if (ip[9] != kProtoIcmp || (get16(ip + 6) & kIpv4OffsetMask))
            return false;  // a later fragment has no type (answerable() refuses it anyway)
        if (ihl + 1 > len)
            return true;
        const uint8_t type = ip[ihl];
        return type > 18 || type == 3 || type == 4 || type == 5 || type == 11 || type == 12;
    }
    // An ICMPv6 error has a type below 128 (RFC 4443 2.1), read behind the hop-by-hop,
    // routing, destination options, AH and first Fragment headers, as the kernel's
    // is_ineligible() reads it (ipv6_skip_exthdr()). A later fragment has no type to read; a
    // chain cut short is answered, as the kernel answers it.
    uint8_t nh = ip[6];
    uint32_t off = kIpv6Len;
    for (int i = 0; i < 8; i++) {
        if (nh == kProtoIcmpv6)
            return off + 1 > len || ip[off] < 128;
        if (off + 8 > len)
            return false;
        if (nh == kProtoIpv6Frag) {
            if (get16(ip + off + 2) & ~7u)
                return false;
            nh = ip[off];
            off += 8;
        } else if (nh == kProtoIpv6HopByHop || nh == kProtoIpv6Route || nh == kProtoIpv6Opts ||
                   nh == kProtoAh) {
            const uint32_t n =
                nh == kProtoAh ? (uint32_t(ip[off + 1]) + 2) * 4 : (uint32_t(ip[off + 1]) + 1) * 8;
            nh = ip[off];
            off += n;
        } else {
            return false;
        }
    }
    return false;
}

}  // namespace

bool may_fragment(const Pkt &p)
{
    const uint8_t *ip = p.ip();
    return ip_version(ip) == 4 && !(get16(ip + 6) & kIpv4Df);
}

namespace {

// Whether an IPv6 source names a single host: not unspecified, not multicast.
bool ipv6_src_names_host(const uint8_t *ip)
{
    static const uint8_t zero[16] = {};
    const uint8_t *src = ip + 8;
    return src[0] != 0xff && std::memcmp(src, zero, 16) != 0;
}

// Whether a packet may be answered with an ICMP error at all (RFC 1122 3.2.2, RFC 1812
// 4.3.2.7, RFC 4443 2.4 e): not for an ICMP error, a fragment other than the first, a packet
// to a multicast or broadcast address, or one whose source names no single host.
bool answerable(const uint8_t *ip, uint32_t len)
{
    if (is_icmp_error(ip, len))
        return false;
    if (ip_version(ip) == 4) {
        const uint8_t *src = ip + 12, *dst = ip + 16;
        bool frag_later = get16(ip + 6) & kIpv4OffsetMask;
        bool src_none = src[0] == 0 || src[0] == 127 || src[0] >= 224;
        bool dst_none = is_group_dst(4, dst) || dst[0] >= 240;  // reserved (240/4) too
        return !frag_later && !dst_none && !src_none;
    }
    return !is_group_dst(6, ip + 24) && ipv6_src_names_host(ip);
}

// "Packet too big" follows the same rules, but for IPv6 it goes to a multicast destination's
// sender too (RFC 4443 2.4 e.2): path MTU discovery for multicast needs it, and the kernel
// sends it (icmp6_send()).
bool too_big_answerable(const uint8_t *ip, uint32_t len)
{
    if (ip_version(ip) == 4)
        return answerable(ip, len);
    return !is_icmp_error(ip, len) && ipv6_src_names_host(ip);
}

// p becomes, in place, ICMP (type4, code4) or ICMPv6 (type6, code6) from `from` back to the
// packet's source, with `param` in the header's second word (IPv4: its low 16 bits).
bool icmp_error(Pkt &p, const IpAddr &from, uint8_t type4, uint8_t code4, uint8_t type6,
                uint8_t code6, uint32_t param)
{
    uint8_t *orig = p.ip();
    bool v4 = ip_version(orig) == 4;
    if (from.family != (v4 ? 4 : 6))
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
        ip[1] = 0xc0;  // CS6: network control
        put16(ip + 2, uint16_t(total));
        ip[8] = 64;
        ip[9] = kProtoIcmp;
        std::memcpy(ip + 12, from.b.data(), 4);
        std::memcpy(ip + 16, orig + 12, 4);  // back to the sender
        ipv4_set_checksum(ip);
        icmp[0] = type4;
        icmp[1] = code4;
        put16(icmp + 6, uint16_t(std::min<uint32_t>(param, 0xffff)));
        put16(icmp + 2, uint16_t(~csum_fold(csum_add(0, icmp, kIcmpHdrLen + quoted))));
    } else {
        ip[0] = 0x6c;  // traffic class CS6
        put16(ip + 4, uint16_t(total - kIpv6Len));
        ip[6] = kProtoIcmpv6;
        ip[7] = 64;
        std::memcpy(ip + 8, from.b.data(), 16);
        std::memcpy(ip + 24, orig + 8, 16);
        icmp[0] = type6;
        icmp[1] = code6;
        put32(icmp + 4, param);
        uint32_t sum = csum_add(0, ip + 8, 32) + (total - kIpv6Len) + kProtoIcmpv6;
        put16(icmp + 2, uint16_t(~csum_fold(csum_add(sum, icmp, kIcmpHdrLen + quoted))));
    }
    p.l3 -= front;
    p.len = total;
    return true;
}

}  // namespace

bool icmp_too_big(Pkt &p, const IpAddr &from, uint32_t mtu)
{
    // Destination unreachable, fragmentation needed and DF set (RFC 1191); packet too big.
    if (!too_big_answerable(p.ip(), p.len) || !icmp_error(p, from, 3, 4, 2, 0, mtu))
        return false;
    p.verdict = Verdict::TooBig;
    return true;
}

bool icmp_time_exceeded(Pkt &p, const IpAddr &from)
{
    // Time exceeded in transit (RFC 792); hop limit exceeded in transit (RFC 4443 3.3).
    if (!answerable(p.ip(), p.len) || !icmp_error(p, from, 11, 0, 3, 0, 0))
        return false;
    p.verdict = Verdict::TimeExceeded;
    return true;
}

bool icmp_may_answer(const uint8_t *ip, uint32_t len, bool too_big)
{
    return too_big ? too_big_answerable(ip, len) : answerable(ip, len);
}

IcmpAnswer icmp_time_exceeded(Pkt &p, const IpAddr &from, IcmpLimiter &limit, uint64_t now_ns)
{
    if (from.family != (ip_version(p.ip()) == 4 ? 4 : 6) || !answerable(p.ip(), p.len))
        return IcmpAnswer::Refused;
    if (!limit.allow(now_ns))
        return IcmpAnswer::Limited;
    if (!icmp_error(p, from, 11, 0, 3, 0, 0))  // answerable: asked above
        return IcmpAnswer::Refused;
    p.verdict = Verdict::TimeExceeded;
    return IcmpAnswer::Sent;
}

}  // namespace xesp
