// The engine: SA and policy tables plus the classification that decides, per packet, whether
// it is ESP for one of our SAs (decrypt), plaintext an outbound policy protects (encrypt),
// blocked, or not ours (pass). `xesp pcap` drives it over a capture (process()); the gateway's
// XDP program does the classification in the kernel and hands the result over in the frame's
// metadata (classified_from_meta(), then process_classified()), so that no packet is looked up
// twice.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "userspace/base/rcu.h"
#include "userspace/esp/sa_config.h"
#include "userspace/esp/esp.h"
#include "userspace/esp/sa.h"
#include "userspace/esp/sa_table.h"
#include "userspace/esp/spd.h"

namespace xesp {

// One change to an engine's SAs and policies.
using EngineChange = ConfigChange;

bool tmpl_matches(const PolicyTmpl &tmpl, const SaConfig &sa);

// What the engine knows of the links around it.
struct EngineOptions {
    uint32_t link_mtu = 0;        // MTU of the side encrypted packets leave on; 0 = no check
    IpAddr icmp_src4, icmp_src6;  // source of the ICMP errors we send; else the SA's own address
    // The gateway's own addresses. An SA without `dir` decrypts only ESP addressed to one of
    // them, as the kernel decrypts only what is delivered to it; its ESP to anywhere else is
    // our own outbound traffic reflected back (in-reflected). Unset (`xesp pcap` without
    // --local): every SA destination counts as ours.
    std::optional<std::vector<IpAddr>> local;
    // The IPv4 broadcast addresses the kernel delivers to the gateway (its broadcast routes),
    // sorted: what comes to them is delivered, never forwarded, so the in policies decide.
    std::vector<IpAddr> broadcast;
    // Told when an SA crosses a lifetime limit (Sa::on_expire), for every SA create() makes.
    Sa::ExpireFn on_expire;
    // Every SA create() makes is held (Sa::hold): it sends nothing until its owner binds a
    // sequence reservation (the daemon's state file, state_keeper.h).
    bool hold_new = false;
};

// What the XDP classifier found for a packet: the gateway translates struct xesp_meta
// (bpf/xesp_xdp_abi.h) into this with classified_from_meta().
struct Classified {
    // Report: an ICMP too-big about ESP for a host behind the gateway; the gateway reads it
    // (pmtu.h), the engine passes it.
    // Plain: plaintext that came without metadata from a protected interface in tun mode
    // (the tc program sent it to the gateway's TUN device): looked up from its own headers as
    // process() does, but only as plaintext to protect (never as ESP or IKE to take in).
    enum Kind : uint8_t { Decap, Encap, Report, Plain } kind = Decap;
    uint32_t id = 0;    // Decap: SA id (Engine::sa_id); Encap: out-policy id (policy_by_id)
    uint16_t l4 = 0;    // Decap: ESP header, bytes from the IP header (behind UDP for NAT-T);
                        // Encap: the transport header (not needed by the engine);
                        // Report: the ICMP header
    bool natt = false;  // Decap: the ESP header follows a UDP header (RFC 3948)
    // Plain, a fragment the gateway cut itself (tun mode): looked up with the ports of the
    // packet it was cut from, as that packet was, so that every fragment gets its verdict.
    bool whole_ports = false;
    uint16_t sport = 0, dport = 0;
};

// Reads the metadata the XDP program put in front of a frame: `meta` points at the `len`
// bytes before the frame start (xsk_port.h's meta()), `p` is the frame as XskPort::rx_burst
// hands it out. Checks the magic, the kind and the offsets; then moves p.l3 to the IP header,
// sets p.l2_len to the link-layer bytes before it (Ethernet, VLAN tags), p.len to the rest of
// the frame, and fills *c. Leaves p alone and returns false for a frame without valid
// metadata: classify that one with Engine::process(). The caller clears the magic afterwards,
// as frames are reused.
bool classified_from_meta(const void *meta, size_t len, Pkt &p, Classified *c);

// The Classified of the fragments the gateway cuts from the whole IP packet at ip: Plain, with
// the packet's ports (whole_ports), unless the packet is a fragment already.
Classified plain_fragments(const uint8_t *ip, uint32_t len);

struct EngineStats {
    uint64_t encrypted = 0, decrypted = 0, passed = 0, dropped = 0, too_big = 0;
    uint64_t esp_unknown_spi = 0, ike = 0, keepalive = 0;
    // process_classified(): packets whose id named nothing in the tables (a change not
    // published yet, or just published), looked up again instead.
    uint64_t reclassified = 0;
    Counters drops;  // every drop, whatever SA it belongs to

