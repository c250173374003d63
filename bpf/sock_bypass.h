/* sock_bypass: the host's sockets whose own out policy is a bypass (see xesp_sockpol.bpf.c,
 * which keeps it). The tc egress guard (xesp_tc.bpf.c) reads it; each of the two BPF objects
 * defines the map, and the loader gives the second the first's (bpf_map__reuse_fd).
 */
#pragma once

#include <linux/bpf.h>

#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_SK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, __u32); /* 1: the socket's out policy allows everything */
} sock_bypass SEC(".maps");
