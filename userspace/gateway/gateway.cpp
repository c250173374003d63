#include "userspace/gateway/gateway.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>

#include "bpf/abi_check.h"
#include "userspace/esp/fragment.h"
#include "userspace/base/ip_header.h"
#include "userspace/base/wire.h"
#include "userspace/base/log.h"
#include "userspace/kernel/rtnl.h"
#include "userspace/control/report.h"

namespace xesp {

namespace {

constexpr uint64_t kRefreshNs = 2'000'000'000;  // local addresses
constexpr uint64_t kAddrGapNs = 50'000'000;     // ... between two reads, at address events
// The broadcast routes (rtnl::dump_broadcasts(), a walk of the main table): at events, this
// long at least between two reads; after a failure, kRefreshNs.
constexpr uint64_t kBrdGapNs = 250'000'000;
constexpr uint64_t kUrgentGapNs = 10'000'000;  // device looks at a device gone or back
// Sockets given a bypass policy of their own (an IKE daemon's) meet the out policies until
// the next sweep marks them: its IKE retransmits. Well within XESP_SOCK_MARK_TTL_NS.
constexpr std::chrono::milliseconds kSweepPeriod{200};
// The most a packet can grow by encryption: outer IPv6, UDP, ESP, IV, padding, ICV. A
// plaintext packet shorter than the MTU it must fit by more than this fits whatever its SA.
constexpr uint32_t kMaxEncapOverhead = 128;

// Every address of every interface in this network namespace (IPv6 link-local ones too);
// false if they cannot be read.
bool interface_addresses(std::vector<std::pair<std::string, IpAddr>> &out)
{
    out.clear();
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0)
        return false;
    for (ifaddrs *a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr)
            continue;
        if (a->ifa_addr->sa_family == AF_INET) {
            auto *s4 = reinterpret_cast<const sockaddr_in *>(a->ifa_addr);
            out.emplace_back(a->ifa_name,
                             IpAddr::v4(reinterpret_cast<const uint8_t *>(&s4->sin_addr)));
        } else if (a->ifa_addr->sa_family == AF_INET6) {
            auto *s6 = reinterpret_cast<const sockaddr_in6 *>(a->ifa_addr);
            out.emplace_back(a->ifa_name, IpAddr::v6(s6->sin6_addr.s6_addr));
        }
    }
    freeifaddrs(list);
    return true;
}

// The IPv4 broadcast addresses the kernel delivers to the gateway (rtnl::dump_broadcasts());
// false if they cannot be read.
bool broadcast_addresses(std::vector<IpAddr> &out)
{
    rtnl::Requests rq;
    if (!rq.open(1, true))
        return false;
    return rtnl::dump_broadcasts(rq, out) == 0;
}

bool link_local(const IpAddr &a)
{
    return a.family == 6 && a.b[0] == 0xfe && (a.b[1] & 0xc0) == 0x80;
}

}  // namespace

