// The gateway's data path: the XDP classifier on every interface the operator added, an
// AF_XDP socket on each of their RX queues (one UMEM for all of them), the ESP engine, and
// the transmit side that writes the link-layer header and sends each packet out of the
// interface its next hop is on.
//
//   RX burst -> metadata -> Engine::process_classified -> next hop -> TX burst on its port
//                                                      '-> the kernel (unresolved next hop,
//                                                          packets for the gateway itself)
//
// With workers (GatewayOptions::workers > 1), process_classified is cut in three
// (Engine::Burst): the data thread, the io thread of pipeline/ordered_pool.h, classifies
// each RX burst and runs its SAs' prepare step, the burst's crypto goes to a worker as one
// job (the data thread being worker 0), and the data thread finishes each burst once it and
// every burst taken before it that shares an SA with it (from whichever socket: an SA's
// packets may come on several) are done, then transmits it: an SA's packets leave in the
// order they came, whichever workers encrypted them, and a stalled worker holds up only
// the bursts that share an SA with its own (or with one that waits). The sockets share a few jobs
// (kJobsPerWorker a worker); when they are all in flight, a socket's next burst waits in its
// RX ring (pipeline-full), and what the ring cannot hold the kernel drops and counts (af_xdp).
//
// One thread runs the data path (poll_data; housekeeping once a millisecond and when one of
// its sockets has something; settle before sleeping). Configuration
// changes are made on another thread while it runs, in place and at the cost of the change:
// the engine's tables have two copies (rcu.h), the change is made to the one the data thread
// is not reading and published with one store, and the data thread, a QSBR reader, sees all
// of it from its next burst on; what the change removed is freed once it has passed the end
// of a burst. The classifier's maps are written around that publish (classifier_sync.h). An
// SA's runtime part is only ever touched by the data thread.
//
// Fail closed. The classifier is attached with a netlink attach, which outlives this process:
// after a crash it keeps dropping what it would redirect (the sockets are gone, so the
// redirect fails to XDP_DROP) until the next daemon replaces it. A clean stop does the same
// (shutdown()); only `iface del` or --detach-on-exit hands an interface back to the kernel.
#pragma once

#include <poll.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "af_xdp/umem.h"
#include "af_xdp/xsk_port.h"
#include "userspace/base/clock.h"
#include "bpf/xdp_program.h"
#include "userspace/config/config.h"
#include "userspace/esp/engine.h"
#include "userspace/esp/icmp.h"
#include "userspace/gateway/classifier_sync.h"
#include "userspace/gateway/iface_spec.h"
#include "userspace/kernel/kernel_esp.h"
#include "userspace/gateway/local_link.h"
#include "userspace/kernel/nexthop.h"
#include "userspace/kernel/pmtu.h"
#include "userspace/kernel/rtnl.h"
#include "userspace/control/report.h"
#include "userspace/offload/tun.h"
#include "userspace/pipeline/ordered_pool.h"