    EngineStats &operator+=(const EngineStats &o)
    {
        encrypted += o.encrypted;
        decrypted += o.decrypted;
        passed += o.passed;
        dropped += o.dropped;
        too_big += o.too_big;
        esp_unknown_spi += o.esp_unknown_spi;
        ike += o.ike;
        keepalive += o.keepalive;
        reclassified += o.reclassified;
        drops.packets += o.drops.packets;
        drops.bytes += o.drops.bytes;
        for (size_t i = 0; i < kDropCount; i++)
            drops.drops[i] += o.drops.drops[i];
        return *this;
    }
};

// The tables. Readers (the threads that forward packets) and the one thread that changes
// them share them without a lock: the engine keeps two copies (LeftRight, rcu.h); a change is
// made to the copy no reader is on, published in one store, and made again to the other copy
// once every reader has passed a quiescent point. A packet sees one copy for its whole burst:
// all of a change or none of it. SAs and policies are shared by both copies (shared_ptr), so
// the second copy costs the indexes, not the entries; what a change removes is freed when it
// leaves the second copy, when no reader can hold it.
//
// An SA's runtime part (sequence numbers, replay window) is touched by one thread at a time:
// the one that runs its packets. An SA put in place of one with the same keys (`sa update`
// with other limits) continues that one's sequence numbers and replay window (Sa::follow);
// it takes them over before its first packet, on the thread that ran the one it follows.
class Engine {
public:
    // With `prev`, every SA of `config` configured exactly as one of prev's is shared with
    // it, runtime state and all (sequence numbers, replay window, lifetimes, counters): a
    // change to the configuration must not restart the tunnels it leaves alone. create() only
    // reads prev, so it may run on another thread while prev carries packets; from the moment
    // the new engine carries them, prev must carry none (the SAs they share have one owner at
    // a time). On error prev is as it was. Ids: SA and policy ids are their indexes in
    // config.sas and config.policies.
    //
    // `readers`: the threads that run packets through the engine while another changes it
    // (change(), prepare()/commit()); without it, one thread does both.
    static Result<std::unique_ptr<Engine>> create(const Config &config, Backend backend,
                                                  const EngineOptions &options = {},
                                                  const Engine *prev = nullptr,
                                                  Qsbr *readers = nullptr);
    // Brings every SA created with a predecessor up to it now (Sa::follow), rather than at
    // its first packet.
    void take_over();

    // A change in place, at the cost of what it changes, while readers run packets. prepare()
    // makes the new SAs and gives the ids (for the classifier's maps); nothing is visible
    // yet, and on error nothing changed. commit() publishes it and returns once no reader
    // can hold what it removed; abandon() drops it. On the changing thread, one change at a
    // time. Unknown keys in del_* are errors, as are puts that repeat a key.
    struct Prepared {
        struct SaPut {
            uint32_t id;
            uint64_t order;
            std::shared_ptr<Sa> sa;
            bool fresh;  // a new id (else in place of the SA that had it)
        };
        struct SaDel {
            uint32_t id;
            SaKey key;
        };
        struct PolicyPut {
            uint32_t id;
            uint32_t order;
            Spd::Policy policy;
            Spd::Policy old;  // the policy it replaces, or null
        };
        struct PolicyDel {
            uint32_t id;
            Spd::Policy old;
        };
        std::vector<SaPut> sa_puts;
        std::vector<SaDel> sa_dels;
        std::vector<PolicyPut> policy_puts;
        std::vector<PolicyDel> policy_dels;
    };
    Result<Prepared> prepare(const EngineChange &change, Backend backend);
    void commit(Prepared &&p);
    void abandon(Prepared &&p);
    Result<void> change(const EngineChange &change, Backend backend);

