/* The ABI between the XDP classifier (xesp_xdp.bpf.c), the tc egress program (xesp_tc.bpf.c)
 * and their loader (xdp_program.h): map keys and values, the metadata handed to userspace in
 * front of each redirected frame, and the counters. Included by both sides; plain fixed-width
 * fields only, no padding the compiler chooses. C++ includes it through abi_check.h, which
 * pins every size and offset and the values C++ passes by cast.
 *
 * Addresses are in network byte order. An IPv4 address sits in word 0 of a 4-word array and
 * words 1-3 are zero, so one key layout serves both families.
 */
#ifndef XESP_XDP_ABI_H
#define XESP_XDP_ABI_H

#include <linux/types.h>

#define XESP_FAMILY_V4 4
#define XESP_FAMILY_V6 6

/* Policy directions, numbered as xesp::Dir. */
#define XESP_DIR_IN 1
#define XESP_DIR_OUT 2
#define XESP_DIR_FWD 3
/* Or-ed into xesp_policy_key.dir of a "portless shadow" entry (see below). */
#define XESP_DIR_F_PORTLESS 0x80

/* ---- Inbound SAs: (family, destination, SPI) -> SA id --------------------------------- */

#define XESP_SA_F_NATT 0x1 /* the SA is ESP-in-UDP (RFC 3948), not raw ESP */
#define XESP_SA_F_DIR_IN                                                                           \
    0x2 /* `dir in`: decrypts whatever its destination. Without it
                                       the SA decrypts only ESP addressed to the gateway itself,
                                       as the kernel does: anything else is our own outbound
                                       ESP reflected back at us */

struct xesp_sa_key {
    __u8 family; /* XESP_FAMILY_V4 or _V6 */
    __u8 pad[3];
    __be32 spi;
    __be32 dst[4];
};

struct xesp_sa_val {
    __u32 sa_id; /* the caller's id, copied into xesp_meta.id */
    __u32 flags; /* XESP_SA_F_* */
};

/* ---- Policies: tuple-space search ----------------------------------------------------
 *
 * Policies are grouped by their mask tuple (family, direction, source and destination prefix
 * lengths, which of protocol/source port/destination port are set). Every policy of every
 * tuple lives in one hash map, keyed by the tuple id and the packet fields masked with the
 * tuple's masks. The program walks the active tuples (at most XESP_MAX_TUPLES), one hash
 * lookup each, and keeps the policy with the lowest rank: the cost grows with the number of
 * distinct masks, not with the number of policies (Open vSwitch's classifier).
 *
 * The tuple table is sorted by best_rank, the lowest rank of any policy in the tuple, so the
 * walk stops at the first tuple that cannot beat what it already has.
 *
 * A fragment (or a packet whose transport header is cut short) has no ports, so tuples that
 * match on ports cannot be looked up exactly. For those, every policy that protects or blocks
 * also has a shadow entry: same tuple, ports zero, dir | XESP_DIR_F_PORTLESS, rank = the
 * lowest rank among such policies sharing that key. A shadow hit that outranks the best exact
 * match means "a policy that must see this packet may apply, and we cannot tell": the packet
 * is dropped unless the best match sends it to userspace anyway (RFC 4301 section 7).
 * An IPv6 fragment whose protocol cannot be read (parse_ipv6) cannot be looked up in tuples
 * that match on the protocol either: such a tuple's best_rank stands for a shadow hit.
 */

#define XESP_MAX_TUPLES 32

#define XESP_TUPLE_F_PROTO 0x1
#define XESP_TUPLE_F_SPORT 0x2
#define XESP_TUPLE_F_DPORT 0x4

struct xesp_tuple {
    __be32 src_mask[4];
    __be32 dst_mask[4];
    __u64 best_rank; /* lowest rank of the tuple's policies (a lower bound) */
    __u8 id;         /* xesp_policy_key.tuple of this tuple's entries */
    __u8 family;
    __u8 dir;    /* XESP_DIR_* */
    __u8 fields; /* XESP_TUPLE_F_* */
    __u8 src_len;
    __u8 dst_len;
    __u8 pad[2];
};

/* Two tables, and the index of the live one in xesp_tuple_ctl: the loader rewrites the idle
 * table and then flips the index, so a packet never sees half an update. */
