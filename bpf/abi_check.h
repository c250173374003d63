// The C++ side's view of xesp_xdp_abi.h, with its layout pinned. C++ includes the ABI through
// this header, so wherever a map key, a map value or the metadata is built or read, the build
// checks that the two sides still agree: the size of every struct, the offset and size of
// every field (a hash key must have no padding the compiler chose, or the kernel hashes
// garbage), the limits the program relies on, and every value C++ passes to the program by
// cast rather than by name.
//
// Values that need no check here: IfaceRole (xdp_program.h) and XdpCounter are defined from
// the XESP_* values themselves; Classified::Kind (engine.h) and Action (sa_config.h) are
// mapped to XESP_META_* and XESP_ACTION_* one by one, by name.
#pragma once

#include <cstddef>

#include "bpf/xesp_xdp_abi.h"
#include "userspace/esp/sa_config.h"

// Field `f` of struct `s` sits at byte `off` and takes `size` bytes.
#define XESP_ABI_FIELD(s, f, off, size)                                                            \
    static_assert(offsetof(s, f) == (off) && sizeof(s::f) == (size), #s                            \
                  "." #f " moved or changed size: change xesp_xdp_abi.h and its users together")

namespace xesp::abi_check {

// ---- Inbound SAs ----
static_assert(sizeof(xesp_sa_key) == 24);
XESP_ABI_FIELD(xesp_sa_key, family, 0, 1);
XESP_ABI_FIELD(xesp_sa_key, pad, 1, 3);
XESP_ABI_FIELD(xesp_sa_key, spi, 4, 4);
XESP_ABI_FIELD(xesp_sa_key, dst, 8, 16);

static_assert(sizeof(xesp_sa_val) == 8);
XESP_ABI_FIELD(xesp_sa_val, sa_id, 0, 4);
XESP_ABI_FIELD(xesp_sa_val, flags, 4, 4);

// ---- Policies: the tuple table and the policy map ----
static_assert(sizeof(xesp_tuple) == 48);
XESP_ABI_FIELD(xesp_tuple, src_mask, 0, 16);
XESP_ABI_FIELD(xesp_tuple, dst_mask, 16, 16);
XESP_ABI_FIELD(xesp_tuple, best_rank, 32, 8);
XESP_ABI_FIELD(xesp_tuple, id, 40, 1);
XESP_ABI_FIELD(xesp_tuple, family, 41, 1);
XESP_ABI_FIELD(xesp_tuple, dir, 42, 1);
XESP_ABI_FIELD(xesp_tuple, fields, 43, 1);
XESP_ABI_FIELD(xesp_tuple, src_len, 44, 1);
XESP_ABI_FIELD(xesp_tuple, dst_len, 45, 1);
XESP_ABI_FIELD(xesp_tuple, pad, 46, 2);

static_assert(sizeof(xesp_tuple_table) == 8 + 48 * XESP_MAX_TUPLES);
XESP_ABI_FIELD(xesp_tuple_table, count, 0, 4);
XESP_ABI_FIELD(xesp_tuple_table, pad, 4, 4);
XESP_ABI_FIELD(xesp_tuple_table, t, 8, 48 * XESP_MAX_TUPLES);

static_assert(sizeof(xesp_policy_key) == 40);
XESP_ABI_FIELD(xesp_policy_key, tuple, 0, 1);
XESP_ABI_FIELD(xesp_policy_key, family, 1, 1);
XESP_ABI_FIELD(xesp_policy_key, dir, 2, 1);
XESP_ABI_FIELD(xesp_policy_key, proto, 3, 1);
XESP_ABI_FIELD(xesp_policy_key, sport, 4, 2);
XESP_ABI_FIELD(xesp_policy_key, dport, 6, 2);
XESP_ABI_FIELD(xesp_policy_key, src, 8, 16);
XESP_ABI_FIELD(xesp_policy_key, dst, 24, 16);

static_assert(sizeof(xesp_policy_val) == 16);
XESP_ABI_FIELD(xesp_policy_val, rank, 0, 8);
XESP_ABI_FIELD(xesp_policy_val, policy_id, 8, 4);
XESP_ABI_FIELD(xesp_policy_val, action, 12, 1);
XESP_ABI_FIELD(xesp_policy_val, flags, 13, 1);
XESP_ABI_FIELD(xesp_policy_val, pad, 14, 2);

// ---- Interfaces and local addresses ----
static_assert(sizeof(xesp_iface) == 36);
XESP_ABI_FIELD(xesp_iface, role, 0, 4);
XESP_ABI_FIELD(xesp_iface, xsk_base, 4, 4);
XESP_ABI_FIELD(xesp_iface, macs, 8, 24);
XESP_ABI_FIELD(xesp_iface, nmacs, 32, 1);
XESP_ABI_FIELD(xesp_iface, pad, 33, 3);

static_assert(sizeof(xesp_addr_key) == 20);
XESP_ABI_FIELD(xesp_addr_key, family, 0, 4);
XESP_ABI_FIELD(xesp_addr_key, addr, 4, 16);

// ---- Metadata in front of a redirected frame ----
// bpf_xdp_adjust_meta takes at most 32 bytes, in steps of 4.
static_assert(sizeof(xesp_meta) == 32 && sizeof(xesp_meta) % 4 == 0);
XESP_ABI_FIELD(xesp_meta, magic, 0, 2);
XESP_ABI_FIELD(xesp_meta, kind, 2, 1);
XESP_ABI_FIELD(xesp_meta, flags, 3, 1);
XESP_ABI_FIELD(xesp_meta, id, 4, 4);
XESP_ABI_FIELD(xesp_meta, l3_off, 8, 2);
XESP_ABI_FIELD(xesp_meta, l4_off, 10, 2);
XESP_ABI_FIELD(xesp_meta, flow_hash, 12, 4);
XESP_ABI_FIELD(xesp_meta, ingress_ifindex, 16, 4);
XESP_ABI_FIELD(xesp_meta, fib_ifindex, 20, 4);
XESP_ABI_FIELD(xesp_meta, fib_dmac, 24, 6);
XESP_ABI_FIELD(xesp_meta, fib_mtu, 30, 2);

// ---- Limits the program relies on ----
// The tuple walk indexes the table with i & (XESP_MAX_TUPLES - 1).
static_assert(XESP_MAX_TUPLES > 0 && (XESP_MAX_TUPLES & (XESP_MAX_TUPLES - 1)) == 0);
// The tuple id is one byte in the policy key.
static_assert(XESP_MAX_TUPLES <= 256);
// Every interface slot holds XESP_MAX_QUEUES sockets.
static_assert(XESP_MAX_XSKS % XESP_MAX_QUEUES == 0);

// ---- Sockets with a bypass policy of their own (sock_bypass's value) ----
static_assert(sizeof(xesp_sock_mark) == 16);
XESP_ABI_FIELD(xesp_sock_mark, family, 0, 4);
XESP_ABI_FIELD(xesp_sock_mark, pad, 4, 4);
XESP_ABI_FIELD(xesp_sock_mark, seen_ns, 8, 8);

// ---- Values C++ passes by cast, and flags that must fit their field ----
// Policy directions: TupleSpace writes uint8_t(PolicyConfig::dir) into the key and tuple.
static_assert(XESP_DIR_IN == int(Dir::In) && XESP_DIR_OUT == int(Dir::Out) &&
                  XESP_DIR_FWD == int(Dir::Fwd),
              "Dir (sa_config.h) and XESP_DIR_* disagree");
static_assert((XESP_DIR_F_PORTLESS & (XESP_DIR_IN | XESP_DIR_OUT | XESP_DIR_FWD)) == 0 &&
              XESP_DIR_F_PORTLESS <= 0xff);
// Address families: IpAddr::family (ip.h) is 4 or 6 and is copied into keys as it is.
static_assert(XESP_FAMILY_V4 == 4 && XESP_FAMILY_V6 == 6,
              "IpAddr::family and XESP_FAMILY_* disagree");
// One-byte fields.
static_assert((XESP_TUPLE_F_PROTO | XESP_TUPLE_F_SPORT | XESP_TUPLE_F_DPORT) <= 0xff);
static_assert(XESP_POL_F_TMPL <= 0xff && XESP_ACTION_ALLOW <= 0xff && XESP_ACTION_BLOCK <= 0xff);
static_assert(XESP_META_DECAP <= 0xff && XESP_META_ENCAP <= 0xff && XESP_META_REPORT <= 0xff);
static_assert((XESP_META_F_IPV6 | XESP_META_F_NATT | XESP_META_F_FRAGMENT | XESP_META_F_FIB_OK |
               XESP_META_F_FIB_NO_NEIGH) <= 0xff);
static_assert(XESP_META_MAGIC <= 0xffff);

}  // namespace xesp::abi_check

#undef XESP_ABI_FIELD
