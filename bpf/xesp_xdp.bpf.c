/* The gateway's first stage: classifies every frame at the NIC.
 *
 *   ESP or ESP-in-UDP for one of our SAs ........ redirect to this queue's AF_XDP socket (decap)
 *   plaintext an out policy protects ............ redirect to this queue's AF_XDP socket (encap)
 *   plaintext an out/in/fwd policy blocks ........ drop
 *   plaintext on a public interface that an
 *   in/fwd policy wants protected ............... drop (it should have come as ESP)
 *   IKE, NAT keepalives, ARP/ND, foreign ESP,
 *   traffic for the gateway, the unmatched ...... pass to the kernel
 *
 * A redirect carries a struct xesp_meta in the metadata area (see xesp_xdp_abi.h). Its
 * fallback is XDP_DROP: a queue without a socket drops protected traffic instead of letting
 * the kernel forward it in the clear.
 *
 * Parsing follows xdp-tools' parsing_helpers.h: a cursor, and parse_* helpers that
 * bounds-check and return the next protocol, or a verdict.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>

#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "bpf/xesp_xdp_abi.h"

/* ---- Fixed knobs, set by the loader before load ---------------------------------------- */

const volatile __u32 default_role = XESP_ROLE_PROTECTED;   /* interfaces not in `ifaces` */
const volatile __u32 fib_lookup_enabled = 1;               /* next hop for ENCAP metadata */

/* ---- Maps ------------------------------------------------------------------------------ */

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, XESP_MAX_XSKS);
    __type(key, __u32);
    __type(value, __u32);
} xsks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 131072);                /* the loader resizes it */
    __type(key, struct xesp_sa_key);
    __type(value, struct xesp_sa_val);
} sas SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 262144);                /* the loader resizes it */
    __type(key, struct xesp_policy_key);
    __type(value, struct xesp_policy_val);
} policies SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, struct xesp_tuple_table);
} tuple_tables SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);                       /* index of the live tuple table */
} tuple_ctl SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, __u32);                         /* ifindex */
    __type(value, struct xesp_iface);
} ifaces SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 256);
    __type(key, struct xesp_addr_key);
    __type(value, __u32);
} local_addrs SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32);                       /* ifindex; 0: none */
} local_link SEC(".maps");                      /* where tc egress sends the gateway's own */

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, XESP_CTR__COUNT);
    __type(key, __u32);
    __type(value, __u64);
} counters SEC(".maps");

/* ---- Protocol constants ---------------------------------------------------------------- */

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88a8
#define MAX_VLAN_TAGS 2
#define MAX_IPV6_EXT 6              /* hop-by-hop, routing, destination options before ESP */
#define IP_FRAG_MASK 0x3fff         /* MF | fragment offset */
#define NATT_PORT 4500              /* RFC 3948 */
#define IKE_PORT 500
#define ESP_HDR_LEN 8               /* SPI + sequence number */
#define IPPROTO_SCTP_ 132
#define IPPROTO_UDPLITE_ 136
#define NEXTHDR_HOP_ 0
#define NEXTHDR_ROUTING_ 43
#define NEXTHDR_FRAGMENT_ 44
#define NEXTHDR_ICMP_ 58
#define NEXTHDR_DEST_ 60

/* What a classify step decided: not its kind of packet, or a final verdict. */
enum step { STEP_CONTINUE = 0, STEP_DONE = 1 };

struct cursor {
    void *pos;
    void *end;
};

struct vlan_hdr_ {
    __be16 tci;
    __be16 proto;
};

struct ipv6_ext_ {
    __u8 nexthdr;
    __u8 hdrlen;                    /* 8-byte units, not counting the first 8 */
};

struct frag_hdr_ {
    __u8 nexthdr;
    __u8 reserved;
    __be16 frag_off;
    __be32 id;
};