namespace xesp {

// What the transmit side counts. Drops are named; the rest say where packets went.
//   X(enumerator, name shown to the operator, is a drop)
#define XESP_GW_FOREACH_COUNTER(X)                                                                 \
    X(Rx, "rx", false)                                                                             \
    X(Tx, "tx", false)                                                                             \
    X(TxKernel, "tx-via-kernel", false)  /* next hop unresolved, or the gateway */                 \
    X(Fragmented, "fragmented", false)   /* outer packets split, RFC 4303 3.3.4 */                 \
    X(RxKernel, "rx-reassembled", false) /* ESP the kernel reassembled */                          \
    X(RxKernelTooBig, "drop-rx-reassembled-too-big", true) /* over a frame: not cut */             \
    X(RxNoMeta, "drop-rx-no-metadata", true)               /* redirected without classification */ \
    X(Reclassified, "reclassified", false) /* its slot not live yet, or no longer */               \
    X(TxRingFull, "drop-tx-ring-full", true)                                                       \
    X(TxKernelError, "drop-tx-kernel-error", true) /* the kernel refused it (no route) */          \
    X(TxTooBig, "drop-tx-too-big", true)           /* over the egress MTU, not fragmentable */     \
    X(NoFrames, "drop-no-frames", true)            /* no free frame: a fragment, an answer */      \
    X(TtlExceeded, "drop-ttl-exceeded", true)      /* TTL / hop limit would reach 0 */             \
    X(TimeExceeded, "icmp-time-exceeded", false)   /* ... and answered (RFC 792, 4443) */          \
    X(IcmpLimited, "drop-icmp-rate-limit", true)   /* ICMP errors over the rate limit */           \
    X(Prefragmented, "fragmented-before-encryption", false) /* NAT-T: inner IPv4 split */          \
    X(PipelineFull, "pipeline-full", false)     /* every job in flight: a socket's burst waits */  \
    X(PmtuLearnt, "pmtu-learnt", false)         /* ICMP lowered an SA's path MTU */                \
    X(PmtuIgnored, "pmtu-ignored", false)       /* ICMP naming no SA of ours, or stale */          \
    X(ReportsTaken, "pmtu-reports-kept", false) /* for a host, about our SA: not passed on */      \
    X(TunRx, "tun-rx", false)                   /* super-packets read from the TUN device */       \
    X(TunPieces, "tun-pieces", false)           /* ... and the packets cut from them */            \
    X(TunBad, "drop-tun-bad", true)             /* its vnet header or headers did not add up */    \
    X(TunTooBig, "drop-tun-too-big", true)      /* over a frame uncut, or > kTunPieces pieces */   \
    X(TunFragmented, "tun-fragmented", false)   /* over a frame, no DF: fragmented into frames */  \
    X(TunFailed, "tun-failed", false) /* the TUN device failed: tun mode stopped (logged) */       \
    X(TunLinkScope, "drop-tun-link-scope", true) /* link-scope multicast: not forwarded */         \
    X(TunNoTunnel, "drop-tun-no-public", true)   /* read with no public interface to send on */    \
    X(TunTx, "tun-tx", false)                    /* packets written to the TUN device */           \
    X(TunJoined, "tun-joined", false)            /* decrypted segments joined into those (GRO) */  \
    X(TunWriteError, "drop-tun-write", true)     /* segments the TUN device refused */             \
    X(TunReopen, "drop-tun-reopen", true) /* pieces waiting: sockets reopened, TUN closed */       \
    X(DecryptedBroadcast, "drop-decrypted-broadcast", true) /* to a broadcast address of ours */   \
    X(DecryptedMulticast, "drop-decrypted-multicast", true) /* to a group, in xdp mode */

enum class GwCounter : uint32_t {
#define XESP_GW_ENUM(e, name, drop) e,
    XESP_GW_FOREACH_COUNTER(XESP_GW_ENUM)
#undef XESP_GW_ENUM
        Count
};

constexpr std::array<std::string_view, size_t(GwCounter::Count)> kGwCounterNames = {
#define XESP_GW_NAME(e, name, drop) name,
    XESP_GW_FOREACH_COUNTER(XESP_GW_NAME)
#undef XESP_GW_NAME
};

// Entries in each AF_XDP ring. The fill ring is what a queue can take while the data thread
// is not running: at 1024, a single TCP stream (about 100 kpps) on two shared CPUs overran it
// in bursts (af_xdp rx-fill-ring-empty drops, then retransmissions); 2048 absorbed them. The
// Umem holds two 4 KiB frames per ring entry per socket: 16 MiB per socket at 2048.
inline constexpr uint32_t kDefaultRingSize = 2048;

struct GatewayOptions {
    Backend backend = Backend::Auto;
    XdpOptions xdp;
    uint32_t ring_size = kDefaultRingSize;  // each RX, TX, fill and completion ring
    bool busy_poll = false;
    uint32_t pmtu_expires_s = kPmtuExpiresSeconds;  // how long a learnt path MTU lasts
    bool hold_new_sas = false;  // EngineOptions::hold_new: a state file binds them
    // Threads that run the crypto, the data thread included (1: it alone), and the CPUs
    // they run on: the data thread (worker 0) on cpus[0], the others on the rest in turn (on
    // cpus[0] too if that is all); empty:
    // wherever the scheduler puts them.
    unsigned workers = 1;
    std::vector<int> cpus;
};

// The default number of workers: half the CPUs this process may run on, at least one. The
// other half is the kernel's: on veth and in copy mode it moves every frame (softirq work,
// the copy into the UMEM).
unsigned default_workers();

struct GatewayIface {
    std::string name;
    uint32_t ifindex = 0;
    IfaceRole role = IfaceRole::Protected;
    IfaceMode mode = IfaceMode::Xdp;
    uint32_t slot = 0;    // its range in the XSKMAP (xdp mode)
    uint32_t queues = 0;  // with a socket each (xdp mode; tun mode: none)
    uint32_t mtu = 0;
    bool local = false;   // the gateway's end of its local link (local_link.h)
    std::string warning;  // protected: unfinished checksums, with the fix (or "")
    // The Ethernet addresses its classifier entry takes frames for (struct xesp_iface), as
    // the last link event left them; none: no check (the local link; no Ethernet; too many).
    std::vector<XdpProgram::Mac> macs;
    // Gone from the namespace under the daemon (deleted, or moved to another): kept by name,
    // with no index, entry, slot or socket, and attached again as it was when a device of that
    // name is here (gateway_links.cpp). `tried`: the index of one it failed on, not tried again.
    bool absent = false;
    uint32_t tried = 0;
};

// A device that was an interface's (`was`) and is here under another name, with our program on
// it still, parked: it drops what it would hand over (and, public, the gateway's own protected
// plaintext) until `iface del WAS` or --detach-on-exit hands it back to the kernel
// (gateway_links.cpp).
struct RenamedDevice {
    std::string was;
    uint32_t ifindex = 0;
    std::string name;  // its name now, as last seen
};

class Gateway {
public:
    static Result<std::unique_ptr<Gateway>> create(const Config &config,
                                                   const GatewayOptions &options);
    ~Gateway();

