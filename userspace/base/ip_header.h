// Reading an IP header, after bpf/parsing.h: one bounds-checked pass over an IPv4 or IPv6
// header (and IPv6's extension headers) that fills an IpHeader with what the rest of the
// engine asks of a packet: version, lengths, where the transport header starts and which
// protocol it is, addresses, and whether the packet is a fragment.
//
// parse_ip() checks in a fixed order and stops at the first check that fails; it returns the
// check that failed, or Ok. Every field the earlier checks fill is valid even when a later one
// fails: a quoted header in an ICMP error, cut short by design, still has its version,
// addresses and total length, only not the bytes that length promises. Nothing allocates;
// the parse is inline, for the per-packet path.
#pragma once

#include <cstdint>

#include "userspace/base/ip.h"
#include "userspace/base/wire.h"

namespace xesp {

// How far parse_ip() got, in the order it checks. Each value means the checks above it passed.
enum class IpParse : uint8_t {
    NotIp,        // shorter than a fixed header (20 or 40 bytes), or not version 4 or 6
    BadHeader,    // IPv4: IHL below 5, or the options run past the buffer
    BadLength,    // the total length is below the header's or past the buffer
    BadChain,     // IPv6: a hop-by-hop, routing or destination options header runs past the
                  // datagram
    BadFragment,  // IPv6: the Fragment header runs past the datagram
    Ok,
};

// The fixed header (IPv4: with its options) is in the buffer: the fields it fills can be read,
// though what its total length promises may not be there.
inline bool header_ok(IpParse s)
{
    return s > IpParse::BadHeader;
}
// The header and its lengths can be trusted: total bytes of datagram are in the buffer.
inline bool lengths_ok(IpParse s)
{
    return s > IpParse::BadLength;
}
// ... and so can the IPv6 extension headers in front of the transport header (or of a
// Fragment header, which may itself still be cut short).
inline bool chain_ok(IpParse s)
{
    return s > IpParse::BadChain;
}

// Addresses of a header parse_ip() has found to be IP (or that was checked before).
inline IpAddr ip_src(const uint8_t *ip)
{
    return wire::ip_version(ip) == 6 ? IpAddr::v6(ip + 8) : IpAddr::v4(ip + 12);
}
inline IpAddr ip_dst(const uint8_t *ip)
{
    return wire::ip_version(ip) == 6 ? IpAddr::v6(ip + 24) : IpAddr::v4(ip + 16);
}

struct IpHeader {
    const uint8_t *ip = nullptr;
    uint8_t version = 0;  // 4 or 6; 0 when NotIp (no other field is valid then)
    // The transport protocol: IPv4's protocol field; IPv6's next header after the extension
    // headers and the Fragment header, and in a first fragment the extension headers behind
    // it (the Fragment header's own number, 44, when that is cut short; the fixed header's
    // next header when the chain was not read).
    uint8_t proto = 0;
    bool fragment = false;  // IPv4: MF set or an offset; IPv6: a Fragment header
    // IPv6: a fragment whose protocol cannot be read (parse_ipv6); proto is then what the
    // Fragment header names (or 44, a second Fragment header behind the first).
    bool proto_unknown = false;
    bool more_fragments = false;  // MF / M
    bool dont_fragment = false;   // IPv4: DF; IPv6: always (routers never fragment it)
    uint16_t frag_offset = 0;     // bytes (the header's 8-byte units times 8)
    uint32_t hdr_len = 0;         // IPv4 with options (as read: checked from BadLength on);
                                  // IPv6 40, without extension headers
    uint32_t total = 0;           // the datagram's length per its header
    // The part ESP goes behind in transport mode (RFC 4303 3.1.1): IPv4's header, or IPv6's
    // with its hop-by-hop, routing and destination options headers. nh_off is the byte that
    // names what follows it (IPv4: 9, the protocol field).
    uint32_t chain_len = 0;
    uint32_t nh_off = 0;
    uint32_t l4_off = 0;  // the transport header: chain_len, + 8 behind a Fragment header (+
                          // the headers behind it in a first fragment)

