/* The maps that both programs of the classifier's BPF object use: the XDP classifier
 * (xesp_xdp.bpf.c) and the tc programs (xesp_tc.bpf.c). Each .bpf.c is compiled on its
 * own and the objects are linked into one (`bpftool gen object`, libbpf's static linker; see
 * cmake/BpfSkeleton.cmake). The maps here are __weak: every file that includes this header
 * defines them, and the link keeps one of each, which both programs then share (one map,
 * not a copy, in the skeleton). A map only one program uses is defined in that program's file.
 */
#pragma once

#include <linux/bpf.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "bpf/parsing.h"
#include "bpf/xesp_xdp_abi.h"

/* ---- Policies (the tuple-space search, see xesp_xdp_abi.h and spd_lookup.h) ------------- */

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 262144); /* the loader resizes it */
    __type(key, struct xesp_policy_key);
    __type(value, struct xesp_policy_val);
} policies SEC(".maps") __weak;

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, struct xesp_tuple_table);
} tuple_tables SEC(".maps") __weak;

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32); /* index of the live tuple table */
} tuple_ctl SEC(".maps") __weak;

/* ---- The gateway's own addresses -------------------------------------------------------- */

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, struct xesp_addr_key);
    __type(value, __u32);
} local_addrs SEC(".maps") __weak;

/* XESP_LOCAL_OWN or XESP_LOCAL_BROADCAST; 0: not the gateway's. */
static __always_inline __u32 local_addr_kind(__u8 family, const __be32 *addr)
{
    struct xesp_addr_key k = {.family = family};
#pragma unroll
    for (int i = 0; i < 4; i++)
        k.addr[i] = addr[i];
    __u32 *kind = bpf_map_lookup_elem(&local_addrs, &k);
    return kind ? *kind : 0;
}

/* Delivered to the gateway: one of its addresses, or a broadcast address of its own. */
static __always_inline int is_local_addr(__u8 family, const __be32 *addr)
{
    return local_addr_kind(family, addr) != 0;
}

/* ---- Interfaces ------------------------------------------------------------------------- */

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, __u32); /* ifindex */
    __type(value, struct xesp_iface);
} ifaces SEC(".maps") __weak;

/* The gateway's local link, a veth pair: [0] the kernel's end, where tc egress sends the
 * gateway's own plaintext to protect and tun mode its UDP; [1] the gateway's end, where the
 * XDP program takes it. An ifindex; 0: none. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u32);
} local_link SEC(".maps") __weak;

/* Arrived at the gateway's end of its local link: what the gateway sent itself (or, in tun
 * mode, what the tc program of a protected interface has checked already). */
static __always_inline int from_local_link(__u32 ifindex)
{
    __u32 one = 1;
    __u32 *end = bpf_map_lookup_elem(&local_link, &one);
    return end && *end && *end == ifindex;
}

/* Plaintext to protect that the kernel would never have forwarded into a tunnel, as its input
 * drops it as a martian first (ip_route_input_slow() and fib_validate_source() with
 * route_localnet and accept_local off; ip6_rcv_core(), ip6_forward()): IPv4 from multicast,
 * the limited broadcast, 0/8, 127/8, or one of the gateway's own addresses, or to 0/8 or
 * 127/8; IPv6 from multicast, ::1, :: or a link-local address, or to ::1 or a link-local
 * address (RFC 4291 2.5.6). Stricter than the kernel without rp_filter: from one of the
 * gateway's broadcast addresses. `own`: the gateway sent it itself, through its local link:
 * its own addresses, link-local ones too, are its to send from. What comes out of an SA has
 * the same checks in the engine (martian()). */
static __always_inline int forward_martian(const struct flow *f, int own)
{
    __u32 s = bpf_ntohl(f->src[0]), d = bpf_ntohl(f->dst[0]);
    if (f->family == XESP_FAMILY_V4) {
        __u8 s0 = s >> 24, d0 = d >> 24;
        if ((s0 >> 4) == 0xe || s == 0xffffffff || s0 == 0 || s0 == 127 || d0 == 0 || d0 == 127)
            return 1;
        return !own && is_local_addr(f->family, f->src);
    }
    const int s_loop = !f->src[0] && !f->src[1] && !f->src[2] && f->src[3] == bpf_htonl(1);
    const int d_loop = !f->dst[0] && !f->dst[1] && !f->dst[2] && f->dst[3] == bpf_htonl(1);
    if ((s >> 24) == 0xff || s_loop || d_loop)
        return 1;
    if (own)
        return 0;
    const int s_any = !f->src[0] && !f->src[1] && !f->src[2] && !f->src[3];
    return s_any || (s & 0xffc00000) == 0xfe800000 || (d & 0xffc00000) == 0xfe800000;
}

/* A unicast frame to an Ethernet address its interface does not take (struct xesp_iface):
 * another station's. `eth` is the frame's start. */
static __always_inline int other_host(const __u8 *eth, const void *end,
                                      const struct xesp_iface *ifc)
{
    if (!ifc || !ifc->nmacs || (const void *)(eth + 6) > end || (eth[0] & 1))
        return 0;
#pragma unroll
    for (int m = 0; m < XESP_IFACE_MACS; m++) {
        __u8 diff = 0;
#pragma unroll
        for (int i = 0; i < 6; i++)
            diff |= eth[i] ^ ifc->macs[m][i];
        if (!diff && m < ifc->nmacs)
            return 0;
    }
    return 1;
}

/* ---- Counters (XESP_XDP_FOREACH_COUNTER) ------------------------------------------------- */

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, XESP_CTR__COUNT);
    __type(key, __u32);
    __type(value, __u64);
} counters SEC(".maps") __weak;

static __always_inline void count(__u32 ctr)
{
    __u64 *v = bpf_map_lookup_elem(&counters, &ctr);
    if (v)
        *v += 1;
}
