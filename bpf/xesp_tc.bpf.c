/* The gateway's egress guard: plaintext that the gateway's own kernel sends.
 *
 * The XDP program (xesp_xdp.bpf.c) sees what arrives. What the kernel itself sends out of a
 * public interface (a process on the gateway, a route from an interface xesp is not attached
 * to) leaves through the qdisc layer, where this program runs; AF_XDP transmissions bypass it.
 * Plaintext that an out policy blocks is dropped. Plaintext it protects cannot be encrypted
 * here: it is sent to the gateway's local link (local_link), a veth whose far end is one of
 * the gateway's protected interfaces, and is dropped if there is none; it never leaves in the
 * clear. IP whose headers it cannot read is dropped too (drop-unreadable): what it cannot check
 * does not leave. Like the XDP program, this stays attached after a crash.
 *
 * This file is compiled on its own and linked with xesp_xdp.bpf.c into one BPF object (see
 * shared_maps.h): the policies, local addresses and counters it reads are the very maps the
 * XDP program uses and the loader fills.
 */
#include <linux/bpf.h>
#include <linux/errno.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "bpf/parsing.h"
#include "bpf/shared_maps.h"
#include "bpf/sock_bypass.h"
#include "bpf/spd_lookup.h"
#include "bpf/xesp_xdp_abi.h"

/* ---- Maps (and those the XDP program uses too: shared_maps.h) ------------------------- */

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16);
    __type(key, __u64); /* socket cookie */
    __type(value, __u32);
} own_sockets SEC(".maps"); /* the daemon's sockets that send ESP */

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32); /* ifindex; 0: none */
} tun_link SEC(".maps");  /* the gateway's TUN device, for protected interfaces in tun mode */

/* Sent by the gateway itself, from one of its addresses (a broadcast address is none). */
static __always_inline int is_local_src(const struct flow *f)
{
    return local_addr_kind(f->family, f->src) == XESP_LOCAL_OWN;
}

/* Sent by a socket that the out policies do not apply to: one whose own out policy is a bypass
 * of the packet's family, as a sweep saw it less than XESP_SOCK_MARK_TTL_NS ago
 * (sock_bypass.h); or, for what has the shape of IKE or NAT-T, one of the daemon's own
 * sockets (they send ESP in UDP; all else they send, decrypted packets among it, meets the
 * policies). */
static __always_inline int sent_past_policies(struct __sk_buff *skb, const struct flow *f)
{
    __u64 cookie = bpf_get_socket_cookie(skb);
    if (!cookie)
        return 0; /* forwarded */
    if (f->proto == IPPROTO_UDP && !f->fragment &&
        (f->sport == bpf_htons(NATT_PORT) || f->dport == bpf_htons(NATT_PORT) ||
         f->sport == bpf_htons(IKE_PORT) || f->dport == bpf_htons(IKE_PORT)) &&
        bpf_map_lookup_elem(&own_sockets, &cookie))
        return 1;
    struct bpf_sock *sk = skb->sk;
    if (!sk)
        return 0;
    sk = bpf_sk_fullsock(sk);
    if (!sk)
        return 0;
    struct xesp_sock_mark *m = bpf_sk_storage_get(&sock_bypass, sk, 0, 0);
    if (!m || m->family != (f->family == XESP_FAMILY_V6 ? XESP_AF_INET6 : XESP_AF_INET))
        return 0;
    return bpf_ktime_get_ns() - m->seen_ns < XESP_SOCK_MARK_TTL_NS;
}

/* The headers of skb, pulled into its linear part (256 bytes at most), parsed into f; c is
 * left after the IP headers. Returns parse_ip()'s result. */
static __always_inline int tc_parse(struct __sk_buff *skb, struct cursor *c, struct flow *f)
{
    bpf_skb_pull_data(skb, skb->len < 256 ? skb->len : 256);
    void *data = (void *)(long)skb->data;
    c->pos = data;
    c->end = (void *)(long)skb->data_end;
    __builtin_memset(f, 0, sizeof(*f));
    return parse_ip(c, data, f);
}

/* Whether the device's MTU takes skb: the frame, or each piece the kernel cuts a GSO packet
 * into before the device (the local link has no GSO: its far end runs XDP), tunnel headers
 * and all. What it would not take, the veth would drop. */
static __always_inline int fits_mtu(struct __sk_buff *skb, __u32 ifindex)
{
    __u32 mtu = 0;
    return bpf_check_mtu(skb, ifindex, &mtu, 0, BPF_MTU_CHK_SEGS) == BPF_MTU_CHK_RET_SUCCESS;
}

/* Whether a device has the index: a TUN deleted by hand leaves its index in tun_link, and a
 * redirect there would be dropped without a word (a daemon that dies leaves the TUN in place,
 * persistent: the kernel drops and counts there). bpf_check_mtu() looks the index up (its
 * size verdict is of no interest here). */