Result<std::unique_ptr<Gateway>> Gateway::create(const Config &config,
                                                 const GatewayOptions &options)
{
    std::unique_ptr<Gateway> g(new Gateway());
    g->options_ = options;
    auto prog = XdpProgram::load(options.xdp);
    if (!prog)
        return prog.error();
    g->prog_ = std::move(*prog);
    if (g->prog_->frame_skip())
        log(LogLevel::Notice, "the kernel refuses bpf_xdp_adjust_meta to XDP programs: the "
                              "classifier's verdict goes at the start of each frame instead");
    g->sync_ = std::make_unique<ClassifierSync>(*g->prog_);
    auto hops = NextHops::open();
    if (!hops)
        return hops.error();
    g->hops_ = std::move(*hops);
    if (auto r = g->kernel_esp_.open(); r)
        g->kernel_esp_ok_ = true;
    else
        log(LogLevel::Warning, "%s: fragmented ESP will not be decrypted",
            r.error().message.c_str());
    if (auto r = g->pmtu_.open(); r)
        g->pmtu_ok_ = true;
    else
        log(LogLevel::Warning, "%s: path MTUs to the peers will not be learnt from ICMP",
            r.error().message.c_str());
    g->refresh_local_addresses();
    for (int fd : g->hops_->send_fds())
        if (auto r = g->prog_->add_own_socket(fd); !r)
            return r.error();
    if (auto r = g->prog_->sweep_socket_policies(); !r)
        log(LogLevel::Warning,
            "%s: IKE from sockets with a bypass policy of their own meets the out policies",
            r.error().message.c_str());
    g->prog_->sweep_socket_policies_every(kSweepPeriod);  // tried again there if it failed
    EngineOptions eo = g->engine_options();
    eo.hold_new = options.hold_new_sas;
    eo.on_expire = [](const Sa &sa, bool hard) {
        log(hard ? LogLevel::Warning : LogLevel::Notice, "%s: %s lifetime reached%s",
            sa_label(sa.config()).c_str(), hard ? "hard" : "soft",
            hard ? "; the SA no longer carries traffic: replace it (xesp sa update/add)" : "");
    };
    auto engine = Engine::create(Config{}, options.backend, eo, nullptr, &g->readers_);
    if (!engine)
        return engine.error();
    g->engine_ = std::move(*engine);
    ConfigChange all;
    all.put_sas.assign(config.sas.begin(), config.sas.end());
    all.put_policies.assign(config.policies.begin(), config.policies.end());
    if (auto r = g->apply(all); !r)
        return r.error();
    if (options.workers > 1) {
        auto pool =
            OrderedPool::create(options.workers, options.cpus, kJobsPerWorker * kBurst, true);
        if (!pool)
            return pool.error();
        g->workers_ = std::move(*pool);
        // Few enough that the data thread, worker 0, always has room (OrderedPool::kDepth).
        size_t jobs = std::min(OrderedPool::kDepth, kJobsPerWorker * options.workers);
        for (size_t i = 0; i < jobs; i++) {
            g->jobs_.push_back(std::make_unique<BurstJob>());
            g->free_jobs_.push_back(g->jobs_.back().get());
        }
    }
    g->started_ns_ = now_ns();
    return g;
}

Gateway::~Gateway()
{
    close_ports();
}

unsigned default_workers()
{
    constexpr int kMost = 8;  // one data thread feeds no more than this many
    cpu_set_t set;
    CPU_ZERO(&set);
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return unsigned(std::clamp(n / 2, 1, kMost));
}

// The smallest MTU of the public interfaces; 0: none known.
uint32_t Gateway::link_mtu() const
{
    uint32_t mtu = 0;
    for (const auto &i : ifaces_)
        if (i.role == IfaceRole::Public && i.mtu && (!mtu || i.mtu < mtu))
            mtu = i.mtu;
    return mtu;
}

EngineOptions Gateway::engine_options(bool local) const
{
    EngineOptions o;
    if (local)
        o.local = local_;
    o.broadcast = broadcasts_;
    o.link_mtu = link_mtu();
    // ICMP errors go back to the protected side: answer from an address there.
    std::vector<std::pair<std::string, IpAddr>> addrs;
    (void)interface_addresses(addrs);
    for (const auto &i : ifaces_) {
        if (i.role != IfaceRole::Protected)
            continue;
        for (const auto &[name, a] : addrs) {
            if (name != i.name || link_local(a))
                continue;
            IpAddr &slot = a.family == 4 ? o.icmp_src4 : o.icmp_src6;
            if (!slot.family)
                slot = a;
        }
    }
    return o;
}

// On the data thread, when what the engine knows of the links changed (an interface came or
// went).
void Gateway::relink_engine()
{
    engine_->set_links(engine_options());
}

Result<std::unique_ptr<Gateway::Change>> Gateway::prepare(const ConfigChange &change,
                                                          const BeforePublish &before)
{
    auto ch = std::make_unique<Change>();
    // The SAs first: the slow part, and nothing the data thread sees. Then the maps, so that
    // new entries are classified only a moment before the engine has them.
    auto p = engine_->prepare(change, options_.backend);
    if (!p)
        return p.error();
    if (auto r = sync_->stage(*p); !r) {
        engine_->abandon(std::move(*p));
        return r.error();
    }
    if (before) {
        std::vector<std::shared_ptr<Sa>> made;
        for (const auto &put : p->sa_puts)
            made.push_back(put.sa);
        if (auto r = before(made); !r) {
            sync_->unstage();
            engine_->abandon(std::move(*p));
            return r.error();
        }
    }
    engine_->commit(std::move(*p));
    ch->done = std::move(*p);
    return ch;
}

