/* Packet parsing for the XDP classifier, after xdp-tools' parsing_helpers.h: a cursor, and
 * parse_* helpers that bounds-check every header before reading it and move the cursor past
 * it. They fill a struct flow: addresses, transport protocol and ports, offsets and lengths,
 * and whether the packet is a fragment or its IP header lies about its length.
 */
#pragma once

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "bpf/xesp_xdp_abi.h"

/* ---- Protocol constants ---------------------------------------------------------------- */

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88a8
#define MAX_VLAN_TAGS 2
#define MAX_IPV6_EXT 6      /* hop-by-hop, routing, destination options before ESP */
#define IP_FRAG_MASK 0x3fff /* MF | fragment offset */
#define IPV6_FRAG_OFFSET_MASK 0xfff8
#define IPPROTO_SCTP_ 132
#define IPPROTO_UDPLITE_ 136
#define IPPROTO_DCCP_ 33
#define NEXTHDR_HOP_ 0
#define NEXTHDR_ROUTING_ 43
#define NEXTHDR_FRAGMENT_ 44
#define NEXTHDR_DEST_ 60
#define NEXTHDR_ICMP_ 58
#define NATT_PORT 4500 /* RFC 3948 */
#define IKE_PORT 500
#define ESP_HDR_LEN 8 /* SPI + sequence number */

struct cursor {
    void *pos;
    void *end;
};

struct vlan_hdr_ {
    __be16 tci;
    __be16 proto;
};

struct ipv6_ext_ {
    __u8 nexthdr;
    __u8 hdrlen; /* 8-byte units, not counting the first 8 */
};

struct frag_hdr_ {
    __u8 nexthdr;
    __u8 reserved;
    __be16 frag_off;
    __be32 id;
};

/* The packet as the classifier sees it. */
struct flow {
    __be32 src[4];
    __be32 dst[4];
    __u8 family;
    __u8 proto;         /* transport protocol after extension headers */
    __u8 fragment;      /* no ports: a fragment or a cut-short transport header */
    __u8 proto_unknown; /* IPv6: a fragment whose protocol cannot be read (parse_ipv6) */
    __u8 bad_length;    /* the IP header's length does not fit the frame */
    __be16 sport, dport;
    __u16 l3_off, l4_off;
    __u32 ip_len; /* the IP datagram's length per its header */
    __u32 ingress_ifindex;
    __u8 tos;
    __u8 hop_limit; /* IPv6 only */
    __u8 too_big;   /* ICMP "fragmentation needed" / "packet too big" quoting
                                       ESP or UDP (maybe ESP in UDP) */
};

/* ---- Parsing --------------------------------------------------------------------------- */

/* A 16-bit length or offset read from a header, in host order, that the verifier knows to be
 * at most 0xffff. The 6.1 and 6.12 verifiers do not bound the result of a byte swap (6.18's
 * does): adding it to a packet pointer is rejected ("math between pkt pointer and register
 * with unbounded min value"). The mask sets the bound again; the empty asm keeps the compiler
 * from dropping it as redundant. Every length read from a packet goes through here before it
 * meets a pointer. */
static __always_inline __u32 bounded_ntohs(__be16 v)
{
    __u32 x = bpf_ntohs(v);
    asm volatile("" : "+r"(x));
    return x & 0xffff;
}

/* Ethernet and up to two VLAN tags (802.1Q, 802.1ad). Returns the ethertype, host order,
 * or -1 if the frame is too short, -2 if it has more tags than we look through. */
static __always_inline int parse_eth(struct cursor *c)
{
    struct ethhdr *eth = c->pos;
    if ((void *)(eth + 1) > c->end)
        return -1;
    c->pos = eth + 1;
    __u16 proto = bpf_ntohs(eth->h_proto);

#pragma unroll
    for (int i = 0; i < MAX_VLAN_TAGS; i++) {
        if (proto != ETH_P_8021Q_ && proto != ETH_P_8021AD_)
            return proto;
        struct vlan_hdr_ *vh = c->pos;
        if ((void *)(vh + 1) > c->end)
            return -1;
        c->pos = vh + 1;
        proto = bpf_ntohs(vh->proto);
    }
    if (proto == ETH_P_8021Q_ || proto == ETH_P_8021AD_)
        return -2;
    return proto;
}

/* IPv4 with options. Returns 0, or -1 if the header is malformed. A total length that does
 * not fit the frame is noted in f->bad_length: fatal only if the packet turns out to be ESP
 * for one of our SAs (dropped) or plaintext (passed to the kernel, which drops it). */