/* The packet as the classifier sees it. */
struct flow {
    __be32 src[4];
    __be32 dst[4];
    __u8 family;
    __u8 proto;                     /* transport protocol after extension headers */
    __u8 fragment;                  /* no ports: a fragment or a cut-short transport header */
    __u8 bad_length;                /* the IP header's length does not fit the frame */
    __be16 sport, dport;
    __u16 l3_off, l4_off;
    __u32 ip_len;                   /* the IP datagram's length per its header */
    __u32 ingress_ifindex;
    __u8 tos;
};

/* What the policy walk found. */
struct spd_match {
    __u64 rank;                     /* of the best exact match; ~0 if none */
    __u64 shadow_rank;              /* of the best portless shadow (fragments only) */
    __u32 policy_id;
    __u8 found;
    __u8 action;
    __u8 flags;
};

static __always_inline void count(__u32 ctr)
{
    __u64 *v = bpf_map_lookup_elem(&counters, &ctr);
    if (v)
        *v += 1;
}

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

/* ---- Parsing --------------------------------------------------------------------------- */

/* Ethernet and up to two VLAN tags (802.1Q, 802.1ad). Returns the ethertype, host order,
 * or -1 if the frame is too short, -2 if it has more tags than we look through. */
static __always_inline int parse_eth(struct cursor *c)
{
    struct ethhdr *eth = c->pos;
    if ((void *)(eth + 1) > c->end)
        return -1;
    c->pos = eth + 1;
    __u16 proto = bpf_ntohs(eth->h_proto);

#pragma unroll
    for (int i = 0; i < MAX_VLAN_TAGS; i++) {
        if (proto != ETH_P_8021Q_ && proto != ETH_P_8021AD_)
            return proto;
        struct vlan_hdr_ *vh = c->pos;
        if ((void *)(vh + 1) > c->end)
            return -1;
        c->pos = vh + 1;
        proto = bpf_ntohs(vh->proto);
    }
    if (proto == ETH_P_8021Q_ || proto == ETH_P_8021AD_)
        return -2;
    return proto;
}

/* IPv4 with options. Returns 0, or -1 if the header is malformed. A total length that does
 * not fit the frame is noted in f->bad_length: fatal only if the packet turns out to be ESP
 * for one of our SAs (dropped) or plaintext (passed to the kernel, which drops it). */
static __always_inline int parse_ipv4(struct cursor *c, void *data, struct flow *f)
{
    struct iphdr *ip = c->pos;
    if ((void *)(ip + 1) > c->end)
        return -1;
    __u32 hlen = ip->ihl * 4;
    if (hlen < sizeof(*ip))
        return -1;
    if (c->pos + hlen > c->end)
        return -1;
    f->family = XESP_FAMILY_V4;
    f->src[0] = ip->saddr;
    f->dst[0] = ip->daddr;
    f->proto = ip->protocol;
    f->tos = ip->tos;
    f->fragment = (bpf_ntohs(ip->frag_off) & IP_FRAG_MASK) != 0;
    f->ip_len = bpf_ntohs(ip->tot_len);
    if (f->ip_len < hlen || c->pos + f->ip_len > c->end)
        f->bad_length = 1;
    c->pos += hlen;
    f->l4_off = c->pos - data;
    return 0;
}

/* IPv6 and the extension headers in front of the transport header: hop-by-hop, routing,
 * destination options, and a fragment header (after which we stop, as the kernel's xfrm
 * does). Returns 0, -1 if malformed, -2 if the chain is longer than we follow. */
