/* Shared by gen_rx.bpf.c and xesp-gen: what a bench packet looks like and what the counter
 * program counts. Plain fixed-width fields only; the C++ side pins the sizes.
 *
 * A bench packet is Ethernet / IPv4 / UDP to port GEN_UDP_PORT whose payload starts with
 * GEN_MAGIC (network byte order). The port alone could match someone else's traffic; the
 * magic makes a false count unlikely.
 */
#ifndef XESP_GEN_ABI_H
#define XESP_GEN_ABI_H

#include <linux/types.h>

#define GEN_UDP_PORT 7009       /* destination port of every bench packet */
#define GEN_SRC_PORT_BASE 20000 /* flow k has source port GEN_SRC_PORT_BASE + k */
#define GEN_MAGIC 0x78657370U   /* "xesp" */

/* One per-CPU slot (index 0) of the counter map. */
struct gen_count {
    __u64 packets;
    __u64 bytes; /* frame bytes as received, without FCS */
};

#endif /* XESP_GEN_ABI_H */
