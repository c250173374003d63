/* Shared by xsk_redirect.bpf.c and test_xsk_port.cpp: the test frames' EtherType, the XSKMAP
 * size and the metadata the program puts in front of each frame it redirects. */
#ifndef XESP_XSK_TEST_ABI_H
#define XESP_XSK_TEST_ABI_H

#include <linux/types.h>

#define XSK_TEST_ETHERTYPE 0x88b5 /* IEEE 802 local experimental */
#define XSK_TEST_MAX_QUEUES 4
#define XSK_TEST_META_MAGIC 0x7e57a11cU

struct xsk_test_meta {
    __u32 magic;    /* XSK_TEST_META_MAGIC */
    __u32 rx_queue; /* ctx->rx_queue_index */
};

#endif /* XESP_XSK_TEST_ABI_H */
