/* The gateway's first stage: classifies every frame at the NIC.
 *
 *   ESP or ESP-in-UDP for one of our SAs ........ redirect to this queue's AF_XDP socket (decap)
 *   plaintext an out policy protects ............ redirect to this queue's AF_XDP socket (encap)
 *   plaintext an out/in/fwd policy blocks ........ drop
 *   plaintext on a public interface that an
 *   out policy would protect, or an in/fwd
 *   policy wants protected ...................... drop (only protected interfaces feed
 *                                                 the encryption; inbound should be ESP)
 *   ESP of an SA that is not inbound ............ drop (our own ESP reflected back)
 *   IKE, NAT keepalives, ESP of SPIs we do not
 *   own: to the gateway itself .................. pass to the kernel
 *   ... to anyone else .......................... the policies, as any plaintext
 *   ARP; ND with hop limit 255 to the link
 *   (ff02::/16, fe80::/10) or the gateway;
 *   traffic for the gateway, the unmatched ...... pass to the kernel
 *
 *   any of the redirects above, but unicast to
 *   another station's MAC than the interface
 *   takes (struct xesp_iface) ................... drop (the kernel would not route it)
 *
 * A redirect carries a struct xesp_meta in the metadata area (see xesp_xdp_abi.h). Its
 * fallback is XDP_DROP: a queue without a socket drops protected traffic instead of letting
 * the kernel forward it in the clear.
 *
 * Parsing (bpf/parsing.h) follows xdp-tools' parsing_helpers.h: a cursor, and parse_*
 * helpers that bounds-check and return the next protocol, or a verdict.
 *
 * What the gateway's own kernel sends is the tc egress program's (xesp_tc.bpf.c), linked
 * into the same BPF object and sharing the maps of shared_maps.h.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "bpf/parsing.h"
#include "bpf/shared_maps.h"
#include "bpf/spd_lookup.h"
#include "bpf/xesp_xdp_abi.h"

/* ---- Fixed knobs, set by the loader before load ---------------------------------------- */

const volatile __u32 default_role = XESP_ROLE_PROTECTED; /* interfaces not in `ifaces` */
const volatile __u32 fib_lookup_enabled = 1;             /* next hop for ENCAP metadata */
/* Set where the kernel has no bpf_xdp_adjust_meta for XDP programs: the metadata then goes in
 * front of the frame itself, as its first bytes, and the socket's reader skips them
 * (XskPortOptions::skip). The verifier sees only the branch taken. */
const volatile __u32 meta_in_frame = 0;

/* ---- Maps (and those the egress program uses too: shared_maps.h) ---------------------- */

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, XESP_MAX_XSKS);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 131072); /* the loader resizes it */
    __type(key, struct xesp_sa_key);
    __type(value, struct xesp_sa_val);
} sas SEC(".maps");

/* What a classify step decided: not its kind of packet, or a final verdict. */
enum step { STEP_CONTINUE = 0, STEP_DONE = 1 };

static __always_inline int pass(__u32 ctr)
{
    count(ctr);
    return XDP_PASS;
}

static __always_inline int drop(__u32 ctr)
{
    count(ctr);
    return XDP_DROP;
}

/* ---- Helpers --------------------------------------------------------------------------- */

static __always_inline __u32 mix(__u32 h, __u32 v)
{
    h ^= v;
    h *= 0x9e3779b1;
    return h ^ (h >> 15);
}

static __always_inline __u32 flow_hash_5tuple(const struct flow *f)
{
    __u32 h = f->family;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        h = mix(h, f->src[i]);
        h = mix(h, f->dst[i]);
    }
    return mix(h, f->proto | ((__u32)f->sport << 8 ^ (__u32)f->dport << 16));
}

/* Addressed to the gateway itself. */
static __always_inline int is_local(const struct flow *f)
{
    return is_local_addr(f->family, f->dst);
}

static __always_inline __u32 iface_role(__u32 ifindex)
{
    struct xesp_iface *ifc = bpf_map_lookup_elem(&ifaces, &ifindex);
    return ifc ? ifc->role : default_role;
}