void Gateway::install(Change &)
{}

std::shared_ptr<Sa> Gateway::sa(const SaKey &k) const
{
    const SaTable &t = engine_->sas();
    const Sa *s = t.find_in(k.dst, k.spi);
    return s ? t.ref(t.id_of(*s)) : nullptr;
}

void Gateway::finish(std::unique_ptr<Change> ch)
{
    sync_->commit(ch->done);
    ch.reset();
}

Result<void> Gateway::apply(const ConfigChange &change)
{
    auto ch = prepare(change);
    if (!ch)
        return ch.error();
    install(**ch);
    finish(std::move(*ch));
    return {};
}

void Gateway::refresh_local_addresses(bool with_broadcasts)
{
    std::vector<std::pair<std::string, IpAddr>> addrs;
    if (!interface_addresses(addrs)) {
        brd_due_ |= with_broadcasts;  // kept as they were: tried again
        return;
    }
    std::vector<IpAddr> now;
    for (const auto &[name, a] : addrs)
        now.push_back(a);
    std::sort(now.begin(), now.end());
    now.erase(std::unique(now.begin(), now.end()), now.end());
    std::vector<IpAddr> brd = broadcasts_;
    if (with_broadcasts) {
        std::vector<IpAddr> read;
        if (broadcast_addresses(read)) {
            brd = std::move(read);
            brd_failed_ = false;
        } else {
            if (!brd_failed_)
                log(LogLevel::Warning,
                    "the kernel's broadcast routes cannot be read: the gateway keeps the "
                    "broadcast addresses it had, and tries again every few seconds");
            brd_failed_ = true;
            brd_due_ = true;
            brd_at_ns_ = now_ns() + kRefreshNs;
        }
    }
    // The limited broadcast is the gateway's too (the kernel delivers it, ipv4_is_lbcast()),
    // and a broadcast address that is also one of its own addresses is its own.
    const IpAddr limited = IpAddr::v4(std::array<uint8_t, 4>{255, 255, 255, 255}.data());
    if (!std::binary_search(brd.begin(), brd.end(), limited))
        brd.insert(std::upper_bound(brd.begin(), brd.end(), limited), limited);
    std::erase_if(brd,
                  [&](const IpAddr &b) { return std::binary_search(now.begin(), now.end(), b); });

    // The classifier's map (1,024 entries): what went first, then the gateway's own addresses,
    // then the broadcast addresses, so that new broadcast addresses never keep out one of its
    // own. An address that did not go in stays out of `in_map_` and is tried again at the next
    // round, as is the removal of one that would not go; one that goes from own to broadcast
    // or back is overwritten in place.
    auto by_addr = [](auto &v, const IpAddr &a) {
        auto it = std::lower_bound(v.begin(), v.end(), std::make_pair(a, false));
        return it != v.end() && it->first == a ? &*it : nullptr;
    };
    auto wanted = [&](const IpAddr &a) {
        return std::binary_search(now.begin(), now.end(), a) ||
               std::binary_search(brd.begin(), brd.end(), a);
    };
    std::vector<std::pair<IpAddr, bool>> kept;
    for (const auto &o : in_map_)
        if (wanted(o.first) || !prog_->remove_local_address(o.first))
            kept.push_back(o);
    std::string failed;
    auto put = [&](const IpAddr &a, bool broadcast) {
        auto *old = by_addr(kept, a);
        if (old && old->second == broadcast)
            return;
        if (auto r = prog_->add_local_address(a, broadcast); !r) {
            if (failed.empty())
                failed = r.error().message;
        } else if (old) {
            old->second = broadcast;
        } else {
            kept.insert(std::upper_bound(kept.begin(), kept.end(), std::make_pair(a, broadcast)),
                        {a, broadcast});
        }
    };
    for (const auto &a : now)
        put(a, false);
    for (const auto &b : brd)
        put(b, true);
    in_map_ = std::move(kept);
    if (!failed.empty() && !local_map_full_)
        log(LogLevel::Warning, "%s; tried again every few seconds", failed.c_str());
    local_map_full_ = !failed.empty();

    local_ = std::move(now);
    broadcasts_ = std::move(brd);
    if (engine_) {
        engine_->set_local(local_);
        engine_->set_broadcast(broadcasts_);
    }
}