static __always_inline int parse_ipv4(struct cursor *c, void *data, struct flow *f)
{
    struct iphdr *ip = c->pos;
    if ((void *)(ip + 1) > c->end)
        return -1;
    __u32 hlen = ip->ihl * 4;
    if (hlen < sizeof(*ip))
        return -1;
    if (c->pos + hlen > c->end)
        return -1;
    f->family = XESP_FAMILY_V4;
    f->src[0] = ip->saddr;
    f->dst[0] = ip->daddr;
    f->proto = ip->protocol;
    f->tos = ip->tos;
    f->fragment = (bpf_ntohs(ip->frag_off) & IP_FRAG_MASK) != 0;
    f->ip_len = bounded_ntohs(ip->tot_len);
    if (f->ip_len < hlen || c->pos + f->ip_len > c->end)
        f->bad_length = 1;
    c->pos += hlen;
    f->l4_off = c->pos - data;
    return 0;
}

static __always_inline int is_ext_hdr(__u8 nh)
{
    return nh == NEXTHDR_HOP_ || nh == NEXTHDR_ROUTING_ || nh == NEXTHDR_DEST_;
}

/* Hop-by-hop, routing and destination options headers from c on: 0 with c at the first other
 * header and *nh its number, -1 if one runs past the frame, -2 if there are more than we
 * follow. */
static __always_inline int walk_ext_hdrs(struct cursor *c, __u8 *nh)
{
    for (int i = 0; i < MAX_IPV6_EXT; i++) {
        if (!is_ext_hdr(*nh))
            return 0;
        struct ipv6_ext_ *ext = c->pos;
        if ((void *)(ext + 1) > c->end)
            return -1;
        __u32 len = ((__u32)ext->hdrlen + 1) * 8;
        if (c->pos + len > c->end)
            return -1;
        *nh = ext->nexthdr;
        c->pos += len;
    }
    return is_ext_hdr(*nh) ? -2 : 0;
}

/* IPv6 and the extension headers in front of the transport header: hop-by-hop, routing,
 * destination options, a fragment header, and behind it more of the first three, as the
 * kernel's xfrm (decode_session6) and the host that reassembles read them. Returns 0, -1 if
 * malformed, -2 if the chain is longer than we follow.
 *
 * Behind a Fragment header the protocol may not be there to read: a later fragment carries
 * none of the headers (its Fragment header names the first of them), and a first fragment may
 * cut them short, the rest to come in the next one (RFC 7112 forbids it; an attacker does
 * not ask). Such a packet is proto_unknown: any policy that names a protocol may be about it. */
static __always_inline int parse_ipv6(struct cursor *c, void *data, struct flow *f)
{
    struct ipv6hdr *ip6 = c->pos;
    if ((void *)(ip6 + 1) > c->end)
        return -1;
    f->family = XESP_FAMILY_V6;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f->src[i] = ip6->saddr.in6_u.u6_addr32[i];
        f->dst[i] = ip6->daddr.in6_u.u6_addr32[i];
    }
    f->tos = (bpf_ntohs(*(__be16 *)ip6) >> 4) & 0xff;
    f->hop_limit = ip6->hop_limit;
    f->ip_len = sizeof(*ip6) + bounded_ntohs(ip6->payload_len);
    if (c->pos + f->ip_len > c->end)
        f->bad_length = 1;
    __u8 nh = ip6->nexthdr;
    c->pos = ip6 + 1;

    int rc = walk_ext_hdrs(c, &nh);
    if (rc < 0)
        return rc;
    if (nh == NEXTHDR_FRAGMENT_) {
        struct frag_hdr_ *fh = c->pos;
        if ((void *)(fh + 1) > c->end)
            return -1;
        f->fragment = 1;
        nh = fh->nexthdr;
        c->pos = fh + 1;
        if (fh->frag_off & bpf_htons(IPV6_FRAG_OFFSET_MASK)) {
            f->proto_unknown = is_ext_hdr(nh) || nh == NEXTHDR_FRAGMENT_;
        } else {
            struct cursor at = *c;
            __u8 first = nh;
            rc = walk_ext_hdrs(c, &nh);
            if (rc == -2)
                return rc;
            /* Cut short, by the frame or by the datagram (bytes past its length are padding):
             * the protocol is in a later fragment. */
            if (rc < 0 || c->pos - data > f->l3_off + f->ip_len) {
                *c = at;
                nh = first;
                f->proto_unknown = 1;
            } else if (nh == NEXTHDR_FRAGMENT_) {
                f->proto_unknown = 1;
            }
        }
    }
    f->proto = nh;
    f->l4_off = c->pos - data;
    if (f->l4_off > f->l3_off + f->ip_len)
        return -1;
    return 0;
}

/* What parse_ip found. */
enum parse_result {
    PARSE_OK = 0,
    PARSE_MALFORMED = -1,
    PARSE_VLAN_DEPTH = -2, /* more VLAN tags than we look through */
    PARSE_NON_IP = -3,
    PARSE_EXT_DEPTH = -4, /* more IPv6 extension headers than we follow */
};

