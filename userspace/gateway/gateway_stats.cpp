// What the gateway reports: `xesp stats` (engine, per SA, gateway, XDP and socket counters).
#include "userspace/gateway/gateway.h"
#include "userspace/report.h"

namespace xesp {

nlohmann::json Gateway::stats_json() const
{
    using nlohmann::json;
    EngineStats total = retired_;
    total += engine_->stats();
    EngineOptions eo = engine_options();
    json j = engine_json(*engine_, total, eo.link_mtu);
    json gw = json::object();
    for (size_t i = 0; i < kGwCounterNames.size(); i++)
        gw[std::string(kGwCounterNames[i])] = counters_[i];
    j["gateway"] = gw;
    json xdp = json::object();
    if (auto c = prog_->counters())
        for (size_t i = 0; i < kXdpCounterCount; i++)
            xdp[std::string(kXdpCounterNames[i])] = c->v[i];
    j["xdp"] = xdp;
    json ifs = json::array();
    for (const auto &i : ifaces_) {
        const char *role = i.role == IfaceRole::Public ? "public" : "protected";
        ifs.push_back({{"name", i.name},
                       {"role", i.local ? "local" : role},
                       {"ifindex", i.ifindex},
                       {"queues", i.queues},
                       {"mtu", i.mtu}});
        if (!i.warning.empty())
            ifs.back()["warning"] = i.warning;
    }
    j["ifaces"] = ifs;
    j["link_mtu"] = eo.link_mtu;
    // The sockets, summed: what the kernel could not hand us counts as lost here.
    XskStats sum;
    for (const auto &p : ports_) {
        auto st = p->x.stats();
        if (!st)
            continue;
        sum.rx += st->rx;
        sum.tx += st->tx;
        sum.tx_ring_full += st->tx_ring_full;
        sum.tx_bad += st->tx_bad;
        sum.fill_short += st->fill_short;
        sum.rx_dropped += st->rx_dropped;
        sum.rx_ring_full += st->rx_ring_full;
        sum.rx_fill_ring_empty += st->rx_fill_ring_empty;
        sum.rx_invalid_descs += st->rx_invalid_descs;
        sum.tx_invalid_descs += st->tx_invalid_descs;
    }
    j["xsk"] = {{"rx", sum.rx},
                {"tx", sum.tx},
                {"drop-rx-ring-full", sum.rx_ring_full},
                {"drop-rx-other", sum.rx_dropped},
                {"rx-fill-ring-empty", sum.rx_fill_ring_empty},
                {"tx-ring-full", sum.tx_ring_full},
                {"drop-tx-bad", sum.tx_bad},
                {"fill-short", sum.fill_short},
                {"rx-invalid-descs", sum.rx_invalid_descs},
                {"tx-invalid-descs", sum.tx_invalid_descs}};
    return j;
}

} // namespace xesp