/* Writes the metadata and redirects to this queue's socket. The fallback XDP_DROP keeps the
 * packet from the kernel when no socket is bound: fail closed. */
static __always_inline int redirect(struct xdp_md *ctx, struct xesp_meta *m, __u32 ctr)
{
    __u32 ifindex = ctx->ingress_ifindex, queue = ctx->rx_queue_index;
    struct xesp_iface *ifc = bpf_map_lookup_elem(&ifaces, &ifindex);
    if (other_host((const __u8 *)(long)ctx->data, (const void *)(long)ctx->data_end, ifc))
        return drop(XESP_CTR_DROP_OTHER_HOST);
    if (meta_in_frame) {
        /* A frame without its metadata in front would lose its first bytes to the reader:
         * dropped, never handed over. */
        if (bpf_xdp_adjust_head(ctx, -(int)sizeof(*m)) != 0)
            return drop(XESP_CTR_META_FAILED);
        struct xesp_meta *dst = (void *)(long)ctx->data;
        if ((void *)(dst + 1) > (void *)(long)ctx->data_end)
            return drop(XESP_CTR_META_FAILED);
        __builtin_memcpy(dst, m, sizeof(*m));
    } else if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*m)) == 0) {
        struct xesp_meta *dst = (void *)(long)ctx->data_meta;
        if ((void *)(dst + 1) <= (void *)(long)ctx->data)
            __builtin_memcpy(dst, m, sizeof(*m));
    } else {
        count(XESP_CTR_META_FAILED);
    }
    count(ctr);
    __u32 slot = (ifc ? ifc->xsk_base : 0) + queue;
    if (queue >= XESP_MAX_QUEUES)
        slot = XESP_MAX_XSKS; /* no such slot: dropped below */
    int rc = bpf_redirect_map(&xsks, slot, XDP_DROP);
    if (rc != XDP_REDIRECT)
        count(XESP_CTR_XSK_MISSING);
    return rc;
}

/* ---- ESP ------------------------------------------------------------------------------- */

/* ESP (natt = 0) or ESP-in-UDP (natt = 1) whose header starts at c->pos, `local` if it is
 * addressed to the gateway. ESP of an SA of ours is decrypted, or dropped; what is nobody's
 * is the kernel's business only when it is for the gateway itself (the kernel may have the SA):
 * anything else returns STEP_CONTINUE and is classified as plaintext, so that a protected host
 * cannot send through the gateway in the clear by dressing its traffic up as ESP. */
static __always_inline int classify_esp(struct xdp_md *ctx, struct cursor *c, void *data,
                                        struct flow *f, int natt, int local, int *verdict)
{
    __be32 *spi = c->pos;
    if ((void *)(spi + 1) > c->end) {
        if (!local)
            return STEP_CONTINUE;
        *verdict = pass(XESP_CTR_PASS_MALFORMED); /* not even an SPI: nobody's ESP */
        return STEP_DONE;
    }

    struct xesp_sa_key k = {.family = f->family, .spi = *spi};
#pragma unroll
    for (int i = 0; i < 4; i++)
        k.dst[i] = f->dst[i];
    struct xesp_sa_val *sa = bpf_map_lookup_elem(&sas, &k);
    if (!sa) {
        if (!local)
            return STEP_CONTINUE;
        *verdict = pass(XESP_CTR_PASS_ESP_UNKNOWN_SPI);
        return STEP_DONE;
    }

    /* Ours from here on: whatever is wrong with it, the kernel must not see it either. */
    *verdict = XDP_DROP;
    if (!(sa->flags & XESP_SA_F_DIR_IN) && !local) {
        count(XESP_CTR_DROP_ESP_REFLECTED); /* an outbound SA's: not to be opened */
        return STEP_DONE;
    }
    if (f->bad_length) {
        count(XESP_CTR_DROP_ESP_BAD_LENGTH);
        return STEP_DONE;
    }
    __u32 esp_off = c->pos - data;
    if (c->pos + ESP_HDR_LEN > c->end || esp_off + ESP_HDR_LEN > f->l3_off + f->ip_len) {
        count(XESP_CTR_DROP_ESP_TRUNCATED);
        return STEP_DONE;
    }
    if (!!(sa->flags & XESP_SA_F_NATT) != natt) {
        count(XESP_CTR_DROP_ENCAP_MISMATCH);
        return STEP_DONE;
    }
    /* ESP to a host behind us (transport mode), in a frame the kernel would not forward. */
    if (!local && unicast_in_group_frame((const __u8 *)(long)ctx->data,
                                         (const void *)(long)ctx->data_end, f)) {
        count(XESP_CTR_DROP_GROUP_MAC);
        return STEP_DONE;
    }