    // A change to the SAs and policies, into the engine and the classifier, all or nothing,
    // at the cost of the change, in three steps:
    //   prepare(ch)   on the thread that makes changes, while the data thread runs: the new
    //                 SAs, their ids, the classifier's new entries; then the engine's tables
    //                 change in place (Engine::commit: the data thread sees all of it from its
    //                 next burst on); on error nothing changed;
    //   install(c)    on the data thread, after it: nothing yet (the tables are live);
    //   finish(c)     back on the thread of prepare(): deletes from the classifier what the
    //                 change removed.
    // apply() is all three on one thread. The data thread must be a reader of readers()
    // (quiescent between bursts, offline while it sleeps) for prepare() to return.
    struct Change {
        Engine::Prepared done;
    };
    // `before`, if given, runs once the change is ready and before it is published, with the
    // SAs it makes (no other thread sees them yet); if it fails, nothing changes.
    using BeforePublish = std::function<Result<void>(const std::vector<std::shared_ptr<Sa>> &made)>;
    Result<std::unique_ptr<Change>> prepare(const ConfigChange &ch,
                                            const BeforePublish &before = {});
    void install(Change &ch);
    void finish(std::unique_ptr<Change> ch);
    Result<void> apply(const ConfigChange &ch);
    Qsbr &readers() { return readers_; }

    // Attaches the classifier to an interface and opens a socket on each of its RX queues;
    // in tun mode, attaches the tc program and opens the TUN device (gateway_tun.cpp). The
    // first public interface also brings up the local link (local_link.h). A protected
    // interface added again with the other mode changes mode in place (change_mode()).
    // `absent_ok` (a state file's, an undo's): a device not here is kept by name, absent, and
    // one that cannot be attached too (a public one with the egress guard alone on it:
    // guard_absent_public()); a public one so kept still brings up the local link.
    Result<void> add_iface(const IfaceSpec &spec, bool absent_ok = false);
    // The devices the interface was, renamed since (renamed()), keep our program: the caller
    // hands them back (release_renamed()) once the change is saved, since an undo (add_iface())
    // cannot put it on again. With no interface of that name nothing is saved, and they are
    // handed back at once.
    Result<void> del_iface(const std::string &name);
    Result<void> release_renamed(const std::string &was, bool *found = nullptr);
    // Forgets an interface but leaves its program on, as a stop does: the undo of an `iface
    // add` over what an earlier daemon left (leftover()), which dropped what is protected and
    // must go on doing so; del_iface() would hand that traffic to the kernel in the clear.
    Result<void> leave_iface(const std::string &name);
    static bool leftover(const std::string &name);
    static bool ours_on(int ifindex);
    const std::vector<GatewayIface> &ifaces() const { return ifaces_; }
    const std::vector<RenamedDevice> &renamed() const { return renamed_; }
    // Device `ifindex`, which interface `was` was, is listed as renamed (renamed()) if it is
    // under another name now and keeps one of our programs (a restart's, from the state file).
    void note_renamed(const std::string &was, uint32_t ifindex);
    // How many times an entry was added to renamed() or taken off it: the state file keeps the
    // list (StateKeeper::tick()).
    uint64_t renamed_changes() const { return renamed_changes_; }
    const GatewayOptions &options() const { return options_; }