    // Classifies and processes a burst of IP packets in place; each gets its verdict.
    void process(Pkt *const *pkts, size_t n);

    // The same for packets the XDP classifier has already looked up: cls[i] says what pkts[i]
    // is, and no table is searched again. Trusted only as far as it is cheap to check: a
    // decap id must name an SA with the packet's (destination, SPI) and encapsulation, else
    // the packet is dropped as in-no-state (a stale id, as after a reload); an encap id must
    // name an out policy, else out-no-state. An id that names nothing at all (the classifier's
    // maps and the tables are changed one after the other) is looked up again, as process()
    // would, and counted (EngineStats::reclassified). Then as process(): out-no-state when the
    // policy's template has no SA (fail closed), out-policy-block for a block policy, path
    // MTU, the inbound policy check after decryption, the same counters. A rewritten packet
    // (Encrypted, Decrypted, TooBig) gets l2_len = 0: its link-layer header is the caller's
    // to write.
    void process_classified(Pkt *const *pkts, const Classified *cls, size_t n);

    // For an Encap or Plain packet: the largest plaintext its SA still carries within the
    // link MTU (or its learnt path MTU) once encrypted, if that SA is ESP in UDP (NAT-T) in
    // tunnel mode; 0 otherwise (transport mode encrypts whole datagrams only), or if it
    // cannot be told (no MTU known, no SA yet). The gateway splits bigger IPv4 packets that
    // may be fragmented before they are encrypted (fragment.h says why).
    uint32_t natt_inner_mtu(const Classified &c, const Pkt &p);
    // For plaintext of any size from its IP header (a super-packet from the TUN device, not
    // yet cut): the largest packet its out policy's SA carries within the link MTU (or its
    // learnt path MTU) once encrypted; 0 when no SA would carry it or no MTU is known. One
    // lookup, on the data thread.
    uint32_t plain_inner_mtu(const uint8_t *ip, uint32_t len);

    // Ids for the XDP classifier's maps (XdpProgram::add_sa, add_policy): from create(), an
    // SA's index in Config::sas and a policy's index in Config::policies (whatever its
    // direction: in and fwd policies go into the classifier's maps too; only out policies
    // come back as Encap ids); from prepare(), what it says. Stable while the entry lives.
    static constexpr uint32_t kNoId = SaTable::kNoId;
    uint32_t sa_id(const Sa &sa) const { return sas().id_of(sa); }  // kNoId if not ours
    Sa *sa_by_id(uint32_t id) const { return sas().by_id(id); }     // nullptr if none
    const PolicyConfig *policy_by_id(uint32_t id) const { return tables_.read().spd.by_id(id); }
    size_t policy_count() const { return tables_.read().spd.size(); }

    // The tables as readers see them now (valid until the reader's next quiescent point).
    const SaTable &sas() const { return tables_.read().sas; }
    const Spd &spd() const { return tables_.read().spd; }
    const EngineStats &stats() const { return stats_; }
    const EngineOptions &options() const { return options_; }
    // The gateway's addresses changed (EngineOptions::local); on the reading thread.
    void set_local(std::vector<IpAddr> local)
    {
        std::sort(local.begin(), local.end());
        options_.local = std::move(local);
    }
    // The gateway's broadcast addresses changed (EngineOptions::broadcast); on the reading
    // thread.
    void set_broadcast(std::vector<IpAddr> broadcast)
    {
        std::sort(broadcast.begin(), broadcast.end());
        options_.broadcast = std::move(broadcast);
    }
    // The links changed (EngineOptions link_mtu, icmp_src4, icmp_src6); on the reading thread.
    void set_links(const EngineOptions &o)
    {
        options_.link_mtu = o.link_mtu;
        options_.icmp_src4 = o.icmp_src4;
        options_.icmp_src6 = o.icmp_src6;
    }
    // Whether sa may decrypt: `dir in`, or no `dir` and its destination is ours.
    bool inbound(const Sa &sa) const;
    // One of the gateway's addresses (options_.local is set, and kept sorted).
    bool is_local(const IpAddr &a) const;
    // Expire notifications (soft and hard lifetimes) as they happen, for every SA (shared
    // ones too: not while another engine runs them; EngineOptions::on_expire is for that).
    void on_expire(Sa::ExpireFn fn);
    // Time limits (`limit time-*`): Sa::check_time() for every SA that has one, all at once.
    void check_time(uint64_t now);
    // The same spread over the second, for the data thread: each call checks the share of
    // the SAs that the time since the last call is of a second, going round them, so that
    // every SA is checked once a second and no call holds the packets up for all of them.
    // Returns how many it checked.
    size_t check_time_some(uint64_t now);