static __always_inline int parse_ipv6(struct cursor *c, void *data, struct flow *f)
{
    struct ipv6hdr *ip6 = c->pos;
    if ((void *)(ip6 + 1) > c->end)
        return -1;
    f->family = XESP_FAMILY_V6;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f->src[i] = ip6->saddr.in6_u.u6_addr32[i];
        f->dst[i] = ip6->daddr.in6_u.u6_addr32[i];
    }
    f->tos = (bpf_ntohs(*(__be16 *)ip6) >> 4) & 0xff;
    f->ip_len = sizeof(*ip6) + bpf_ntohs(ip6->payload_len);
    if (c->pos + f->ip_len > c->end)
        f->bad_length = 1;
    __u8 nh = ip6->nexthdr;
    c->pos = ip6 + 1;

    for (int i = 0; i < MAX_IPV6_EXT; i++) {
        if (nh != NEXTHDR_HOP_ && nh != NEXTHDR_ROUTING_ && nh != NEXTHDR_DEST_)
            break;
        struct ipv6_ext_ *ext = c->pos;
        if ((void *)(ext + 1) > c->end)
            return -1;
        __u32 len = ((__u32)ext->hdrlen + 1) * 8;
        if (c->pos + len > c->end)
            return -1;
        nh = ext->nexthdr;
        c->pos += len;
    }
    if (nh == NEXTHDR_HOP_ || nh == NEXTHDR_ROUTING_ || nh == NEXTHDR_DEST_)
        return -2;
    if (nh == NEXTHDR_FRAGMENT_) {
        struct frag_hdr_ *fh = c->pos;
        if ((void *)(fh + 1) > c->end)
            return -1;
        f->fragment = 1;
        nh = fh->nexthdr;
        c->pos = fh + 1;
    }
    f->proto = nh;
    f->l4_off = c->pos - data;
    if (f->l4_off > f->l3_off + f->ip_len)
        return -1;
    return 0;
}

/* Source and destination ports of the protocols that have them; a transport header too short
 * to hold them makes the packet portless, as a fragment. */
enum parse_result {
    PARSE_OK = 0,
    PARSE_MALFORMED = -1,
    PARSE_VLAN_DEPTH = -2,          /* more VLAN tags than we look through */
    PARSE_NON_IP = -3,
    PARSE_EXT_DEPTH = -4,           /* more IPv6 extension headers than we follow */
};

/* Ethernet, VLAN tags and the IP header (with IPv4 options / IPv6 extension headers), into f;
 * c ends at the transport header. */
static __always_inline int parse_ip(struct cursor *c, void *data, struct flow *f)
{
    int proto = parse_eth(c);
    if (proto == -2)
        return PARSE_VLAN_DEPTH;
    if (proto < 0)
        return PARSE_MALFORMED;
    f->l3_off = c->pos - data;
    int rc;
    if (proto == ETH_P_IP)
        rc = parse_ipv4(c, data, f);
    else if (proto == ETH_P_IPV6)
        rc = parse_ipv6(c, data, f);
    else
        return PARSE_NON_IP;
    if (rc == -2)
        return PARSE_EXT_DEPTH;
    return rc < 0 ? PARSE_MALFORMED : PARSE_OK;
}

static __always_inline void parse_ports(struct cursor *c, struct flow *f)
{
    if (f->fragment)
        return;
    if (f->proto != IPPROTO_TCP && f->proto != IPPROTO_UDP && f->proto != IPPROTO_SCTP_ &&
        f->proto != IPPROTO_UDPLITE_)
        return;
    __be16 *ports = c->pos;
    if ((void *)(ports + 2) > c->end || f->l4_off + 4 > f->l3_off + f->ip_len) {
        f->fragment = 1;
        return;
    }
    f->sport = ports[0];
    f->dport = ports[1];
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

static __always_inline int is_local(const struct flow *f)
{
    struct xesp_addr_key k = {.family = f->family};
#pragma unroll
    for (int i = 0; i < 4; i++)
        k.addr[i] = f->dst[i];
    return bpf_map_lookup_elem(&local_addrs, &k) != NULL;
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
    count(ctr);
    if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*m)) == 0) {
        struct xesp_meta *dst = (void *)(long)ctx->data_meta;
        if ((void *)(dst + 1) <= (void *)(long)ctx->data)
            __builtin_memcpy(dst, m, sizeof(*m));
    } else {
        count(XESP_CTR_META_FAILED);
    }
    __u32 ifindex = ctx->ingress_ifindex, queue = ctx->rx_queue_index;
    struct xesp_iface *ifc = bpf_map_lookup_elem(&ifaces, &ifindex);
    __u32 slot = (ifc ? ifc->xsk_base : 0) + queue;
    if (queue >= XESP_MAX_QUEUES)
        slot = XESP_MAX_XSKS;               /* no such slot: dropped below */
    int rc = bpf_redirect_map(&xsks, slot, XDP_DROP);
    if (rc != XDP_REDIRECT)
        count(XESP_CTR_XSK_MISSING);
    return rc;
}