    // Moves a burst on every socket; returns how many packets came in. With workers, bursts
    // may still be in flight when it returns (in_flight()); they hold pointers into the
    // engine's tables, so the data thread is quiescent (readers()) only when none is:
    // drain() finishes them all, waiting for the workers, and writes what tx_tun() holds.
    size_t poll_data();
    size_t in_flight() const { return workers_ ? workers_->in_flight() : 0; }
    void drain();
    // Reaps completions, reads routing events, reassembled ESP and ICMP errors (those of
    // its sockets that one poll() finds something on), refreshes local addresses and checks
    // SA lifetimes. Call once a millisecond, and on waking when one of its sockets has
    // something (woke()).
    void housekeeping();
    // Before sleeping: finished bursts and sent frames back to the pool (a sendto() only
    // while frames still wait in a TX ring), next hops to resolve for what just came, and
    // what tx_tun() holds written.
    void settle();
    // Sleeping: what to wait on goes into pfds (the caller may add its own after), and what
    // the wait found to woke(): housekeeping() if one of its sockets has something, and a
    // TUN device that had nothing is passed over for a few rounds.
    void wait_fds(std::vector<pollfd> *pfds);
    void woke(const std::vector<pollfd> &pfds);

    // A stop. The sockets close; the classifier and the egress guard stay attached (as after
    // a crash) and drop what they would hand to the gateway, until the next daemon takes the
    // interfaces over: protected traffic never leaves in the clear. With `detach`, every
    // interface goes back to the kernel instead, and with it whatever no policy stops.
    void shutdown(bool detach);

    // `xesp stats`: the numbers, copied on the data thread (stats_sample(), no formatting),
    // and their JSON, made on any thread (with the classifier's counters, read there).
    struct Stats {
        EngineSample engine;
        std::array<uint64_t, size_t(GwCounter::Count)> counters{};
        std::vector<GatewayIface> ifaces;
        std::vector<RenamedDevice> renamed;
        uint32_t link_mtu = 0;  // 0: no public interface yet
        XskStats xsk;
        std::vector<PoolStats> workers;  // worker 0 is the data thread
        uint64_t tun_queue_drops = 0;    // tun mode: dropped at the TUN device's full queue
        uint64_t local_link_drops = 0;   // dropped by the local link's veth (local_link.h)
        std::vector<int> cpus;
        uint64_t uptime_ns = 0;
    };
    Stats stats_sample() const;
    nlohmann::json stats_json(const Stats &s) const;
    nlohmann::json stats_json() const { return stats_json(stats_sample()); }

    // Its SAs: the engine's, by id (nullptr where none), and one by key. For the state file
    // (state_keeper.h), on the data thread.
    const std::vector<std::shared_ptr<Sa>> &sas() const { return engine_->sas().all(); }
    std::shared_ptr<Sa> sa(const SaKey &k) const;

private:
    static constexpr size_t kBurst = 64;
    // Frames a port may hold on the way out: a burst, each packet possibly in a few fragments.
    static constexpr size_t kTxQueue = kBurst * 8;