    enum class Dirn : uint8_t { None, Encap, Decap };

    // A burst between its steps, for a caller that runs the cipher on other threads
    // (pipeline/ordered_pool.h):
    //   begin_classified()  here: what process_classified() does up to the cipher, that is,
    //                       the lookups and each SA's prepare step (sequence numbers, replay
    //                       pre-check); and the cipher of the SAs whose cipher may not leave
    //                       this thread (SaCipher::thread_safe());
    //   crypt()             on any thread: the cipher of the others, and before it their
    //                       tunnel-mode headers and trailers (esp_encap_write()), so that
    //                       the frames stay in the cache of the thread that encrypts them;
    //   end()               here again: each SA's finish step (replay window, lifetimes), the
    //                       inbound policy check, the counters, as process_classified().
    // Between begin and end this thread holds pointers into the tables: it may not be
    // quiescent (rcu.h). Bursts that share an SA must end in the order they began. `pkts`
    // must stay where it is until end().
    // begin_classified() refuses a burst (false, nothing done) while bursts begun with
    // tables that a change has since replaced are still open: the caller ends them first.
    // An SA put in place of another (`sa update`) takes over its replay window and sequence
    // numbers with its first packet, and must see what the bursts in flight put there.
    struct Burst {
        struct Group {
            Sa *sa;
            Dirn dirn;
            uint8_t n;         // packets
            uint8_t first;     // index of the first in `sorted`
            uint8_t from, to;  // its ops in the EspBurst of its direction
        };
        Pkt *const *pkts = nullptr;
        size_t n = 0;
        Dirn dirn[kMaxBurst];
        Sa *owner[kMaxBurst];
        Group groups[kMaxBurst];
        size_t ngroups = 0;
        Pkt *sorted[kMaxBurst];  // by group
        EspBurst enc, dec;
        size_t enc_here = 0, dec_here = 0;  // ops begin_classified() ran itself

        // Its SAs, for keys (at most kMaxBurst) that keep it in order with the bursts that
        // share one of them (OrderedPool's Job::keys). Returns how many.
        size_t sa_keys(uint64_t *keys) const
        {
            for (size_t g = 0; g < ngroups; g++)
                keys[g] = uint64_t(reinterpret_cast<uintptr_t>(groups[g].sa));
            return ngroups;
        }
    };
    [[nodiscard]] bool begin_classified(Pkt *const *pkts, const Classified *cls, size_t n,
                                        Burst &b);
    static void crypt(Burst &b);
    void end(Burst &b);

private:
    struct Tables {
        SaTable sas;
        Spd spd;
        uint64_t generation = 0;  // changes made to them (commit())
    };
    explicit Engine(Qsbr *readers) : tables_(readers) {}
    // A policy into the SPD, or out of it, with its link to the SAs of its flow (OutFlow).
    static void put_policy(Tables &t, uint32_t id, uint32_t order, const Spd::Policy &p);
    static void remove_policy(Tables &t, uint32_t id);