static __always_inline int dev_exists(struct __sk_buff *skb, __u32 ifindex)
{
    __u32 mtu = 0;
    return bpf_check_mtu(skb, ifindex, &mtu, 0, 0) != -ENODEV;
}

/* The hop that the kernel's forwarding would take: the TTL or hop limit down by one, and the
 * IPv4 header checksum with it. 0 if it is 1 or less (the gateway answers "time exceeded"
 * for those that come through the TUN) or cannot be written: nothing changed. */
static __always_inline int take_hop(struct __sk_buff *skb, const struct flow *f)
{
    const int v6 = f->family == XESP_FAMILY_V6;
    __u32 off = f->l3_off + (v6 ? 7 : 8);
    __u8 ttl, next;
    if (bpf_skb_load_bytes(skb, off, &ttl, 1) || ttl <= 1)
        return 0;
    next = ttl - 1;
    if (bpf_skb_store_bytes(skb, off, &next, 1, 0))
        return 0;
    /* The TTL is the high byte of its 16-bit word of the IPv4 header. */
    if (!v6 && bpf_l3_csum_replace(skb, f->l3_off + 10, bpf_htons((__u16)ttl << 8),
                                   bpf_htons((__u16)next << 8), 2)) {
        bpf_skb_store_bytes(skb, off, &ttl, 1, 0);
        return 0;
    }
    return 1;
}

/* ---- The program ----------------------------------------------------------------------- */

SEC("tc")
int xesp_tc_egress(struct __sk_buff *skb)
{
    struct cursor c;
    struct flow f;
    int rc = tc_parse(skb, &c, &f);
    if (rc == PARSE_VLAN_DEPTH || rc == PARSE_EXT_DEPTH) {
        count(XESP_CTR_DROP_EGRESS_PLAINTEXT); /* cannot tell: fail closed */
        return TC_ACT_SHOT;
    }
    if (rc == PARSE_NON_IP)
        return TC_ACT_OK; /* ARP and the like: no policy is about them */
    /* IP headers it cannot read (or a frame too short to say whether it is IP) cannot be
     * checked against the policies: dropped, never sent unchecked. */
    if (rc < 0) {
        count(XESP_CTR_DROP_UNREADABLE);
        return TC_ACT_SHOT;
    }
    parse_ports(&c, &f);
    /* ESP leaves as it is when the gateway makes it: on this host (a socket, so not
     * forwarded, whatever its source address says) and from one of its addresses, or from the
     * daemon's own sockets (transport-mode ESP carries the hosts' addresses). This is wider
     * than the kernel, which lets its own xfrm output by but puts a raw socket's ESP through
     * the policies; sending raw ESP takes CAP_NET_RAW, which can send past tc anyway. Anything
     * else of that shape, forwarded from a protected host, is plaintext like the rest. */
    if (f.proto == IPPROTO_ESP) {
        __u64 cookie = bpf_get_socket_cookie(skb);
        if (cookie && (is_local_src(&f) || bpf_map_lookup_elem(&own_sockets, &cookie))) {
            count(XESP_CTR_PASS_EGRESS_OWN);
            return TC_ACT_OK;
        }
    }

    struct spd_match r;
    spd_init(&r);
    spd_lookup(&f, XESP_DIR_OUT, &r);
    const int blocked = r.shadow_rank < r.rank || (r.found && r.action == XESP_ACTION_BLOCK);
    /* IKE, NAT-T keepalives and the rest of what a socket with its own bypass policy sends
     * leave in the clear, as the kernel lets them: that socket's policy, not the SPD, decides
     * for it. Only those sockets (an IKE daemon's) and the daemon's own get this; a process
     * that merely sends to UDP/500 or 4500 meets the out policies. */
    if ((blocked || (r.found && (r.flags & XESP_POL_F_TMPL))) && sent_past_policies(skb, &f)) {
        count(XESP_CTR_PASS_EGRESS_OWN);
        return TC_ACT_OK;
    }
    if (blocked) {
        count(XESP_CTR_DROP_EGRESS_PLAINTEXT);
        return TC_ACT_SHOT;
    }
    if (r.found && (r.flags & XESP_POL_F_TMPL)) {
        /* Protected: through the gateway's local link, whose far end runs the XDP program as
         * a protected interface and hands it to the gateway to encrypt. Without that link
         * (no gateway running) it is dropped, never sent in the clear. */
        __u32 zero = 0;
        __u32 *link = bpf_map_lookup_elem(&local_link, &zero);
        if (link && *link) {
            count(XESP_CTR_EGRESS_LOCAL);
            return bpf_redirect(*link, 0);
        }
        count(XESP_CTR_DROP_EGRESS_PLAINTEXT);
        return TC_ACT_SHOT;
    }
    return TC_ACT_OK;
}