    struct Port {
        XskPort x;
        uint32_t ifindex;
        uint32_t slot;
        std::vector<Pkt> txq;  // packets for this port, sent at the end of each burst
        bool local;            // the local link: its hop is taken (the gateway's own
                               // traffic; tun mode's UDP, by the tc program)
    };
    // A burst in flight on the workers: its frames, what the engine carries between its steps.
    static constexpr size_t kJobsPerWorker = 8;
    struct BurstJob : Job {
        Port *port = nullptr;
        size_t n = 0;
        Pkt pkts[kBurst];
        Pkt *ready[kBurst];
        Classified cls[kBurst];
        Engine::Burst b;
    };
    static void run_job(Job &j);
    void finish_job(Job &j);
    size_t reap_jobs();
    size_t take_burst(Port &port, Pkt *pkts, Pkt **ready, Classified *cls, bool *big);
    void rx_pipelined(Port &port);
    BurstJob *next_job();
    void dispatch(Port &port, BurstJob &j, size_t k, bool big);
    void submit(Port &port, BurstJob &j, size_t k);
    void process_here(Port &port, Pkt *const *ready, const Classified *cls, size_t k, bool big);
    // The engine's whole work on n packets, on this thread (cls: classified by XDP, else looked
    // up from their headers), counted as worker 0's (here_).
    void engine_here(Pkt *const *pkts, const Classified *cls, size_t n);
    Gateway() = default;
    // `left`: an earlier daemon's program is on it, and stays on (parked) if this fails.
    Result<void> attach_iface(const IfaceSpec &spec, bool local, bool left = false);
    Result<void> attach_tun_mode(GatewayIface i);
    void open_local_link();
    void forget_iface(std::vector<GatewayIface>::iterator it);
    Result<void> change_mode(std::vector<GatewayIface>::iterator it, const IfaceSpec &spec);
    Result<void> release_leftover(const std::string &name);
    Result<void> release_at(const std::string &name, int ifindex);
    void prune_renamed(const std::vector<rtnl::Link> &links);
    bool renamed_ours(const RenamedDevice &r) const;
    bool held_by_iface(const RenamedDevice &r) const;
    bool forget_renamed(const RenamedDevice &r);
    Result<void> rebuild_ports();
    void close_ports();
    void relink_engine();
    // The gateway's addresses, and with_broadcasts its broadcast addresses too (a dump that
    // walks the kernel's main routing table: at `iface add`, and when NextHops says the
    // broadcast routes may have changed, at most every kBrdGapNs), into the engine and the
    // classifier's map.
    void refresh_local_addresses(bool with_broadcasts = true);
    std::vector<XdpProgram::Mac> iface_macs(const GatewayIface &i);
    std::vector<XdpProgram::Mac> iface_macs(const GatewayIface &i, const rtnl::Uppers &u,
                                            bool quiet);
    void refresh_macs(uint64_t now);
    const std::vector<rtnl::Link> *follow_devices();
    void lose_iface(uint32_t ifindex);
    void return_iface(const std::string &name, uint32_t ifindex);
    void guard_absent_public(const std::string &name, uint32_t ifindex);
    bool local_link_gone(const std::vector<rtnl::Link> &links) const;
    void remake_local_link();
    bool iface_unbound(const GatewayIface &i) const;
    EngineOptions engine_options(bool local = true) const;
    uint32_t link_mtu() const;
    void rx_one(Port &port);
    bool learn_pmtu(const PmtuReport &r, uint64_t now);
    void take_report(Port &port, Pkt &p, const Classified &c);
    void age_pmtu(uint64_t now);
    uint32_t split_mtu() const;
    void rx_kernel();
    // The transmit side (gateway_tx.cpp). A burst sorted by where each packet goes next.
    static constexpr size_t kTxSort = kBurst * 2;  // a burst after prefragment()
    struct TxLists {
        struct Out {
            Pkt *p;
            const L2Hop *hop;
            Port *port;
        };
        Pkt *recycle[kTxSort];  // dropped, or not sent: frames back to the pool
        Pkt *kernel[kTxSort];   // bypass, or no next hop of ours: the kernel routes it
        Pkt *answers[kTxSort];  // ICMP time exceeded, for the engine again
        Pkt *tun[kTxSort];      // decrypted, for a protected interface in tun mode: joined, then
                                // to the TUN device, for the kernel to forward
        Out out[kTxSort];       // out of a port
        size_t nrecycle = 0, nkernel = 0, nanswers = 0, ntun = 0, nout = 0;
    };
    void transmit(Port &rx, Pkt *const *pkts, size_t n);
    void sort_tx(Port &rx, Pkt *const *pkts, size_t n, TxLists &l);
    bool queue_out(Port &rx, Pkt &p, const L2Hop &hop, Port &out);
    void flush_ports();
    void to_kernel(Port &rx, Pkt &p);
    static bool forward_hop(Pkt &p);
    static bool ttl_ends(const uint8_t *ip);
    static bool ttl_ends(const Pkt &p) { return ttl_ends(p.ip()); }
    bool decrypted_broadcast(const uint8_t *ip) const;
    static bool decrypted_multicast(const uint8_t *ip);
    bool time_exceeded(Pkt &p);
    static bool may_split(const Pkt &p, const Classified &c, uint32_t mtu);
    size_t prefragment(Port &port, uint32_t split, Pkt *const *in, const Classified *in_cls,
                       size_t n, Pkt *pieces, Pkt **out, Classified *out_cls);
    Port *tx_port(uint32_t ifindex, uint32_t queue);
    void count(GwCounter c, uint64_t n = 1) { counters_[size_t(c)] += n; }