// ---- The data path ---------------------------------------------------------------------------

size_t Gateway::poll_data()
{
    size_t before = counters_[size_t(GwCounter::Rx)];
    tun_added_ = 0;
    for (auto &p : ports_)
        rx_one(*p);
    rx_tun();
    // The round brought nothing more for the TUN device, or the first held has waited enough.
    if (ntun_held_ && (!tun_added_ || now_ns() - tun_held_since_ >= kTunHoldNs))
        flush_tun();
    return counters_[size_t(GwCounter::Rx)] - before;
}

// Reassembled ESP from the kernel's raw sockets: copied into frames of our pool, classified
// and decrypted by the engine itself, then sent like the rest.
void Gateway::rx_kernel()
{
    drain();  // engine_->process() below: after the bursts in flight, in order
    Pkt pkts[kBurst];
    Pkt *ready[kBurst];
    uint64_t addrs[kBurst];
    uint32_t got = pool_->alloc(addrs, 16);
    size_t n = 0;
    while (n < got) {
        Pkt &p = pkts[n];
        p = Pkt{umem_->frame(addrs[n]), kFrameSize, 0, 0};
        if (!kernel_esp_.receive(p))
            break;
        ready[n] = &p;
        n++;
    }
    if (n < got)
        pool_->free(addrs + n, got - uint32_t(n));
    count(GwCounter::RxKernelTooBig, kernel_esp_.take_too_big());
    if (!n)
        return;
    count(GwCounter::Rx, n);
    count(GwCounter::RxKernel, n);
    engine_here(ready, nullptr, n);
    // ESP for an SA we do not have: the kernel holds its own copy of it (a raw socket gets a
    // clone), so ours is simply let go; handing it back would loop.
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ready[i]->verdict == Verdict::Pass)
            ports_[0]->x.recycle(*ready[i]);
        else
            ready[k++] = ready[i];
    }
    transmit(*ports_[0], ready, k);
}

// A burst from the port's RX ring: its metadata read (cls), reports and packets whose TTL
// ends here taken care of, the rest in `ready`; returns how many. *big: one of them may have
// to be split before encryption (prefragment()).
size_t Gateway::take_burst(Port &port, Pkt *pkts, Pkt **ready, Classified *cls, bool *big)
{
    size_t n = port.x.rx_burst(pkts, kBurst);
    *big = false;
    if (!n)
        return 0;
    count(GwCounter::Rx, n);
    // The kernel copied these frames in, likely on another CPU: start every frame's misses on
    // the metadata and the headers at once instead of taking them one packet at a time.
    for (size_t i = 0; i < n; i++) {
        const uint8_t *d = pkts[i].frame + pkts[i].l3;
        __builtin_prefetch(d - sizeof(xesp_meta), 1);
        __builtin_prefetch(d + 64, 1);
    }
    Pkt *answers[kBurst];
    size_t k = 0, na = 0;
    const uint32_t split = split_mtu();
    for (size_t i = 0; i < n; i++) {
        auto *m = static_cast<xesp_meta *>(meta(pkts[i], sizeof(xesp_meta)));
        if (!m || !classified_from_meta(m, sizeof(*m), pkts[i], &cls[k])) {
            count(GwCounter::RxNoMeta);
            port.x.recycle(pkts[i]);
            continue;
        }
        m->magic = 0;  // frames are reused
        Classified &c = cls[k];
        if (c.kind == Classified::Report) {
            take_report(port, pkts[i], c);
            continue;
        }
        if (c.kind == Classified::Encap && !port.local && !forward_hop(pkts[i])) {
            count(GwCounter::TtlExceeded);
            if (time_exceeded(pkts[i]))
                answers[na++] = &pkts[i];  // back to the protected side, in the clear
            else
                port.x.recycle(pkts[i]);
            continue;
        }
        *big |= may_split(pkts[i], c, split);
        ready[k++] = &pkts[i];
    }
    if (na)
        transmit(port, answers, na);
    return k;
}