    struct xesp_meta m = {
        .magic = XESP_META_MAGIC,
        .kind = XESP_META_DECAP,
        .flags =
            (f->family == XESP_FAMILY_V6 ? XESP_META_F_IPV6 : 0) | (natt ? XESP_META_F_NATT : 0),
        .id = sa->sa_id,
        .l3_off = f->l3_off,
        .l4_off = esp_off,
        .ingress_ifindex = f->ingress_ifindex,
    };
    __u32 h = f->family;
#pragma unroll
    for (int i = 0; i < 4; i++)
        h = mix(h, f->dst[i]);
    m.flow_hash = mix(h, k.spi);
    *verdict = redirect(ctx, &m, XESP_CTR_REDIRECT_DECAP);
    return STEP_DONE;
}

/* UDP to port 4500 (RFC 3948 section 2): a 1-byte 0xff NAT keepalive, IKE behind the 4-byte
 * zero non-ESP marker, or ESP. Keepalives and IKE are the kernel's only when they are for the
 * gateway itself. Returns STEP_CONTINUE if it is none of these, or not ours to pass. */
static __always_inline int classify_udp_4500(struct xdp_md *ctx, struct cursor *c, void *data,
                                             struct flow *f, int local, int *verdict)
{
    struct udphdr *udp = c->pos;
    if ((void *)(udp + 1) > c->end)
        return STEP_CONTINUE;
    if (udp->dest != bpf_htons(NATT_PORT))
        return STEP_CONTINUE;
    c->pos = udp + 1;
    __u32 payload_off = c->pos - data;
    __u32 ip_end = f->l3_off + f->ip_len;
    __u32 payload = ip_end > payload_off ? ip_end - payload_off : 0;

    if (local) {
        __u8 *b = c->pos;
        if (!f->bad_length && payload == 1 && (void *)(b + 1) <= c->end && b[0] == 0xff) {
            *verdict = pass(XESP_CTR_PASS_KEEPALIVE);
            return STEP_DONE;
        }
        __u32 *marker = c->pos;
        if (!f->bad_length && payload >= 4 && (void *)(marker + 1) <= c->end && *marker == 0) {
            *verdict = pass(XESP_CTR_PASS_IKE);
            return STEP_DONE;
        }
        if (!f->bad_length && payload == 0) {
            *verdict = pass(XESP_CTR_PASS_MALFORMED);
            return STEP_DONE;
        }
    }
    return classify_esp(ctx, c, data, f, 1, local, verdict);
}

/* ---- Plaintext: the policies (spd_lookup.h) -------------------------------------------- */

/* Where the plaintext's route goes, for the encapsulating side. */
static __always_inline void fib_next_hop(struct xdp_md *ctx, const struct flow *f,
                                         struct xesp_meta *m)
{
    if (!fib_lookup_enabled)
        return;
    struct bpf_fib_lookup p;
    __builtin_memset(&p, 0, sizeof(p));
    p.family = f->family == XESP_FAMILY_V6 ? 10 /* AF_INET6 */ : 2 /* AF_INET */;
    p.l4_protocol = f->proto;
    p.sport = f->sport;
    p.dport = f->dport;
    p.tot_len = f->ip_len;
    p.ifindex = ctx->ingress_ifindex;
    if (f->family == XESP_FAMILY_V4) {
        p.tos = f->tos;
        p.ipv4_src = f->src[0];
        p.ipv4_dst = f->dst[0];
    } else {
        p.flowinfo = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            p.ipv6_src[i] = f->src[i];
            p.ipv6_dst[i] = f->dst[i];
        }
    }
    long rc = bpf_fib_lookup(ctx, &p, sizeof(p), 0);
    if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
        m->flags |= XESP_META_F_FIB_OK;
        __builtin_memcpy(m->fib_dmac, p.dmac, 6);
    } else if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
        m->flags |= XESP_META_F_FIB_NO_NEIGH;
    } else {
        return;
    }
    m->fib_ifindex = p.ifindex;
    m->fib_mtu = p.mtu_result;
}

