#include "userspace/control/report.h"

#include <cstdio>

#include "userspace/base/clock.h"

namespace xesp {

std::string sa_label(const SaConfig &c)
{
    char spi[16];
    std::snprintf(spi, sizeof(spi), "0x%08x", c.spi);
    return std::string("esp spi ") + spi + " " + c.src.str() + " -> " + c.dst.str() +
           (c.mode == Mode::Tunnel ? " tunnel" : " transport");
}

nlohmann::json counters_json(const Counters &c, bool all_drops)
{
    nlohmann::json drops = nlohmann::json::object();
    for (size_t i = 0; i < kDropCount; i++)
        if (all_drops || c.drops[i])
            drops[std::string(kDropNames[i])] = c.drops[i];
    return {{"packets", c.packets}, {"bytes", c.bytes}, {"drops", drops}};
}

nlohmann::json engine_json(const Engine &e)
{
    return engine_json(sample_engine(e, e.stats(), 0));
}

EngineSample sample_engine(const Engine &e, const EngineStats &totals, uint32_t link_mtu)
{
    EngineSample out;
    out.totals = totals;
    out.link_mtu = link_mtu ? link_mtu : 1500;
    const uint64_t now = now_ns();
    out.sas.reserve(e.sas().all().size());
    for (const auto &sa : e.sas().all()) {
        if (!sa)
            continue;  // an id not in use
        SaSample &s = out.sas.emplace_back();
        s.sa = sa;
        s.counters = sa->counters();
        s.oseq = sa->oseq();
        s.bound = sa->reservation_bound();
        s.reserved = sa->reserved();
        s.replay_top = sa->replay().highest();
        s.soft_expired = sa->soft_expired();
        s.hard_expired = sa->hard_expired();
        if (sa->config().lifetime.has_time()) {
            s.soft_left = sa->seconds_left(now, false);
            s.hard_left = sa->seconds_left(now, true);
        }
        s.path_mtu = sa->path_mtu();
        s.tunnel_mtu = sa->inner_mtu(sa->outer_mtu(out.link_mtu));
    }
    return out;
}

nlohmann::json engine_json(const EngineSample &es)
{
    const EngineStats &s = es.totals;
    nlohmann::json j = {{"encrypted", s.encrypted},
                        {"decrypted", s.decrypted},
                        {"passed", s.passed},
                        {"dropped", s.dropped},
                        {"too_big", s.too_big},
                        {"esp_unknown_spi", s.esp_unknown_spi},
                        {"ike", s.ike},
                        {"keepalive", s.keepalive}};
    j["drops"] = counters_json(s.drops, true)["drops"];
    nlohmann::json xfrm = nlohmann::json::object();
    for (size_t i = 0; i < kDropCount; i++) {
        std::string k(kDropXfrmClass[i]);
        xfrm[k] = xfrm.value(k, uint64_t(0)) + s.drops.drops[i];
    }
    j["xfrm_stat"] = xfrm;
    nlohmann::json sas = nlohmann::json::array();
    for (const SaSample &ss : es.sas) {
        const SaConfig &c = ss.sa->config();
        nlohmann::json js = counters_json(ss.counters, false);
        js["spi"] = c.spi;
        js["src"] = c.src.str();
        js["dst"] = c.dst.str();
        js["mode"] = c.mode == Mode::Tunnel ? "tunnel" : "transport";
        js["transform"] = c.xf.name();
        js["crypto"] = std::string(backend_name(ss.sa->backend()));
        js["oseq"] = ss.oseq;
        if (ss.bound)  // the last number the state file lets it send
            js["oseq_reserved"] = ss.reserved;
        js["replay_top"] = ss.replay_top;
        js["soft_expired"] = ss.soft_expired;
        js["hard_expired"] = ss.hard_expired;
        if (ss.soft_left != UINT64_MAX)  // seconds to the time limits that are running
            js["soft_lifetime_s"] = ss.soft_left;
        if (ss.hard_left != UINT64_MAX)
            js["hard_lifetime_s"] = ss.hard_left;
        js["link_mtu"] = es.link_mtu;
        js["path_mtu"] = ss.path_mtu;  // 0: none learnt
        js["tunnel_mtu"] = ss.tunnel_mtu;
        sas.push_back(js);
    }
    j["sas"] = sas;
    return j;
}

std::string engine_text(const Engine &e)
{
    const EngineStats &s = e.stats();
    std::string out;
    char line[256];
    std::snprintf(line, sizeof(line), "encrypted %llu  decrypted %llu  passed %llu  dropped %llu\n",
                  (unsigned long long)s.encrypted, (unsigned long long)s.decrypted,
                  (unsigned long long)s.passed, (unsigned long long)s.dropped);
    out += line;
    for (size_t i = 0; i < kDropCount; i++) {
        if (!s.drops.drops[i])
            continue;
        std::snprintf(line, sizeof(line), "  drop %-22s %10llu  (%s)\n", kDropNames[i].data(),
                      (unsigned long long)s.drops.drops[i], kDropXfrmClass[i].data());
        out += line;
    }
    for (const auto &sa : e.sas().all()) {
        if (!sa)
            continue;
        const Counters &c = sa->counters();
        std::snprintf(line, sizeof(line), "%s  [%s, %s]  packets %llu bytes %llu\n",
                      sa_label(sa->config()).c_str(), sa->config().xf.name().c_str(),
                      backend_name(sa->backend()).data(), (unsigned long long)c.packets,
                      (unsigned long long)c.bytes);
        out += line;
        for (size_t i = 0; i < kDropCount; i++)
            if (c.drops[i]) {
                std::snprintf(line, sizeof(line), "    drop %-20s %10llu\n", kDropNames[i].data(),
                              (unsigned long long)c.drops[i]);
                out += line;
            }
    }
    return out;
}

}  // namespace xesp