struct xesp_tuple_table {
    __u32 count;
    __u32 pad;
    struct xesp_tuple t[XESP_MAX_TUPLES];
};

struct xesp_policy_key {
    __u8 tuple;
    __u8 family;
    __u8 dir;      /* XESP_DIR_*, | XESP_DIR_F_PORTLESS for a shadow */
    __u8 proto;    /* 0 unless the tuple sets XESP_TUPLE_F_PROTO */
    __be16 sport;  /* 0 unless the tuple sets XESP_TUPLE_F_SPORT */
    __be16 dport;  /* 0 unless the tuple sets XESP_TUPLE_F_DPORT */
    __be32 src[4]; /* masked with the tuple's src_mask */
    __be32 dst[4];
};

#define XESP_ACTION_ALLOW 0
#define XESP_ACTION_BLOCK 1

#define XESP_POL_F_TMPL 0x1 /* the policy has a template: protect (out) / expect ESP (in) */

struct xesp_policy_val {
    __u64 rank;      /* priority << 32 | order added: lower wins, as the kernel */
    __u32 policy_id; /* the caller's id, copied into xesp_meta.id */
    __u8 action;     /* XESP_ACTION_* */
    __u8 flags;      /* XESP_POL_F_* */
    __u8 pad[2];
};

/* ---- Interfaces and local addresses --------------------------------------------------- */

/* The side of the gateway an interface faces. On a public interface, plaintext that an
 * inbound (in/fwd) policy wants protected must have come as ESP, and is dropped. */
#define XESP_ROLE_PROTECTED 0
#define XESP_ROLE_PUBLIC 1

/* The AF_XDP socket of a redirected frame is xsks[xsk_base + rx_queue_index]: a socket is bound
 * to one (interface, queue), so every interface has its own range of XESP_MAX_QUEUES slots.
 * A queue past the range, or an interface without an entry (xsk_base 0), still fails closed:
 * the redirect finds no socket and the frame is dropped. */
#define XESP_MAX_QUEUES 64
#define XESP_MAX_XSKS 1024 /* 16 interfaces of XESP_MAX_QUEUES queues */

/* The Ethernet addresses an interface takes frames for: its own and its upper devices' that
 * are up (a macvlan or VRRP address, a VLAN with an address of its own, its bridge or bond;
 * rtnl::accepted_macs). A unicast frame to any other (a promiscuous NIC, a switch flooding)
 * is another station's, which the kernel would not route (PACKET_OTHERHOST): where the
 * classifier would hand it to the gateway, it drops it (drop-other-host); what it would pass
 * goes to the kernel as before. With nmacs 0 (the local link, whose frames carry the next
 * hop's address; a device that is not Ethernet; more addresses than fit) there is no check. */
#define XESP_IFACE_MACS 4

struct xesp_iface {
    __u32 role;     /* XESP_ROLE_* */
    __u32 xsk_base; /* first xsks slot: slot number * XESP_MAX_QUEUES */
    __u8 macs[XESP_IFACE_MACS][6];
    __u8 nmacs; /* how many of macs hold one */
    __u8 pad[3];
};

/* The gateway's own addresses (value XESP_LOCAL_OWN), and the IPv4 broadcast addresses the
 * kernel delivers to it and forwards to no one (XESP_LOCAL_BROADCAST: its broadcast routes, a
 * subnet's and each `brd`, and 255.255.255.255). Plaintext to them is never encapsulated; the
 * exceptions for IKE, NAT-T and ESP of SPIs we do not own hold only for packets to them, as
 * does decryption by an SA without `dir` (XESP_SA_F_DIR_IN; the engine then takes only ESP to
 * an own address). Only an own address is a source that the tc egress guard lets the host's
 * ESP leave from. */
#define XESP_LOCAL_OWN 1
#define XESP_LOCAL_BROADCAST 2

struct xesp_addr_key {
    __u32 family;
    __be32 addr[4];
};