/* An ICMP too-big about ESP on its way to a host behind us. In transport mode the SA's
 * addresses are the hosts', so routers report our packets' path MTU to the host, which has no
 * such SA: the gateway reads the report instead (and hands back what is not about its SAs). */
static __always_inline int redirect_report(struct xdp_md *ctx, const struct flow *f)
{
    struct xesp_meta m = {
        .magic = XESP_META_MAGIC,
        .kind = XESP_META_REPORT,
        .flags = f->family == XESP_FAMILY_V6 ? XESP_META_F_IPV6 : 0,
        .l3_off = f->l3_off,
        .l4_off = f->l4_off,
        .flow_hash = flow_hash_5tuple(f),
        .ingress_ifindex = f->ingress_ifindex,
    };
    return redirect(ctx, &m, XESP_CTR_REDIRECT_REPORT);
}

/* Plaintext that no out policy claimed, or that an out policy lets pass in the clear. On a
 * public interface, what the in policies (for the gateway itself) or the fwd policies (for
 * the hosts behind it) want protected should have come as ESP (RFC 4301 section 5.2), as the
 * kernel checks them: in for what is delivered here, fwd for what is forwarded, and before
 * any out policy. What may pass and is a report (a too-big for someone else) goes to the
 * gateway first. */
static __always_inline int check_unprotected(struct xdp_md *ctx, const struct flow *f, int unsure,
                                             int local, int report, __u32 pass_ctr)
{
    if (iface_role(f->ingress_ifindex) != XESP_ROLE_PUBLIC)
        return unsure ? drop(XESP_CTR_DROP_PORTS_UNKNOWN) : pass(pass_ctr);
    struct spd_match r;
    spd_init(&r);
    spd_lookup(f, local ? XESP_DIR_IN : XESP_DIR_FWD, &r);
    if (!local && is_group_dst(f)) /* delivered here too: the in policies have a say */
        spd_lookup(f, XESP_DIR_IN, &r);
    if (r.shadow_rank < r.rank)
        unsure = 1;
    if (r.found && r.action == XESP_ACTION_BLOCK)
        return drop(XESP_CTR_DROP_IN_BLOCK);
    if (r.found && (r.flags & XESP_POL_F_TMPL))
        return drop(XESP_CTR_DROP_IN_UNPROTECTED);
    if (unsure)
        return drop(XESP_CTR_DROP_PORTS_UNKNOWN);
    if (report &&
        unicast_in_group_frame((const __u8 *)(long)ctx->data, (const void *)(long)ctx->data_end, f))
        return drop(XESP_CTR_DROP_GROUP_MAC); /* a too-big the kernel would not forward */
    if (report)
        return redirect_report(ctx, f);
    return pass(r.found ? XESP_CTR_PASS_BYPASS : pass_ctr);
}