/* A protected interface in tun mode: what arrives there that an out policy protects is sent to
 * the gateway's TUN device whole, as the host's TSO made it (an XDP program would have the
 * kernel cut it first), for the gateway to cut, encrypt and send; UDP goes to the local link
 * instead (below). Without a TUN (no gateway running, or a killed one's index left behind) it
 * is dropped and counted, never routed on in the clear; without a socket behind the local
 * link, its XDP program drops it. What it would send to either but is unicast to another
 * station's MAC (struct xesp_iface) is dropped too. Blocked plaintext is dropped; the rest
 * (bypass, no policy, the gateway's own traffic, ND for the link, what is not IP) goes on to
 * the kernel. */
SEC("tc")
int xesp_tc_protected(struct __sk_buff *skb)
{
    struct cursor c;
    struct flow f;
    int rc = tc_parse(skb, &c, &f);
    if (rc == PARSE_VLAN_DEPTH) {
        count(XESP_CTR_DROP_VLAN_DEPTH);
        return TC_ACT_SHOT;
    }
    if (rc == PARSE_EXT_DEPTH) {
        count(XESP_CTR_DROP_IPV6_EXT_DEPTH);
        return TC_ACT_SHOT;
    }
    if (rc == PARSE_NON_IP) {
        count(XESP_CTR_PASS_NON_IP);
        return TC_ACT_OK;
    }
    /* Headers it cannot read in the linear part cannot be checked against the policies:
     * dropped, never passed on. (The payload may lie beyond the linear part, in a GSO packet's
     * fragments: an IP length beyond data_end is no fault here; the kernel checks it.) */
    if (rc < 0) {
        count(XESP_CTR_DROP_UNREADABLE);
        return TC_ACT_SHOT;
    }
    if (is_local_addr(f.family, f.dst)) {
        count(XESP_CTR_PASS_LOCAL);
        return TC_ACT_OK;
    }
    /* Neighbour discovery for the link (that to the gateway passed above); anything else of
     * those ICMPv6 types goes through the policies (see the XDP program). */
    if (is_nd(&c, &f) && is_link_dst_v6(&f)) {
        count(XESP_CTR_PASS_ND);
        return TC_ACT_OK;
    }
    parse_ports(&c, &f);
    struct spd_match r;
    spd_init(&r);
    spd_lookup(&f, XESP_DIR_OUT, &r);
    if (r.found && (r.flags & XESP_POL_F_TMPL) && r.action == XESP_ACTION_ALLOW) {
        __u32 zero = 0, ifindex = skb->ifindex;
        if (other_host((const __u8 *)(long)skb->data, (const void *)(long)skb->data_end,
                       bpf_map_lookup_elem(&ifaces, &ifindex))) {
            count(XESP_CTR_DROP_OTHER_HOST); /* the interface's MACs: see struct xesp_iface */
            return TC_ACT_SHOT;
        }
        if (unicast_in_group_frame((const __u8 *)(long)skb->data, (const void *)(long)skb->data_end,
                                   &f)) {
            count(XESP_CTR_DROP_GROUP_MAC);
            return TC_ACT_SHOT;
        }
        if (forward_martian(&f, 0)) {
            count(XESP_CTR_DROP_MARTIAN);
            return TC_ACT_SHOT;
        }
        /* UDP goes as in xdp mode: through the local link's XDP program to an AF_XDP
         * socket, a burst per wakeup, where the TUN costs a read per datagram (most UDP
         * senders make no GSO packets; those that do are cut by the kernel on the way). It
         * takes its hop here, as the kernel would have; with TTL 1 it goes to the TUN, whose
         * reader answers it. TCP and the rest keep the TUN, and so does UDP too big for the
         * link (frames beyond its 1,500 bytes of IP): within a flow of one size there is one
         * path, and no reordering. */
        if (f.proto == IPPROTO_UDP) {
            __u32 *link = bpf_map_lookup_elem(&local_link, &zero);
            if (link && *link && fits_mtu(skb, *link) && take_hop(skb, &f)) {
                count(XESP_CTR_TUN_UDP_LINK);
                return bpf_redirect(*link, 0);
            }
        }
        __u32 *tun = bpf_map_lookup_elem(&tun_link, &zero);
        if (tun && *tun && dev_exists(skb, *tun)) {
            count(XESP_CTR_TUN_ENCAP);
            return bpf_redirect(*tun, 0);
        }
        count(XESP_CTR_DROP_TUN_GONE);
        return TC_ACT_SHOT;
    }
    if (r.shadow_rank < r.rank) {
        count(XESP_CTR_DROP_PORTS_UNKNOWN);
        return TC_ACT_SHOT;
    }
    if (r.found && r.action == XESP_ACTION_BLOCK) {
        count(XESP_CTR_DROP_OUT_BLOCK);
        return TC_ACT_SHOT;
    }
    count(r.found ? XESP_CTR_PASS_BYPASS : XESP_CTR_PASS_NO_POLICY);
    return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
