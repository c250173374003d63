/* Which of the host's sockets have a bypass policy of their own, for the tc egress guard.
 *
 * The kernel's xfrm lets a socket carry its own policies (IP_XFRM_POLICY, IPV6_XFRM_POLICY;
 * CAP_NET_ADMIN). An IKE daemon gives its IKE sockets one that allows everything, so that
 * IKE and NAT-T keepalives leave in the clear whatever the out policies say; no other socket
 * escapes them. The egress guard (xesp_tc.bpf.c) makes the same exception, and needs to know
 * those sockets: what a socket sends carries it (skb->sk), and sock_bypass, socket-local
 * storage, marks the ones whose out policy is such a bypass.
 *
 * sweep_udp_sockets, an iterator over the UDP sockets of the gateway's network namespace,
 * sets and clears the marks from each socket's policy as the kernel holds it; the gateway runs
 * it at start and then five times a second on a thread of its own
 * (XdpProgram::sweep_socket_policies_every()). A mark carries the policy's family (the kernel
 * applies a socket's policy only to packets of that family) and the time of the sweep that set
 * it, and lapses after XESP_SOCK_MARK_TTL_NS: when the sweeps stop (no daemon), what those
 * sockets send meets the out policies again. What the kernel refused (a setsockopt without
 * CAP_NET_ADMIN) is never seen. A socket that has just been given its bypass meets the out
 * policies until the next sweep (fail closed: IKE retransmits); one whose bypass was just taken
 * away keeps it as long. The iterator sees only sockets in the kernel's UDP table (bound, or
 * connected), as IKE sockets are. Raw sockets have no iterator: what they send always meets the
 * out policies. (An fexit on xfrm_sk_policy_insert() would mark at once; but kernels and
 * sandboxes that forbid tracing programs would then lose the exception altogether.)
 *
 * The kernel's own structures are read with CO-RE (the ___xesp types below carry only the
 * fields used; libbpf finds them in the running kernel's BTF). This object is loaded on its
 * own, its sock_bypass being the classifier's (bpf_map__reuse_fd): a kernel that cannot load
 * it still runs the classifier, without the exception.
 */
#include <linux/bpf.h>
#include <linux/xfrm.h>

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "bpf/sock_bypass.h"

struct xfrm_mark___xesp {
    __u32 v;
    __u32 m;
} __attribute__((preserve_access_index));

struct xfrm_policy___xesp {
    __u16 family;
    __u32 if_id;
    struct xfrm_mark___xesp mark;
    struct xfrm_selector selector;
    __u8 action;
    __u8 xfrm_nr;
    void *security;
} __attribute__((preserve_access_index));

struct sock___xesp {
    struct xfrm_policy___xesp *sk_policy[2];
} __attribute__((preserve_access_index));

/* As the kernel lays it out: the iterator's context is read at fixed offsets. */
struct bpf_iter__udp___xesp {
    void *meta;
    struct sock___xesp *udp_sk; /* a udp_sock, whose first member is its sock */
};

/* The policy lets everything of its family through: an allow policy with no template,
 * whose selector, mark and interface id match any packet of the socket. One that matches less
 * (a narrower selector, a mark) would in the kernel leave the rest to the SPD; such a socket
 * is not marked, and all it sends meets the out policies, a stricter rule than the kernel's.
 * Returns the family (AF_INET, AF_INET6: the kernel applies the policy only to packets of its
 * own family), or 0. */
static __always_inline __u32 bypass_family(const struct xfrm_policy___xesp *pol)
{
    if (!pol)
        return 0;
    const struct xfrm_selector *s = &pol->selector;
    if (BPF_CORE_READ(pol, action) != XFRM_POLICY_ALLOW || BPF_CORE_READ(pol, xfrm_nr) != 0 ||
        BPF_CORE_READ(pol, if_id) != 0 || BPF_CORE_READ(pol, mark.m) != 0 ||
        BPF_CORE_READ(pol, security) != NULL || BPF_CORE_READ(s, prefixlen_d) != 0 ||
        BPF_CORE_READ(s, prefixlen_s) != 0 || BPF_CORE_READ(s, proto) != 0 ||
        BPF_CORE_READ(s, dport_mask) != 0 || BPF_CORE_READ(s, sport_mask) != 0 ||
        BPF_CORE_READ(s, ifindex) != 0)
        return 0;
    return BPF_CORE_READ(pol, family);
}

/* The mark follows the socket's out policy: set (and its time renewed) for a bypass, cleared
 * for anything else. */
static __always_inline void mark(void *sk, const struct xfrm_policy___xesp *pol)
{
    __u32 family = bypass_family(pol);
    struct xesp_sock_mark *m =
        bpf_sk_storage_get(&sock_bypass, sk, 0, family ? BPF_SK_STORAGE_GET_F_CREATE : 0);
    if (!m)
        return;
    m->family = family;
    m->seen_ns = bpf_ktime_get_ns();
}

SEC("iter/udp")
int sweep_udp_sockets(struct bpf_iter__udp___xesp *ctx)
{
    struct sock___xesp *sk = ctx->udp_sk;
    if (!sk)
        return 0;
    mark(sk, BPF_CORE_READ(sk, sk_policy[XFRM_POLICY_OUT]));
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
