/* Counts and drops the bench packets (see gen_abi.h) arriving on an interface; everything else
 * goes on to the kernel untouched. Counting per CPU keeps the program free of atomics: the
 * reader sums the slots. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "tools/gen/gen_abi.h"

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct gen_count);
} counts SEC(".maps");

/* The UDP payload of a bench packet, or NULL. */
static __always_inline __be32 *bench_payload(void *data, void *end)
{
    struct ethhdr *eth = data;
    struct iphdr *ip = (void *)(eth + 1);
    struct udphdr *udp;
    __be32 *magic;

    if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
        return NULL;
    /* Options and fragments do not occur in what we send. */
    if (ip->ihl != 5 || ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(0x3fff)))
        return NULL;
    udp = (void *)(ip + 1);
    magic = (void *)(udp + 1);
    if ((void *)(magic + 1) > end || udp->dest != bpf_htons(GEN_UDP_PORT))
        return NULL;
    return magic;
}

SEC("xdp")
int gen_rx_count(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    __be32 *magic = bench_payload(data, end);
    struct gen_count *c;
    __u32 key = 0;

    if (!magic || *magic != bpf_htonl(GEN_MAGIC))
        return XDP_PASS;
    c = bpf_map_lookup_elem(&counts, &key);
    if (c) {
        c->packets++;
        c->bytes += end - data;
    }
    return XDP_DROP;
}

char LICENSE[] SEC("license") = "GPL";