/* ---- ESP ------------------------------------------------------------------------------- */

/* ESP (natt = 0) or ESP-in-UDP (natt = 1) whose header starts at c->pos. */
static __always_inline int classify_esp(struct xdp_md *ctx, struct cursor *c, void *data,
                                        struct flow *f, int natt)
{
    __be32 *spi = c->pos;
    if ((void *)(spi + 1) > c->end)
        return pass(XESP_CTR_PASS_MALFORMED);   /* not even an SPI: nobody's ESP */

    struct xesp_sa_key k = {.family = f->family, .spi = *spi};
#pragma unroll
    for (int i = 0; i < 4; i++)
        k.dst[i] = f->dst[i];
    struct xesp_sa_val *sa = bpf_map_lookup_elem(&sas, &k);
    if (!sa)
        return pass(XESP_CTR_PASS_ESP_UNKNOWN_SPI);

    /* Ours from here on: whatever is wrong with it, the kernel must not see it either. */
    if (f->bad_length)
        return drop(XESP_CTR_DROP_ESP_BAD_LENGTH);
    __u32 esp_off = c->pos - data;
    if (c->pos + ESP_HDR_LEN > c->end || esp_off + ESP_HDR_LEN > f->l3_off + f->ip_len)
        return drop(XESP_CTR_DROP_ESP_TRUNCATED);
    if (!!(sa->flags & XESP_SA_F_NATT) != natt)
        return drop(XESP_CTR_DROP_ENCAP_MISMATCH);

    struct xesp_meta m = {
        .magic = XESP_META_MAGIC,
        .kind = XESP_META_DECAP,
        .flags = (f->family == XESP_FAMILY_V6 ? XESP_META_F_IPV6 : 0) |
                 (natt ? XESP_META_F_NATT : 0),
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
    return redirect(ctx, &m, XESP_CTR_REDIRECT_DECAP);
}

/* UDP to port 4500 (RFC 3948 section 2): a 1-byte 0xff NAT keepalive, IKE behind the 4-byte
 * zero non-ESP marker, or ESP. Returns STEP_CONTINUE if it is none of these. */
static __always_inline int classify_udp_4500(struct xdp_md *ctx, struct cursor *c,
                                             void *data, struct flow *f, int *verdict)
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
    *verdict = classify_esp(ctx, c, data, f, 1);
    return STEP_DONE;
}

/* ---- Policies -------------------------------------------------------------------------- */

/* One step of the tuple-space search (see xesp_xdp_abi.h), run by bpf_loop so that the
 * verifier checks it once instead of once per tuple. Portless packets look up exact entries
 * only in tuples without ports, and shadows in tuples with ports. */
struct spd_walk {
    struct xesp_policy_key k;       /* family, dir and the packet's fields, unmasked */
    __u32 table;
    __u8 portless;
    struct spd_match r;
};