    GatewayOptions options_;
    std::unique_ptr<XdpProgram> prog_;
    std::unique_ptr<ClassifierSync> sync_;  // the changing thread's
    Qsbr readers_;                          // of the engine's tables
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<NextHops> hops_;
    KernelEspInput kernel_esp_;
    bool kernel_esp_ok_ = false;
    PmtuListener pmtu_;
    bool pmtu_ok_ = false;
    // SAs with a learnt path MTU, by (destination, SPI): the MTU and when it expires. Aged
    // once a second.
    struct LearntPmtu {
        uint32_t mtu;
        uint64_t until_ns;
    };
    std::unordered_map<SaKey, LearntPmtu, SaKeyHash> pmtus_;
    uint32_t min_pmtu_ = 0;        // the smallest of them, 0: none
    uint64_t last_second_ns_ = 0;  // housekeeping's once-a-second step
    std::vector<GatewayIface> ifaces_;
    std::vector<RenamedDevice> renamed_;
    uint64_t renamed_changes_ = 0;  // entries added or removed: for the state file
    std::vector<IpAddr> local_;     // the gateway's addresses, sorted
    // The IPv4 broadcast addresses the kernel delivers to the gateway, sorted, its own
    // addresses left out (rtnl::dump_broadcasts()): never forwarded, decrypted or not.
    std::vector<IpAddr> broadcasts_;
    // What the classifier's local_addrs map holds: (address, broadcast), sorted.
    std::vector<std::pair<IpAddr, bool>> in_map_;
    bool local_map_full_ = false;  // the last refresh could not add them all (logged once)
    bool brd_failed_ = false;      // the last dump of the broadcast routes failed (logged once)
    LocalLink local_link_;

    // Sockets: one Umem for all of them, and its pool.
    std::unique_ptr<Umem> umem_;
    std::unique_ptr<FramePool> pool_;
    std::vector<std::unique_ptr<Port>> ports_;
    // The workers (nullptr: the data thread alone) and the jobs they run.
    std::unique_ptr<OrderedPool> workers_;
    PoolStats here_;  // engine_here()'s: the bursts the data thread ran whole
    std::vector<std::unique_ptr<BurstJob>> jobs_;
    std::vector<BurstJob *> free_jobs_;
    uint64_t started_ns_ = 0;
    std::array<uint64_t, size_t(GwCounter::Count)> counters_{};
    uint32_t frag_ident_ = 0;

