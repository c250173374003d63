/* sock_bypass: the host's sockets whose own out policy is a bypass (see xesp_sockpol.bpf.c,
 * which keeps it). The tc egress guard (xesp_tc.bpf.c) reads it; each of the two BPF objects
 * defines the map, and the loader gives the second the first's (bpf_map__reuse_fd).
 */
#pragma once

#include <linux/bpf.h>

#include <bpf/bpf_helpers.h>

#include "bpf/xesp_xdp_abi.h"

#define XESP_AF_INET 2   /* AF_INET, as struct xesp_sock_mark carries it */
#define XESP_AF_INET6 10 /* AF_INET6 */

struct {
    __uint(type, BPF_MAP_TYPE_SK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct xesp_sock_mark);
} sock_bypass SEC(".maps");