/* ---- Metadata in front of a redirected frame (bpf_xdp_adjust_meta) ---------------------
 *
 * Userspace finds it at xsk_umem__get_data(frame) - sizeof(struct xesp_meta). Where the
 * kernel refuses bpf_xdp_adjust_meta, it is the frame's first bytes instead (meta_in_frame in
 * xesp_xdp.bpf.c), which the socket's reader skips (XskPortOptions::skip): it then sits in
 * the same place. The RX descriptor does not say whether it is there, hence the magic;
 * userspace clears it after reading, because frames are reused. A frame without the magic is
 * classified again in userspace (with the metadata in the frame there is none: a frame that
 * cannot take it is dropped). */

#define XESP_META_MAGIC 0xe5e5

#define XESP_META_DECAP 1 /* ESP for one of our SAs: decrypt with SA `id` */
#define XESP_META_ENCAP 2 /* plaintext that out-policy `id` protects: encrypt */
#define XESP_META_REPORT                                                                           \
    3 /* ICMP "fragmentation needed" / "packet too big" quoting
                                       ESP or UDP, on its way to a host behind the gateway
                                       (transport mode): the path MTU of one of our SAs? */

#define XESP_META_F_IPV6 0x01         /* the IP header at l3_off is IPv6 */
#define XESP_META_F_NATT 0x02         /* DECAP: the ESP header follows a UDP/4500 header */
#define XESP_META_F_FRAGMENT 0x04     /* ENCAP: an IP fragment (or short L4): no ports seen */
#define XESP_META_F_FIB_OK 0x08       /* ENCAP: fib_* hold the plaintext route's next hop */
#define XESP_META_F_FIB_NO_NEIGH 0x10 /* ENCAP: route found, neighbour not resolved yet */

struct xesp_meta {
    __u16 magic;           /* XESP_META_MAGIC */
    __u8 kind;             /* XESP_META_DECAP, _ENCAP or _REPORT */
    __u8 flags;            /* XESP_META_F_* */
    __u32 id;              /* SA id (DECAP) or policy id (ENCAP) */
    __u16 l3_off;          /* IP header, bytes from the frame start (after VLAN tags) */
    __u16 l4_off;          /* DECAP: ESP header; ENCAP: transport header (after
                                       IPv4 options / IPv6 extension headers); REPORT: ICMP */
    __u32 flow_hash;       /* spreads work; DECAP: (dst, SPI), ENCAP: the 5-tuple */
    __u32 ingress_ifindex; /* where the frame came in */
    __u32 fib_ifindex;     /* FIB_OK or FIB_NO_NEIGH: egress device */
    __u8 fib_dmac[6];      /* FIB_OK: next hop MAC */
    __u16 fib_mtu;         /* FIB_OK or FIB_NO_NEIGH: egress MTU, host order */
};

/* ---- Sockets with a bypass policy of their own (sock_bypass.h) -------------------------
 * The value of a socket's entry in sock_bypass: the address family (AF_INET, AF_INET6) of the
 * socket's own out policy when that policy lets everything through, else 0; and when a sweep
 * of the sockets (xesp_sockpol.bpf.c) last saw it so. The egress program trusts a mark for
 * XESP_SOCK_MARK_TTL_NS: the gateway sweeps several times as often, and once it stops (no
 * daemon) the marks lapse and what those sockets send meets the out policies. */
#define XESP_SOCK_MARK_TTL_NS 1000000000ULL

struct xesp_sock_mark {
    __u32 family;
    __u32 pad;
    __u64 seen_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
};

/* ---- Counters: one per-CPU array slot each ---------------------------------------------
 * Every packet counts `rx` and exactly one verdict counter (redirect-*, pass-*, drop-*);
 * xsk-missing counts alongside a redirect verdict, and so does meta-failed where the metadata
 * goes in the area in front of the frame; where it goes in the frame (meta_in_frame in
 * xesp_xdp.bpf.c), meta-failed is a verdict, a drop. drop-egress-plaintext, pass-egress-own
 * and egress-local are counted by the tc egress program, outside `rx`; drop-unreadable by
 * both tc programs (xesp_tc.bpf.c). New counters go at the end: a counter's index is its key
 * in the map, which a program of an older build, left attached, still uses.
 *
 *   X(enumerator suffix, name shown to the operator) */