    // Where a packet's classification stands between the steps of a burst (classify_step).
    struct Step {
        enum Stage : uint8_t {
            Done,
            Policy,      // plaintext: look up its out policy
            Tmpl,        // the policy found: its template, its link's SA or OutSa
            OutSa,       // the SA the template names
            Check,       // whether that SA may carry the packet
            ById,        // classified: the out policy `id`
            ByIdPolicy,  // that policy: Tmpl's work, then its link's SA, or OutSa; Check
            DecapId,     // classified: the SA `id`
            DecapCheck,  // its packet checked against it
        } stage = Done;
        bool unsure = false;
        bool natt = false;  // DecapId: behind UDP
        uint16_t l4 = 0;    // DecapId: the ESP header's offset
        uint32_t id = 0;    // ById, DecapId: what the XDP classifier found
        FlowKey flow;
        Spd::Probe probe;  // Policy: the out lookup's hashes
        const PolicyConfig *pol = nullptr;
        const OutFlow *link = nullptr;  // the policy's (Spd::put())
        SaTable::OutKey out;
        Sa *sa = nullptr;
    };
    Dirn classify(const Tables &t, Pkt &p, Sa **sa);
    Dirn classify_begin(const Tables &t, Pkt &p, Step &s, Sa **sa,
                        const Classified *plain_only = nullptr);
    Dirn classify_step(const Tables &t, Pkt &p, Step &s, Sa **sa);
    void classify_burst(const Tables &t, Pkt *const *pkts, Step *steps, Dirn *dirn, Sa **owner,
                        size_t n);
    Dirn resolve_decap(Pkt &p, Step &s, Sa **sa);
    Dirn resolve_encap(const Tables &t, Pkt &p, Step &s, Sa **sa);
    static void from_link(Step &s, const PolicyTmpl &tmpl);
    Sa *out_sa(const Tables &t, const PolicyConfig &pol, const IpHeader &h);
    void classify_ids(const Tables &t, Pkt *const *pkts, const Classified *cls, size_t n, Burst &b);
    void prepare_burst(Burst &b, bool threads);
    static void write_encap(Burst &b, bool here);
    void finish_burst(const Tables &t, Burst &b);
    Dirn classify_esp(const Tables &t, Pkt &p, const uint8_t *ip, uint32_t esp_off, bool udp,
                      const IpAddr &dst, Sa **sa);
    Dirn check_unprotected(const Tables &t, Pkt &p, const FlowKey &flow);
    void inbound_policy_checks(const Tables &t, Burst &b);
    Dir inbound_dir(const FlowKey &flow, bool *then_fwd) const;
    bool decrypted_martian(const FlowKey &flow) const;
    const PolicyConfig *inbound_policy(const Tables &t, const FlowKey &flow, bool *unsure) const;
    bool too_big(Sa &sa, Pkt &p);
    void account(Pkt &p, Sa *sa);
    Result<std::shared_ptr<Sa>> make_sa(const SaConfig &c, Backend backend) const;

    EngineOptions options_;
    LeftRight<Tables> tables_;
    // The changing thread's: ids, orders, and policies by key.
    IdPool sa_ids_, policy_ids_;
    uint64_t sa_order_ = 0;
    uint32_t policy_order_ = 0;
    std::unordered_map<PolicyKey, uint32_t, ConfigKeyHash> policy_ids_by_key_;
    EngineStats stats_;
    // check_time_some()'s: where it goes on, when it last ran, and the SA checks owed
    // (in SA-nanoseconds: SAs times time) short of a whole one.
    size_t time_next_ = 0;
    uint64_t time_last_ = 0;
    uint64_t time_owed_ = 0;
    // Bursts begun and not ended (begin_classified()), and the tables they began with.
    // process() and process_classified() may run between (the gateway's ICMP answers, which
    // it encrypts as it finishes a burst): with newer tables, an SA there may take over from
    // one whose bursts are open, which is safe for an outbound SA only (its numbers were
    // taken as each burst began), and only outbound packets go that way then.
    uint64_t generation_ = 0;  // the changing thread's
    size_t open_ = 0;
    const Tables *open_tables_ = nullptr;
    uint64_t open_generation_ = 0;
};

}  // namespace xesp