void Gateway::rx_one(Port &port)
{
    if (workers_) {
        rx_pipelined(port);
        return;
    }
    Pkt pkts[kBurst];
    Pkt *ready[kBurst];
    Classified cls[kBurst];
    bool big;
    size_t k = take_burst(port, pkts, ready, cls, &big);
    if (!k)
        return;
    // Classified by an entry that a change has written and not yet published, or published
    // the deletion of and not yet deleted (classifier_sync.h): the engine looks the packet up
    // again in the tables it has, so a change loses no packet.
    const uint64_t reclassified = engine_->stats().reclassified;
    process_here(port, ready, cls, k, big);
    count(GwCounter::Reclassified, engine_->stats().reclassified - reclassified);
}

// A burst through the engine on this thread, split first if it has to be (prefragment()).
void Gateway::process_here(Port &port, Pkt *const *ready, const Classified *cls, size_t k, bool big)
{
    if (!big) {
        engine_here(ready, cls, k);
        transmit(port, ready, k);
        return;
    }
    Pkt pieces[kBurst];
    Pkt *all[kBurst * 2];
    Classified all_cls[kBurst * 2];
    size_t m = prefragment(port, split_mtu(), ready, cls, k, pieces, all, all_cls);
    engine_here(all, all_cls, m);
    transmit(port, all, m);
}

void Gateway::engine_here(Pkt *const *pkts, const Classified *cls, size_t n)
{
    const uint64_t t0 = now_ns();
    if (cls)
        engine_->process_classified(pkts, cls, n);
    else
        engine_->process(pkts, n);
    here_.busy_ns += now_ns() - t0;
    here_.jobs++;
    here_.weight += n;
}

// The burst through the workers: classified and prepared here, its crypto one job, finished
// and sent by reap_jobs() after the bursts taken before it that share an SA with it. A burst that must be split before encryption
// (rare: NAT-T) is not: the bursts in flight are finished first, then it as rx_one() would.
void Gateway::rx_pipelined(Port &port)
{
    BurstJob *j = next_job();
    if (!j)
        return;
    bool big;
    size_t k = take_burst(port, j->pkts, j->ready, j->cls, &big);
    if (k)
        dispatch(port, *j, k, big);
}

// The job the next burst is taken into; nullptr (pipeline-full) while all are in flight.
Gateway::BurstJob *Gateway::next_job()
{
    reap_jobs();
    if (free_jobs_.empty()) {
        count(GwCounter::PipelineFull);
        return nullptr;
    }
    return free_jobs_.back();
}

// A burst of k packets taken into j: to the workers, or, if it must be split first, on this
// thread after the bursts in flight.
void Gateway::dispatch(Port &port, BurstJob &j, size_t k, bool big)
{
    if (!big) {
        submit(port, j, k);
        return;
    }
    const uint64_t reclassified = engine_->stats().reclassified;
    drain();
    process_here(port, j.ready, j.cls, k, true);
    count(GwCounter::Reclassified, engine_->stats().reclassified - reclassified);
}

// The burst of k packets in j (the last of free_jobs_) prepared here and handed to the
// workers.
void Gateway::submit(Port &port, BurstJob &j, size_t k)
{
    const uint64_t reclassified = engine_->stats().reclassified;
    free_jobs_.pop_back();
    // Refused while bursts begun with tables that a change has replaced are in flight: they
    // end first.
    while (!engine_->begin_classified(j.ready, j.cls, k, j.b))
        drain();
    j.port = &port;
    j.n = k;
    j.run = run_job;
    static_assert(Job::kMaxKeys >= kMaxBurst);
    j.nkeys = uint32_t(j.b.sa_keys(j.keys));
    j.weight = uint32_t(k);
    while (!workers_->submit(j))  // not while jobs_ are few enough (create())
        reap_jobs();
    count(GwCounter::Reclassified, engine_->stats().reclassified - reclassified);
}

void Gateway::run_job(Job &j)
{
    Engine::crypt(static_cast<BurstJob &>(j).b);
}