#define XESP_XDP_FOREACH_COUNTER(X)                                                                \
    X(RX, "rx")                                                                                    \
    X(REDIRECT_DECAP, "redirect-decap")                                                            \
    X(REDIRECT_ENCAP, "redirect-encap")                                                            \
    X(REDIRECT_REPORT, "redirect-report") /* ICMP too big about ESP, to a host */                  \
    X(XSK_MISSING, "xsk-missing")         /* no socket on the queue: dropped */                    \
    X(META_FAILED, "meta-failed")         /* without metadata (dropped if in the frame) */         \
    X(PASS_NON_IP, "pass-non-ip")         /* ARP, LLDP, ... */                                     \
    X(PASS_MALFORMED, "pass-malformed")   /* bad headers, not ESP for us: kernel's */              \
    X(PASS_IKE, "pass-ike")                                                                        \
    X(PASS_KEEPALIVE, "pass-keepalive")                                                            \
    X(PASS_ESP_UNKNOWN_SPI, "pass-esp-unknown-spi")                                                \
    X(PASS_ESP_FRAGMENT, "pass-esp-fragment") /* to us: the kernel reassembles first */            \
    X(PASS_ND, "pass-nd")                     /* IPv6 ND, hop limit 255, to the link or to us */   \
    X(PASS_LOCAL, "pass-local")               /* plaintext to the gateway itself */                \
    X(PASS_BYPASS, "pass-bypass")             /* an allow policy without template */               \
    X(PASS_NO_POLICY, "pass-no-policy")                                                            \
    X(DROP_OUT_BLOCK, "drop-out-policy-block")                                                     \
    X(DROP_IN_BLOCK, "drop-in-policy-block")                                                       \
    X(DROP_IN_UNPROTECTED, "drop-in-unprotected")                                                  \
    X(DROP_PORTS_UNKNOWN, "drop-ports-unknown") /* fragment a port policy may claim */             \
    X(DROP_ESP_TRUNCATED, "drop-esp-truncated")                                                    \
    X(DROP_ESP_BAD_LENGTH, "drop-esp-bad-length")                                                  \
    X(DROP_ENCAP_MISMATCH, "drop-encap-mismatch")     /* raw ESP for a NAT-T SA, or reverse */     \
    X(DROP_ESP_REFLECTED, "drop-esp-reflected")       /* ESP of an SA that is not inbound */       \
    X(DROP_PUBLIC_PLAINTEXT, "drop-public-plaintext") /* to protect, from a public side */         \
    X(DROP_VLAN_DEPTH, "drop-vlan-depth")             /* more than two VLAN tags */                \
    X(DROP_IPV6_EXT_DEPTH, "drop-ipv6-ext-depth")     /* too many extension headers to see */      \
    X(DROP_EGRESS_PLAINTEXT, "drop-egress-plaintext") /* tc egress: the kernel's own */            \
    X(PASS_EGRESS_OWN, "pass-egress-own")             /* tc egress: IKE, ESP of the gateway's */   \
    X(EGRESS_LOCAL, "egress-local")   /* tc egress: the kernel's own, to encrypt */                \
    X(TUN_ENCAP, "tun-encap")         /* tc ingress, tun mode: to protect, to the gateway's TUN */ \
    X(DROP_TUN_GONE, "drop-tun-gone") /* tc ingress, tun mode: to protect, and no TUN (stopped) */ \
    X(DROP_UNREADABLE, "drop-unreadable") /* both tc programs: IP headers they cannot read */      \
    X(TUN_UDP_LINK, "tun-udp-link") /* tc ingress, tun mode: UDP to protect, to the local link */  \
    X(DROP_OTHER_HOST, "drop-other-host") /* to hand over, but to another station's MAC */         \
    X(DROP_GROUP_MAC, "drop-group-mac")   /* to forward, but in a multicast or broadcast frame */  \
    X(DROP_MARTIAN, "drop-martian")       /* to protect, from or to a martian address */

enum xesp_xdp_counter {
#define XESP_XDP_COUNTER_ENUM(e, name) XESP_CTR_##e,
    XESP_XDP_FOREACH_COUNTER(XESP_XDP_COUNTER_ENUM)
#undef XESP_XDP_COUNTER_ENUM
        XESP_CTR__COUNT
};

#endif /* XESP_XDP_ABI_H */
