/* Test frames (XSK_TEST_ETHERTYPE) to the AF_XDP socket of their RX queue, with metadata;
 * everything else to the kernel. A queue without a socket drops its test frames. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "tests/af_xdp/xsk_test_abi.h"

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, XSK_TEST_MAX_QUEUES);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

/* Set where the kernel refuses bpf_xdp_adjust_meta to XDP programs: the metadata is then the
 * frame's first bytes, which the sockets skip (XskPortOptions::skip). */
const volatile __u32 meta_in_frame = 0;

SEC("xdp")
int xsk_redirect(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    __u32 queue = ctx->rx_queue_index;

    if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(XSK_TEST_ETHERTYPE))
        return XDP_PASS;
    if (meta_in_frame) {
        if (bpf_xdp_adjust_head(ctx, -(int)sizeof(struct xsk_test_meta)) != 0)
            return XDP_DROP;
        struct xsk_test_meta *m = (void *)(long)ctx->data;
        if ((void *)(m + 1) > (void *)(long)ctx->data_end)
            return XDP_DROP;
        m->magic = XSK_TEST_META_MAGIC;
        m->rx_queue = queue;
    } else if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct xsk_test_meta)) == 0) {
        struct xsk_test_meta *m = (void *)(long)ctx->data_meta;
        if ((void *)(m + 1) <= (void *)(long)ctx->data) {
            m->magic = XSK_TEST_META_MAGIC;
            m->rx_queue = queue;
        }
    }
    return bpf_redirect_map(&xsks, queue, XDP_DROP);
}

char LICENSE[] SEC("license") = "GPL";