static long spd_step(__u32 i, void *arg)
{
    struct spd_walk *w = arg;
    struct xesp_tuple_table *tt = bpf_map_lookup_elem(&tuple_tables, &w->table);
    if (!tt || i >= tt->count)
        return 1;
    struct xesp_tuple *t = &tt->t[i & (XESP_MAX_TUPLES - 1)];   /* bpf_loop keeps i < 32 */
    if (t->best_rank >= w->r.rank)
        return 1;                       /* sorted: nothing further can win */
    if (t->family != w->k.family || t->dir != w->k.dir)
        return 0;

    int ported = t->fields & (XESP_TUPLE_F_SPORT | XESP_TUPLE_F_DPORT);
    struct xesp_policy_key k = {
        .tuple = t->id,
        .family = w->k.family,
        .dir = w->k.dir,
        .proto = (t->fields & XESP_TUPLE_F_PROTO) ? w->k.proto : 0,
    };
    if (!w->portless) {
        k.sport = (t->fields & XESP_TUPLE_F_SPORT) ? w->k.sport : 0;
        k.dport = (t->fields & XESP_TUPLE_F_DPORT) ? w->k.dport : 0;
    } else if (ported) {
        k.dir |= XESP_DIR_F_PORTLESS;
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        k.src[j] = w->k.src[j] & t->src_mask[j];
        k.dst[j] = w->k.dst[j] & t->dst_mask[j];
    }
    struct xesp_policy_val *v = bpf_map_lookup_elem(&policies, &k);
    if (!v)
        return 0;
    if (w->portless && ported) {
        if (v->rank < w->r.shadow_rank)
            w->r.shadow_rank = v->rank;
    } else if (v->rank < w->r.rank) {
        w->r.rank = v->rank;
        w->r.policy_id = v->policy_id;
        w->r.action = v->action;
        w->r.flags = v->flags;
        w->r.found = 1;
    }
    return 0;
}

/* Adds the best match of direction `dir` to *r (ranks only improve). */
static __always_inline void spd_lookup(const struct flow *f, __u32 dir, struct spd_match *r)
{
    __u32 zero = 0;
    __u32 *live = bpf_map_lookup_elem(&tuple_ctl, &zero);
    if (!live)
        return;
    struct spd_walk w = {
        .k = {.family = f->family, .dir = dir, .proto = f->proto, .sport = f->sport,
              .dport = f->dport},
        .table = *live & 1,
        .portless = f->fragment,
        .r = *r,
    };
#pragma unroll
    for (int j = 0; j < 4; j++) {
        w.k.src[j] = f->src[j];
        w.k.dst[j] = f->dst[j];
    }
    bpf_loop(XESP_MAX_TUPLES, spd_step, &w, 0);
    *r = w.r;
}

static __always_inline void spd_init(struct spd_match *r)
{
    __builtin_memset(r, 0, sizeof(*r));
    r->rank = ~0ULL;
    r->shadow_rank = ~0ULL;
}

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

/* Plaintext that no out policy claimed. On a public interface, what an in/fwd policy wants
 * protected should have come as ESP (RFC 4301 section 5.2). */
static __always_inline int check_unprotected(const struct flow *f, int unsure, __u32 pass_ctr)
{
    if (iface_role(f->ingress_ifindex) != XESP_ROLE_PUBLIC)
        return unsure ? drop(XESP_CTR_DROP_PORTS_UNKNOWN) : pass(pass_ctr);
    struct spd_match r;
    spd_init(&r);
    spd_lookup(f, XESP_DIR_IN, &r);
    if (!r.found)
        spd_lookup(f, XESP_DIR_FWD, &r);
    if (r.shadow_rank < r.rank)
        unsure = 1;
    if (r.found && r.action == XESP_ACTION_BLOCK)
        return drop(XESP_CTR_DROP_IN_BLOCK);
    if (r.found && (r.flags & XESP_POL_F_TMPL))
        return drop(XESP_CTR_DROP_IN_UNPROTECTED);
    if (unsure)
        return drop(XESP_CTR_DROP_PORTS_UNKNOWN);
    return pass(r.found ? XESP_CTR_PASS_BYPASS : pass_ctr);
}