static __always_inline int classify_plain(struct xdp_md *ctx, struct flow *f, int local)
{
    int unsure = 0;
    if (!local) {
        struct spd_match r;
        spd_init(&r);
        spd_lookup(f, XESP_DIR_OUT, &r);
        unsure = r.shadow_rank < r.rank;
        if (r.found && (r.flags & XESP_POL_F_TMPL) && r.action == XESP_ACTION_ALLOW) {
            /* Only the protected side (and the local link) feeds the encryption: plaintext
             * for a protected flow that shows up on the public side was injected there. */
            if (iface_role(f->ingress_ifindex) == XESP_ROLE_PUBLIC)
                return drop(XESP_CTR_DROP_PUBLIC_PLAINTEXT);
            if (unicast_in_group_frame((const __u8 *)(long)ctx->data,
                                       (const void *)(long)ctx->data_end, f))
                return drop(XESP_CTR_DROP_GROUP_MAC);
            if (forward_martian(f, from_local_link(f->ingress_ifindex)))
                return drop(XESP_CTR_DROP_MARTIAN);
            struct xesp_meta m = {
                .magic = XESP_META_MAGIC,
                .kind = XESP_META_ENCAP,
                .flags = (f->family == XESP_FAMILY_V6 ? XESP_META_F_IPV6 : 0) |
                         (f->fragment ? XESP_META_F_FRAGMENT : 0),
                .id = r.policy_id,
                .l3_off = f->l3_off,
                .l4_off = f->l4_off,
                .flow_hash = flow_hash_5tuple(f),
                .ingress_ifindex = f->ingress_ifindex,
            };
            fib_next_hop(ctx, f, &m);
            return redirect(ctx, &m, XESP_CTR_REDIRECT_ENCAP);
        }
        if (unsure)
            return drop(XESP_CTR_DROP_PORTS_UNKNOWN);
        if (r.found && r.action == XESP_ACTION_BLOCK)
            return drop(XESP_CTR_DROP_OUT_BLOCK);
        if (r.found) /* a bypass: on a public interface, only once the fwd policies agree */
            return check_unprotected(ctx, f, 0, 0, 0, XESP_CTR_PASS_BYPASS);
    }
    return check_unprotected(ctx, f, unsure, local, f->too_big && !local,
                             local ? XESP_CTR_PASS_LOCAL : XESP_CTR_PASS_NO_POLICY);
}

/* ---- The program ----------------------------------------------------------------------- */

SEC("xdp")
int xesp_xdp(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    struct cursor c = {.pos = data, .end = (void *)(long)ctx->data_end};
    struct flow f;
    __builtin_memset(&f, 0, sizeof(f));
    f.ingress_ifindex = ctx->ingress_ifindex;

    count(XESP_CTR_RX);
    int rc = parse_ip(&c, data, &f);
    if (rc == PARSE_VLAN_DEPTH)
        return drop(XESP_CTR_DROP_VLAN_DEPTH);
    if (rc == PARSE_NON_IP)
        return pass(XESP_CTR_PASS_NON_IP);
    if (rc == PARSE_EXT_DEPTH)
        return drop(XESP_CTR_DROP_IPV6_EXT_DEPTH);
    if (rc < 0)
        return pass(XESP_CTR_PASS_MALFORMED);

    int local = is_local(&f);
    int verdict;
    if (f.proto == IPPROTO_ESP) {
        struct cursor ec = c;
        if (f.fragment) {
            if (local)
                return pass(XESP_CTR_PASS_ESP_FRAGMENT);
        } else if (classify_esp(ctx, &ec, data, &f, 0, local, &verdict) == STEP_DONE) {
            return verdict;
        }
    }
    if (f.proto == IPPROTO_UDP && !f.fragment) {
        struct cursor uc = c;
        if (classify_udp_4500(ctx, &uc, data, &f, local, &verdict) == STEP_DONE)
            return verdict;
    }
    if (f.bad_length)
        return pass(XESP_CTR_PASS_MALFORMED);

    /* Neighbour discovery as the kernel takes it, for the link or the gateway, passes before
     * any policy: an in policy that wants the gateway's plaintext protected must not cut it
     * off its link. Anything else of those ICMPv6 types (another hop limit, a routable
     * destination) is plaintext like the rest, lest it carry a protected flow past a policy. */
    if (is_nd(&c, &f) && (local || is_link_dst_v6(&f)))
        return pass(XESP_CTR_PASS_ND);
    parse_too_big(&c, &f);
    parse_ports(&c, &f);
    if (f.proto == IPPROTO_UDP && f.dport == bpf_htons(IKE_PORT) && local)
        return pass(XESP_CTR_PASS_IKE);
    return classify_plain(ctx, &f, local);
}

char LICENSE[] SEC("license") = "GPL";