    IpAddr src() const { return ip_src(ip); }
    IpAddr dst() const { return ip_dst(ip); }
};

namespace ip_detail {

inline IpParse parse_ipv4(const uint8_t *ip, uint32_t len, IpHeader *h)
{
    using namespace wire;
    if (len < kIpv4Len)
        return IpParse::NotIp;
    uint16_t frag = get16(ip + 6);
    h->version = 4;
    h->proto = ip[9];
    h->fragment = frag & (kIpv4Mf | kIpv4OffsetMask);
    h->more_fragments = frag & kIpv4Mf;
    h->dont_fragment = frag & kIpv4Df;
    h->frag_offset = uint16_t((frag & kIpv4OffsetMask) * 8);
    h->hdr_len = h->chain_len = h->l4_off = ipv4_hdr_len(ip);
    h->nh_off = 9;
    h->total = get16(ip + 2);
    if (h->hdr_len < kIpv4Len || h->hdr_len > len)
        return IpParse::BadHeader;
    if (h->total < h->hdr_len || h->total > len)
        return IpParse::BadLength;
    return IpParse::Ok;
}

inline bool is_ext_hdr(uint8_t nh)
{
    using namespace wire;
    return nh == kProtoIpv6HopByHop || nh == kProtoIpv6Route || nh == kProtoIpv6Opts;
}

// Hop-by-hop, routing and destination options headers from *off on, *nh the number of the
// header there: false if one runs past total. Otherwise *off is the first other header, *nh
// its number, and *nh_off the byte that named it (left as it was if there was none).
inline bool walk_ext_hdrs(const uint8_t *ip, uint32_t total, uint32_t *off, uint8_t *nh,
                          uint32_t *nh_off)
{
    while (is_ext_hdr(*nh)) {
        if (*off + 8 > total)
            return false;
        uint32_t ext = (uint32_t(ip[*off + 1]) + 1) * 8;
        if (*off + ext > total)
            return false;
        *nh_off = *off;
        *nh = ip[*off];
        *off += ext;
    }
    return true;
}

// RFC 8200 4: hop-by-hop, routing and destination options headers are walked (each is
// 8 bytes and a multiple of 8), then a Fragment header, and in a first fragment more of the
// first three behind it, as the kernel's xfrm (decode_session6) and the host that reassembles
// read them (bpf/parsing.h, parse_ipv6). A later fragment holds none of them, and a first one
// may cut them short: then the protocol is not known (proto_unknown).
inline IpParse parse_ipv6(const uint8_t *ip, uint32_t len, IpHeader *h)
{
    using namespace wire;
    if (len < kIpv6Len)
        return IpParse::NotIp;
    h->version = 6;
    h->dont_fragment = true;
    h->proto = ip[6];
    h->hdr_len = h->chain_len = h->l4_off = kIpv6Len;
    h->nh_off = 6;
    h->total = kIpv6Len + get16(ip + 4);
    if (h->total > len)
        return IpParse::BadLength;
    uint32_t off = kIpv6Len, nh_off = 6;
    uint8_t nh = ip[6];
    if (!walk_ext_hdrs(ip, h->total, &off, &nh, &nh_off))
        return IpParse::BadChain;
    h->chain_len = h->l4_off = off;
    h->nh_off = nh_off;
    h->proto = nh;
    if (nh != kProtoIpv6Frag)
        return IpParse::Ok;
    h->fragment = true;
    if (off + kIpv6FragHdrLen > h->total)
        return IpParse::BadFragment;
    uint16_t frag = get16(ip + off + 2);  // offset in 8-byte units, 2 reserved bits, M
    h->proto = nh = ip[off];
    h->frag_offset = uint16_t(frag & ~7u);
    h->more_fragments = frag & 1;
    h->l4_off = off = off + kIpv6FragHdrLen;
    if (h->frag_offset) {  // the headers are in the first fragment, not here
        h->proto_unknown = is_ext_hdr(nh) || nh == kProtoIpv6Frag;
        return IpParse::Ok;
    }
    if (!walk_ext_hdrs(ip, h->total, &off, &nh, &nh_off)) {
        h->proto_unknown = true;  // cut short: the rest is in a later fragment
        return IpParse::Ok;
    }
    h->proto = nh;
    h->l4_off = off;
    h->proto_unknown = nh == kProtoIpv6Frag;
    return IpParse::Ok;
}

}  // namespace ip_detail

// The IP header at ip, len bytes of buffer. See IpParse for what each result leaves valid.
inline IpParse parse_ip(const uint8_t *ip, uint32_t len, IpHeader *h)
{
    *h = IpHeader{};
    h->ip = ip;
    if (len < 1)
        return IpParse::NotIp;
    switch (wire::ip_version(ip)) {
    case 4:
        return ip_detail::parse_ipv4(ip, len, h);
    case 6:
        return ip_detail::parse_ipv6(ip, len, h);
    default:
        return IpParse::NotIp;
    }
}

}  // namespace xesp
