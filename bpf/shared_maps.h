/* The maps that both programs of the classifier's BPF object use: the XDP classifier
 * (xesp_xdp.bpf.c) and the tc programs (xesp_tc.bpf.c). Each .bpf.c is compiled on its
 * own and the objects are linked into one (`bpftool gen object`, libbpf's static linker; see
 * cmake/BpfSkeleton.cmake). The maps here are __weak: every file that includes this header
 * defines them, and the link keeps one of each, which both programs then share (one map,
 * not a copy, in the skeleton). A map only one program uses is defined in that program's file.
 */
#pragma once

#include <linux/bpf.h>

#include <bpf/bpf_helpers.h>

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