void Gateway::finish_job(Job &j)
{
    auto &b = static_cast<BurstJob &>(j);
    engine_->end(b.b);
    transmit(*b.port, b.ready, b.n);
    free_jobs_.push_back(&b);
}

size_t Gateway::reap_jobs()
{
    return workers_ ? workers_->reap([this](Job &j) { finish_job(j); }) : 0;
}

void Gateway::drain()
{
    flush_tun();  // what finished before: not kept waiting for the workers
    for (unsigned idle = 0; in_flight();) {
        if (reap_jobs()) {
            idle = 0;
        } else if (++idle % 1024 == 0) {
            std::this_thread::yield();  // a worker may share this CPU
        } else {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
    }
    flush_tun();
}

// Whether prefragment() has to look at p: plaintext to encrypt, IPv4 without DF, and long
// enough that some SA might not fit it within mtu (split_mtu()). Headers only, no lookup.
bool Gateway::may_split(const Pkt &p, const Classified &c, uint32_t mtu)
{
    return (c.kind == Classified::Encap || c.kind == Classified::Plain) &&
           p.len + kMaxEncapOverhead > mtu && wire::ip_version(p.ip()) == 4 && may_fragment(p);
}

// ESP in UDP (NAT-T) that the outer header would fragment cannot be put together again by the
// far gateway: its kernel reassembles it for a UDP socket, not for the gateway. So an IPv4
// packet for a NAT-T SA that may be fragmented (no DF) and would not fit once encrypted is
// split before encryption (RFC 4301 8.1), each piece encrypted on its own, and the final
// destination reassembles. The pieces take the packet's place in the burst: the SA's order
// holds. `split` is split_mtu() for this burst. `out` and `out_cls` have room for twice
// kBurst, `pieces` for kBurst.
size_t Gateway::prefragment(Port &port, uint32_t split, Pkt *const *in, const Classified *in_cls,
                            size_t n, Pkt *pieces, Pkt **out, Classified *out_cls)
{
    size_t m = 0, used = 0;
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *in[i];
        uint32_t mtu = 0;
        if (may_split(p, in_cls[i], split))
            mtu = engine_->natt_inner_mtu(in_cls[i], p);
        uint32_t need = mtu && p.len > mtu ? fragments_needed(p.ip(), p.len, mtu) : 1;
        if (!need)
            need = 1;  // cannot be split: the engine answers or drops it
        Classified c = in_cls[i];
        if (need > 1) {
            if (c.kind == Classified::Plain)  // tun mode: the pieces take p's ports
                c = plain_fragments(p.ip(), p.len);
            uint64_t addrs[kBurst];
            uint32_t got = used + need - 1 <= kBurst ? pool_->alloc(addrs, need - 1) : 0;
            for (uint32_t f = 0; f < got; f++)
                pieces[used + f] = Pkt{umem_->frame(addrs[f]), kFrameSize, 0, 0};
            if (got != need - 1 || fragment(p, mtu, 0, pieces + used, got) != need) {
                pool_->free(addrs, got);
                count(GwCounter::NoFrames);
                port.x.recycle(p);
                continue;
            }
            count(GwCounter::Prefragmented);
        }
        out[m] = &p;
        out_cls[m++] = c;
        for (uint32_t f = 0; f + 1 < need; f++) {
            out[m] = &pieces[used + f];
            out_cls[m++] = c;
        }
        used += need - 1;
    }
    return m;
}

void Gateway::settle()
{
    reap_jobs();
    for (auto &p : ports_)
        p->x.complete();
    if (hops_->pending())
        hops_->poll(false);  // misses of the last bursts: not a millisecond through the kernel
    flush_tun();
}

// Housekeeping's sockets into pf (kServiceFds at most), each with its bit in bits: kHopsFd
// the routing events, kEspFd a reassembled-ESP socket (only with a port: only then are they
// read), kPmtuFd an ICMP listener (-1 when not open: poll() passes over it). Returns how many.
size_t Gateway::service_fds(pollfd *pf, unsigned *bits) const
{
    size_t n = 0;
    auto add = [&](int fd, unsigned bit) {
        bits[n] = bit;
        pf[n++] = {fd, POLLIN, 0};
    };
    add(hops_->event_fd(), kHopsFd);
    for (int i = 0; kernel_esp_ok_ && !ports_.empty() && i < KernelEspInput::kSockets; i++)
        add(kernel_esp_.fds()[i], kEspFd);
    for (int i = 0; pmtu_ok_ && i < PmtuListener::kSockets; i++)
        add(pmtu_.fds()[i], kPmtuFd);
    return n;
}