    // Tun mode (gateway_tun.cpp): the TUN device of the protected interfaces in that mode,
    // the super-packet read last, and its pieces, each in a frame of the Umem, waiting for a
    // burst. kTunPieces: what the most pieces one super-packet can make (the device's
    // gso_max_segs, and 64 KB at the smallest tunnel MTU).
    static constexpr const char *kTunName = "xesp-tun";
    static constexpr size_t kTunPieces = 256;
    Result<void> open_tun();
    void close_tun();
    void close_unused_tun();
    void tidy_leftover_tun();
    void drop_tun_frames();
    void tun_failed(int rc);
    bool tun_may_read();  // counts tun_idle_ down
    enum : unsigned { kHopsFd = 1, kEspFd = 2, kPmtuFd = 4 };
    static constexpr size_t kServiceFds = 1 + KernelEspInput::kSockets + PmtuListener::kSockets;
    size_t service_fds(pollfd *pf, unsigned *bits) const;
    unsigned service_ready() const;
    void rx_tun();
    size_t take_tun(Port &port, Pkt *pkts, Pkt **ready, Classified *cls, bool *big);
    bool cut_tun(uint32_t len);
    bool cut_tun_big(uint32_t len);
    void answer_tun_big(const uint8_t *pkt, uint32_t len, uint32_t mtu);
    void tx_tun(Pkt *const *pkts, size_t n);
    void flush_tun();
    Port *find_tun_port();
    Port *tun_port_ = nullptr;  // find_tun_port() of the ports open now
    std::unique_ptr<Tun> tun_;
    VnetHdr tun_hdr_;               // of the super-packet in tun_buf_
    std::vector<uint8_t> tun_buf_;  // a super-packet read
    // "Too big" or time exceeded for what no frame holds (cut_tun_big)
    std::array<Pkt, kBurst> tun_answers_;
    size_t ntun_answers_ = 0;
    // Decrypted packets for the TUN device, held while the data thread's rounds keep
    // bringing more (tx_tun()), so that a flow's segments are joined across bursts, as the
    // kernel's GRO holds a flow while its NAPI poll goes on. flush_tun() writes them: after a
    // round that brought none (poll_data()), once kMaxRun are held or the first has waited
    // kTunHoldNs, and wherever the thread waits or sleeps (drain(), settle()) or the device
    // closes (close_tun()).
    static constexpr uint64_t kTunHoldNs = 100'000;
    std::array<Pkt, Gro::kMaxRun> tun_held_;
    size_t ntun_held_ = 0;
    size_t tun_added_ = 0;         // to the hold in this round (poll_data())
    uint64_t tun_held_since_ = 0;  // when the first held packet came
    uint64_t tun_queue_drops() const;
    uint64_t tun_queue_drops_ = 0;   // of the TUN devices closed before
    uint64_t local_link_drops_ = 0;  // of the local link's pairs before this one
    uint64_t tun_drops_base_ = 0;    // what the open one had dropped before it was ours
    // Cut, not yet in a burst: [tun_next_, end); fragments cut here with their packet's ports.
    struct TunPiece {
        Pkt pkt;
        Classified cls;
    };
    std::vector<TunPiece> tun_pieces_;
    // Rounds to pass over the TUN device after a read or a wait found it empty: while the
    // ports are busy, a read that fails is a system call a round for nothing. A wait that
    // finds it readable ends it.
    static constexpr uint32_t kTunIdleRounds = 4;
    uint32_t tun_idle_ = 0;
    // wait_fds()'s layout: the TUN device first if there is one, then the ports up to
    // wait_service_, then housekeeping's sockets up to wait_end_.
    size_t wait_service_ = 0, wait_end_ = 0;
    size_t tun_next_ = 0;
    IcmpLimiter icmp_limit_;
    uint64_t last_refresh_ns_ = 0;
    // The interfaces' MACs are to be read again (refresh_macs()), not before macs_at_ns_.
    bool macs_due_ = false;
    uint64_t macs_at_ns_ = 0;
    bool gone_unknown_ = false;     // link events were lost: refresh_macs() checks the interfaces
    bool local_link_left_ = false;  // an end of the local link had an RTM_DELLINK
    uint64_t macs_look_ns_ = 0;     // the last refresh_macs()
    bool addrs_due_ = false;        // the local addresses to read again (an address event)
    // The broadcast routes to read again (refresh_local_addresses()), not before brd_at_ns_.
    bool brd_due_ = false;
    uint64_t brd_at_ns_ = 0;
};

}  // namespace xesp
