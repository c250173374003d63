// What the gateway reports: `xesp stats` (engine, per SA, gateway, XDP and socket counters).
#include "userspace/gateway/gateway.h"

#include "userspace/control/report.h"

namespace xesp {

Gateway::Stats Gateway::stats_sample() const
{
    Stats s;
    EngineStats total = engine_->stats();
    s.link_mtu = link_mtu();
    s.engine = sample_engine(*engine_, total, s.link_mtu);
    s.counters = counters_;
    s.ifaces = ifaces_;
    s.renamed = renamed_;
    // The sockets, summed: what the kernel could not hand us counts as lost here.
    for (const auto &p : ports_) {
        auto st = p->x.stats();
        if (!st)
            continue;
        s.xsk.rx += st->rx;
        s.xsk.tx += st->tx;
        s.xsk.tx_ring_full += st->tx_ring_full;
        s.xsk.tx_bad += st->tx_bad;
        s.xsk.fill_short += st->fill_short;
        s.xsk.rx_dropped += st->rx_dropped;
        s.xsk.rx_ring_full += st->rx_ring_full;
        s.xsk.rx_fill_ring_empty += st->rx_fill_ring_empty;
        s.xsk.rx_invalid_descs += st->rx_invalid_descs;
        s.xsk.tx_invalid_descs += st->tx_invalid_descs;
    }
    for (unsigned w = 0; w < (workers_ ? workers_->workers() : 1); w++)
        s.workers.push_back(workers_ ? workers_->stats(w) : PoolStats{});
    // The data thread's: the crypto of the bursts it kept, and the bursts it ran whole (all of
    // them without workers).
    s.workers[0].jobs += here_.jobs;
    s.workers[0].weight += here_.weight;
    s.workers[0].busy_ns += here_.busy_ns;
    // Tun mode: what the kernel dropped at the TUN devices because their queue was full, the
    // ones closed and the one open now.
    s.tun_queue_drops = tun_queue_drops_ + tun_queue_drops();
    // What the local link's veth dropped: a full ring (the daemon fell behind tun mode's UDP
    // or the gateway's own traffic), a frame too big for its far end; the pairs made before it
    // included.
    s.local_link_drops = local_link_drops_ + local_link_.tx_dropped();
    s.cpus = options_.cpus;
    s.uptime_ns = now_ns() - started_ns_;
    return s;
}

nlohmann::json Gateway::stats_json(const Stats &s) const
{
    using nlohmann::json;
    json j = engine_json(s.engine);
    json gw = json::object();
    for (size_t i = 0; i < kGwCounterNames.size(); i++)
        gw[std::string(kGwCounterNames[i])] = s.counters[i];
    if (s.tun_queue_drops)
        gw["drop-tun-queue-full"] = s.tun_queue_drops;
    gw["drop-local-link"] = s.local_link_drops;
    j["gateway"] = gw;
    json xdp = json::object();
    if (auto c = prog_->counters())
        for (size_t i = 0; i < kXdpCounterCount; i++)
            xdp[std::string(kXdpCounterNames[i])] = c->v[i];
    j["xdp"] = xdp;
    json ifs = json::array();
    for (const auto &i : s.ifaces) {
        ifs.push_back({{"name", i.name},
                       {"role", i.local ? "local" : iface_role_name(i.role)},
                       {"mode", iface_mode_name(i.mode)},
                       {"ifindex", i.ifindex},
                       {"queues", i.queues},
                       {"mtu", i.mtu}});
        json macs = json::array();
        for (const auto &m : i.macs)
            macs.push_back(rtnl::mac_str(m));
        ifs.back()["macs"] = macs;
        if (!i.warning.empty())
            ifs.back()["warning"] = i.warning;
        if (i.absent)
            ifs.back()["absent"] = true;
        if (i.tried)  // a device of its name it could not be attached to
            ifs.back()["failed_ifindex"] = i.tried;
        json renamed = json::array();  // devices it was, renamed, with our program on them
        for (const auto &r : s.renamed)
            if (r.was == i.name)
                renamed.push_back({{"name", r.name}, {"ifindex", r.ifindex}});
        if (!renamed.empty())
            ifs.back()["renamed"] = renamed;
    }
    j["ifaces"] = ifs;
    j["link_mtu"] = s.link_mtu;
    const XskStats &x = s.xsk;
    j["xsk"] = {{"rx", x.rx},
                {"tx", x.tx},
                {"drop-rx-ring-full", x.rx_ring_full},
                {"drop-rx-other", x.rx_dropped},
                {"rx-fill-ring-empty", x.rx_fill_ring_empty},
                {"tx-ring-full", x.tx_ring_full},
                {"drop-tx-bad", x.tx_bad},
                {"fill-short", x.fill_short},
                {"rx-invalid-descs", x.rx_invalid_descs},
                {"tx-invalid-descs", x.tx_invalid_descs}};
    // Each worker's ESP work: busy_ns is the time its crypto took, and for worker 0, the data
    // thread, also the whole of the bursts it ran itself (all of them without workers; its I/O
    // and the serial steps of the bursts it hands out are not counted); how often its queue
    // was full and a burst went elsewhere.
    json ws = json::array();
    for (size_t w = 0; w < s.workers.size(); w++) {
        const PoolStats &p = s.workers[w];
        ws.push_back({{"worker", w},
                      {"cpu", s.cpus.empty() ? -1 : s.cpus[w % s.cpus.size()]},
                      {"jobs", p.jobs},
                      {"packets", p.weight},
                      {"busy_ns", p.busy_ns},
                      {"queue_full", p.passed}});
    }
    j["workers"] = ws;
    j["uptime_ns"] = s.uptime_ns;
    return j;
}

}  // namespace xesp