// Which of housekeeping's sockets have something, by one poll(); all when it cannot tell.
unsigned Gateway::service_ready() const
{
    pollfd pf[kServiceFds];
    unsigned bits[kServiceFds];
    size_t n = service_fds(pf, bits);
    if (::poll(pf, n, 0) < 0)
        return kHopsFd | kEspFd | kPmtuFd;
    unsigned ready = 0;
    for (size_t i = 0; i < n; i++)
        if (pf[i].revents)
            ready |= bits[i];
    return ready;
}

void Gateway::housekeeping()
{
    settle();
    // Routing events, reassembled ESP and ICMP errors are rare: one look at their sockets,
    // and a read only of those that have something (else up to seven system calls for
    // nothing, a thousand times a second, while the ports are busy).
    const unsigned ready = service_ready();
    if (ready & kEspFd)
        rx_kernel();
    hops_->poll(ready & kHopsFd);
    uint64_t now = now_ns();
    bool urgent = false;
    if (hops_->take_link_change(&urgent)) {
        macs_due_ = true;
        if (urgent)  // an interface's device left, or one of an absent one's name came
            macs_at_ns_ = std::min(macs_at_ns_, macs_look_ns_ + kUrgentGapNs);
    }
    // An address came or went: the local addresses soon, not at the next round (50 ms at
    // least between two reads, whatever the rate of events); the broadcast routes changed,
    // or may have: those too (kBrdGapNs at least between two reads).
    if (hops_->take_addr_change())
        addrs_due_ = true;
    if (hops_->take_broadcast_change())
        brd_due_ = true;
    const bool brd_now = brd_due_ && now >= brd_at_ns_;
    const bool addrs_now = brd_now || (addrs_due_ && now - last_refresh_ns_ >= kAddrGapNs) ||
                           now - last_refresh_ns_ > kRefreshNs;
    if (macs_due_ && now >= macs_at_ns_)
        refresh_macs(now);
    // A bounded number per round: a flood of ICMP must not hold up the data path.
    PmtuReport report;
    for (int i = 0; i < 64 && (ready & kPmtuFd) && pmtu_.receive(&report); i++)
        learn_pmtu(report, now);
    // SA time limits: a share of the SAs each round, all of them in a second.
    engine_->check_time_some(now);
    if (now - last_second_ns_ >= kSecondNs) {  // learnt path MTUs age
        last_second_ns_ = now;
        age_pmtu(now);
        // What the local link dropped, read while it is here: if it goes, what it had is kept
        // (LocalLink::tx_dropped()).
        (void)local_link_.tx_dropped();
    }
    if (addrs_now) {
        addrs_due_ = false;
        last_refresh_ns_ = now;
        if (brd_now) {
            brd_due_ = false;
            brd_at_ns_ = now + kBrdGapNs;
        }
        refresh_local_addresses(brd_now);
    }
}

void Gateway::wait_fds(std::vector<pollfd> *pfds)
{
    pfds->clear();
    if (tun_)
        pfds->push_back({tun_->fd(), POLLIN, 0});
    for (const auto &p : ports_)
        pfds->push_back({p->x.fd(), POLLIN, 0});
    wait_service_ = pfds->size();
    pollfd pf[kServiceFds];
    unsigned bits[kServiceFds];
    pfds->insert(pfds->end(), pf, pf + service_fds(pf, bits));
    wait_end_ = pfds->size();
}

void Gateway::woke(const std::vector<pollfd> &pfds)
{
    if (pfds.size() < wait_end_)
        return;
    if (tun_)
        tun_idle_ = pfds[0].revents ? 0 : kTunIdleRounds;
    for (size_t i = wait_service_; i < wait_end_; i++) {
        if (pfds[i].revents) {
            housekeeping();
            return;
        }
    }
}

}  // namespace xesp