/* Ethernet, VLAN tags and the IP header (with IPv4 options / IPv6 extension headers), into f;
 * c ends at the transport header. */
static __always_inline int parse_ip(struct cursor *c, void *data, struct flow *f)
{
    int proto = parse_eth(c);
    if (proto == -2)
        return PARSE_VLAN_DEPTH;
    if (proto < 0)
        return PARSE_MALFORMED;
    f->l3_off = c->pos - data;
    int rc;
    if (proto == ETH_P_IP)
        rc = parse_ipv4(c, data, f);
    else if (proto == ETH_P_IPV6)
        rc = parse_ipv6(c, data, f);
    else
        return PARSE_NON_IP;
    if (rc == -2)
        return PARSE_EXT_DEPTH;
    return rc < 0 ? PARSE_MALFORMED : PARSE_OK;
}

/* ICMP "fragmentation needed" (type 3 code 4) or ICMPv6 "packet too big" (type 2) whose quoted
 * packet is ESP or UDP: sets f->too_big. The quoted headers are read no further than their
 * protocol; userspace checks the rest. */
static __always_inline void parse_too_big(struct cursor *c, struct flow *f)
{
    __u8 *icmp = c->pos;
    if (f->fragment)
        return;
    __u8 quoted;
    if (f->family == XESP_FAMILY_V4 && f->proto == IPPROTO_ICMP) {
        if ((void *)(icmp + 8 + 10) > c->end || icmp[0] != 3 || icmp[1] != 4)
            return;
        quoted = icmp[8 + 9]; /* the quoted IPv4 header's protocol */
    } else if (f->family == XESP_FAMILY_V6 && f->proto == NEXTHDR_ICMP_) {
        if ((void *)(icmp + 8 + 7) > c->end || icmp[0] != 2 || icmp[1] != 0)
            return;
        quoted = icmp[8 + 6]; /* the quoted IPv6 header's next header */
    } else {
        return;
    }
    f->too_big = quoted == IPPROTO_ESP || quoted == IPPROTO_UDP;
}

/* IPv6 neighbour discovery (RFC 4861: router and neighbour solicitations and advertisements,
 * redirects) in the shape the kernel's ndisc_rcv takes: ICMPv6 types 133-137 with code 0, not
 * in a fragment, hop limit 255 (sent on this link, not routed here). The ICMPv6 header is at c. */
static __always_inline int is_nd(const struct cursor *c, const struct flow *f)
{
    if (f->family != XESP_FAMILY_V6 || f->proto != NEXTHDR_ICMP_ || f->fragment ||
        f->hop_limit != 255)
        return 0;
    __u8 *icmp = c->pos;
    return (void *)(icmp + 2) <= c->end && icmp[0] >= 133 && icmp[0] <= 137 && icmp[1] == 0;
}

/* An IPv6 destination of the link, where neighbour discovery goes unless it is to one of the
 * gateway's addresses: link-scope multicast (ff02::/16) or link-local unicast (fe80::/10). */
static __always_inline int is_link_dst_v6(const struct flow *f)
{
    __u32 top = bpf_ntohl(f->dst[0]);
    return (top >> 16) == 0xff02 || (top & 0xffc00000) == 0xfe800000;
}

/* A multicast or limited broadcast destination: delivered to the gateway as well as, maybe,
 * forwarded. */
static __always_inline int is_group_dst(const struct flow *f)
{
    __u32 top = bpf_ntohl(f->dst[0]);
    if (f->family == XESP_FAMILY_V6)
        return (top >> 24) == 0xff;
    return (top >> 28) == 0xe || top == 0xffffffff;
}

/* A packet to a unicast address in a multicast or broadcast frame (`eth` is the frame's
 * start): the kernel takes such a frame (PACKET_MULTICAST, PACKET_BROADCAST) but forwards
 * none of them, as ip_forward() and ip6_forward() want PACKET_HOST. */
static __always_inline int unicast_in_group_frame(const __u8 *eth, const void *end,
                                                  const struct flow *f)
{
    return (const void *)(eth + 1) <= end && (eth[0] & 1) && !is_group_dst(f);
}

/* Source and destination ports of the protocols that have them; a transport header too short
 * to hold them makes the packet portless, as a fragment. */
static __always_inline void parse_ports(struct cursor *c, struct flow *f)
{
    if (f->fragment)
        return;
    if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP && f->proto != IPPROTO_SCTP_ &&
        f->proto != IPPROTO_UDPLITE_ && f->proto != IPPROTO_DCCP_)
        return;
    __be16 *ports = c->pos;
    if ((void *)(ports + 2) > c->end || f->l4_off + 4 > f->l3_off + f->ip_len) {
        f->fragment = 1;
        return;
    }
    f->sport = ports[0];
    f->dport = ports[1];
}