static __always_inline int classify_plain(struct xdp_md *ctx, struct flow *f)
{
    int unsure = 0;
    int local = is_local(f);
    if (!local) {
        struct spd_match r;
        spd_init(&r);
        spd_lookup(f, XESP_DIR_OUT, &r);
        unsure = r.shadow_rank < r.rank;
        if (r.found && (r.flags & XESP_POL_F_TMPL) && r.action == XESP_ACTION_ALLOW) {
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
        if (r.found)
            return pass(XESP_CTR_PASS_BYPASS);
    }
    return check_unprotected(f, unsure, local ? XESP_CTR_PASS_LOCAL : XESP_CTR_PASS_NO_POLICY);
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

    if (f.proto == IPPROTO_ESP) {
        if (f.fragment)
            return pass(XESP_CTR_PASS_ESP_FRAGMENT);
        return classify_esp(ctx, &c, data, &f, 0);
    }
    if (f.proto == IPPROTO_UDP && !f.fragment) {
        int verdict;
        struct cursor uc = c;
        if (classify_udp_4500(ctx, &uc, data, &f, &verdict) == STEP_DONE)
            return verdict;
    }
    if (f.bad_length)
        return pass(XESP_CTR_PASS_MALFORMED);

    if (f.proto == NEXTHDR_ICMP_ && f.family == XESP_FAMILY_V6 && !f.fragment) {
        __u8 *type = c.pos;
        if ((void *)(type + 1) <= c.end && *type >= 133 && *type <= 137)
            return pass(XESP_CTR_PASS_ND);
    }
    parse_ports(&c, &f);
    if (f.proto == IPPROTO_UDP && f.dport == bpf_htons(IKE_PORT) && is_local(&f))
        return pass(XESP_CTR_PASS_IKE);
    return classify_plain(ctx, &f);
}

char LICENSE[] SEC("license") = "GPL";

/* ---- Egress: plaintext the gateway's own kernel sends ------------------------------------
 *
 * The XDP program sees what arrives. What the kernel itself sends out of a public interface (a
 * process on the gateway, a route from an interface xesp is not attached to) leaves through
 * the qdisc layer, where this program runs; AF_XDP transmissions bypass it. Plaintext that an
 * out policy blocks is dropped. Plaintext it protects cannot be encrypted here: it is sent to
 * the gateway's local link (local_link), a veth whose far end is one of the gateway's
 * protected interfaces, and is dropped if there is none; it never leaves in the clear. Like
 * the XDP program, this stays attached after a crash. */
SEC("tc")
int xesp_tc_egress(struct __sk_buff *skb)
{
    bpf_skb_pull_data(skb, skb->len < 256 ? skb->len : 256);    /* headers in the linear part */
    void *data = (void *)(long)skb->data;
    struct cursor c = {.pos = data, .end = (void *)(long)skb->data_end};
    struct flow f;
    __builtin_memset(&f, 0, sizeof(f));

    int rc = parse_ip(&c, data, &f);
    if (rc == PARSE_VLAN_DEPTH || rc == PARSE_EXT_DEPTH) {
        count(XESP_CTR_DROP_EGRESS_PLAINTEXT);      /* cannot tell: fail closed */
        return TC_ACT_SHOT;
    }
    if (rc < 0 || f.proto == IPPROTO_ESP)
        return TC_ACT_OK;
    parse_ports(&c, &f);
    if (f.proto == IPPROTO_UDP && !f.fragment &&
        (f.sport == bpf_htons(NATT_PORT) || f.dport == bpf_htons(NATT_PORT) ||
         f.sport == bpf_htons(IKE_PORT) || f.dport == bpf_htons(IKE_PORT)))
        return TC_ACT_OK;                           /* IKE, NAT-T keepalives, ESP in UDP */

    struct spd_match r;
    spd_init(&r);
    spd_lookup(&f, XESP_DIR_OUT, &r);
    if (r.shadow_rank < r.rank || (r.found && r.action == XESP_ACTION_BLOCK)) {
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
