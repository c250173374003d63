/* The policy lookup that both programs make: the tuple-space search described in
 * xesp_xdp_abi.h, over the maps of shared_maps.h. spd_init, then spd_lookup once per
 * direction; the result says the best policy found and whether a portless shadow outranks it.
 */
#pragma once

#include <linux/bpf.h>

#include <bpf/bpf_helpers.h>

#include "bpf/parsing.h"
#include "bpf/shared_maps.h"
#include "bpf/xesp_xdp_abi.h"

/* What the policy walk found. */
struct spd_match {
    __u64 rank;        /* of the best exact match; ~0 if none */
    __u64 shadow_rank; /* of the best portless shadow (fragments only), or of a tuple with a
                          protocol for a packet whose protocol is not known */
    __u32 policy_id;
    __u8 found;
    __u8 action;
    __u8 flags;
};

/* One step of the tuple-space search (see xesp_xdp_abi.h), run by bpf_loop so that the
 * verifier checks it once instead of once per tuple. Portless packets look up exact entries
 * only in tuples without ports, and shadows in tuples with ports. */
struct spd_walk {
    struct xesp_policy_key k; /* family, dir and the packet's fields, unmasked */
    __u32 table;
    __u8 portless;
    __u8 proto_unknown;
    struct spd_match r;
};

static long spd_step(__u32 i, void *arg)
{
    struct spd_walk *w = arg;
    struct xesp_tuple_table *tt = bpf_map_lookup_elem(&tuple_tables, &w->table);
    if (!tt || i >= tt->count)
        return 1;
    struct xesp_tuple *t = &tt->t[i & (XESP_MAX_TUPLES - 1)]; /* bpf_loop keeps i < 32 */
    if (t->best_rank >= w->r.rank)
        return 1; /* sorted: nothing further can win */
    if (t->family != w->k.family || t->dir != w->k.dir)
        return 0;
    if (w->proto_unknown && (t->fields & XESP_TUPLE_F_PROTO)) {
        /* The packet's protocol cannot be read (parse_ipv6): a policy of this tuple may be
         * about it, and which cannot be looked up. The tuple's best rank stands for it. */
        if (t->best_rank < w->r.shadow_rank)
            w->r.shadow_rank = t->best_rank;
        return 0;
    }

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
        .k = {.family = f->family,
              .dir = dir,
              .proto = f->proto,
              .sport = f->sport,
              .dport = f->dport},
        .table = *live & 1,
        .portless = f->fragment,
        .proto_unknown = f->proto_unknown,
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
