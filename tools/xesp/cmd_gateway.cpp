// `xesp iface add|del|list` and `xesp stats`: the running daemon's interfaces and counters,
// over its control socket.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tools/xesp/commands.h"
#include "userspace/control/control.h"

namespace xesp::cli {

namespace {

using nlohmann::json;

ControlClient connect_daemon(const std::string &socket)
{
    auto c = ControlClient::connect(socket);
    if (!c)
        throw Failure(c.error().message + " (is `xesp daemon` running in this network "
                                          "namespace? its socket is set with --socket or "
                                          "$XESP_SOCKET)");
    return std::move(*c);
}

std::string answered(Result<ControlResponse> r)
{
    if (!r)
        throw Failure(r.error().message);
    if (!r->ok)
        throw Failure(r->error);
    return r->output;
}

uint64_t num(const json &j, const char *key)
{
    auto it = j.find(key);
    return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

// "1234" or, with a previous sample, "1234 (56/s)".
std::string with_rate(uint64_t now, const json *prev_obj, const char *key, double secs)
{
    std::string s = std::to_string(now);
    if (prev_obj && secs > 0) {
        uint64_t before = num(*prev_obj, key);
        if (now >= before) {
            char r[48];
            std::snprintf(r, sizeof(r), " (%.0f/s)", double(now - before) / secs);
            s += r;
        }
    }
    return s;
}

// `iface list -j`: the interfaces of `xesp stats -j` the operator added (not the local link),
// each {name, role, mode, ifindex, queues, mtu, macs[, warning][, absent[, failed_ifindex]]
// [, renamed: [{name, ifindex}]]}.
json iface_list_json(const json &stats)
{
    json out = json::array();
    for (const auto &i : stats.value("ifaces", json::array()))
        if (i.value("role", "") != "local")
            out.push_back(i);
    return out;
}

const json *find_sa(const json *prev, const json &sa)
{
    if (!prev || !prev->contains("sas"))
        return nullptr;
    for (const auto &p : (*prev)["sas"])
        if (p.value("spi", 0u) == sa.value("spi", 0u) && p.value("dst", "") == sa.value("dst", ""))
            return &p;
    return nullptr;
}

void print_counters(const char *title, const json &obj, const json *prev, double secs,
                    bool nonzero_only)
{
    std::printf("%s\n", title);
    for (auto it = obj.begin(); it != obj.end(); ++it) {
        if (!it->is_number_unsigned() || (nonzero_only && it->get<uint64_t>() == 0))
            continue;
        const json *p = prev ? &*prev : nullptr;
        std::printf("  %-28s %s\n", it.key().c_str(),
                    with_rate(it->get<uint64_t>(), p, it.key().c_str(), secs).c_str());
    }
}

// Each worker's load: the share of the time its ESP work took (busy_ns, gateway_stats.cpp),
// since the previous sample (--watch) or since the daemon started.
void print_workers(const json &s, const json *prev)
{
    if (!s.contains("workers"))
        return;
    const json &ws = s["workers"];
    uint64_t up = s.value("uptime_ns", uint64_t(0));
    const uint64_t up0_prev = prev ? prev->value("uptime_ns", uint64_t(0)) : 0;
    std::printf("workers: %zu\n", ws.size());
    for (size_t i = 0; i < ws.size(); i++) {
        const json &w = ws[i];
        uint64_t up0 = up0_prev;
        const json *p = prev && prev->contains("workers") && i < (*prev)["workers"].size()
                            ? &(*prev)["workers"][i]
                            : nullptr;
        uint64_t busy = w.value("busy_ns", uint64_t(0));
        uint64_t busy0 = p ? p->value("busy_ns", uint64_t(0)) : 0;
        if (busy < busy0 || up < up0)  // another daemon since: from its start
            busy0 = up0 = 0;
        double load = up > up0 ? 100.0 * double(busy - busy0) / double(up - up0) : 0;
        int cpu = w.value("cpu", -1);
        std::string where = cpu >= 0 ? ", CPU " + std::to_string(cpu) : "";
        std::printf("  worker %zu%s%s: ESP load %.1f%%  jobs %llu  packets %llu  queue full "
                    "%llu\n",
                    i, i == 0 ? " (data thread)" : "", where.c_str(), load,
                    (unsigned long long)w.value("jobs", uint64_t(0)),
                    (unsigned long long)w.value("packets", uint64_t(0)),
                    (unsigned long long)w.value("queue_full", uint64_t(0)));
    }
}

void print_stats(const json &s, const json *prev, double secs)
{
    std::printf("interfaces:");
    for (const auto &i : s["ifaces"])
        if (i.value("absent", false))
            std::printf("  %s (%s, %s mode, absent)", i.value("name", "").c_str(),
                        i.value("role", "").c_str(), i.value("mode", "xdp").c_str());
        else
            std::printf("  %s (%s, %s mode, %u queues, MTU %u)", i.value("name", "").c_str(),
                        i.value("role", "").c_str(), i.value("mode", "xdp").c_str(),
                        i.value("queues", 0u), i.value("mtu", 0u));
    std::printf("%s\n", s["ifaces"].empty() ? "  none (xesp iface add DEV role ...)" : "");
    std::printf("engine: encrypted %s  decrypted %s  dropped %s  too-big %s\n",
                with_rate(num(s, "encrypted"), prev, "encrypted", secs).c_str(),
                with_rate(num(s, "decrypted"), prev, "decrypted", secs).c_str(),
                with_rate(num(s, "dropped"), prev, "dropped", secs).c_str(),
                with_rate(num(s, "too_big"), prev, "too_big", secs).c_str());
    std::printf("SAs:\n");
    for (const auto &sa : s["sas"]) {
        const json *p = find_sa(prev, sa);
        uint32_t path_mtu = sa.value("path_mtu", 0u);
        std::string learnt =
            path_mtu ? " (path MTU " + std::to_string(path_mtu) + " from ICMP)" : "";
        std::string life;
        bool hard = sa.value("hard_expired", false);
        if (hard)
            life = "  hard lifetime reached: no traffic";
        else if (sa.value("soft_expired", false))
            life = "  soft lifetime reached";
        if (!hard && sa.contains("hard_lifetime_s"))
            life += "  hard lifetime in " +
                    std::to_string(sa.value("hard_lifetime_s", uint64_t(0))) + " s";
        std::printf("  esp spi 0x%08x %s -> %s %s %s  tunnel MTU %u%s%s\n"
                    "    packets %s  bytes %s\n",
                    sa.value("spi", 0u), sa.value("src", "").c_str(), sa.value("dst", "").c_str(),
                    sa.value("mode", "").c_str(), sa.value("transform", "").c_str(),
                    sa.value("tunnel_mtu", 0u), learnt.c_str(), life.c_str(),
                    with_rate(num(sa, "packets"), p, "packets", secs).c_str(),
                    with_rate(num(sa, "bytes"), p, "bytes", secs).c_str());
        for (auto d = sa["drops"].begin(); d != sa["drops"].end(); ++d)
            std::printf(
                "    drop %-24s %s\n", d.key().c_str(),
                with_rate(d->get<uint64_t>(), p ? &(*p)["drops"] : nullptr, d.key().c_str(), secs)
                    .c_str());
    }
    print_counters("drops (engine, all SAs):", s["drops"], prev ? &(*prev)["drops"] : nullptr, secs,
                   true);
    print_counters("gateway:", s["gateway"], prev ? &(*prev)["gateway"] : nullptr, secs, true);
    print_counters("xdp:", s["xdp"], prev ? &(*prev)["xdp"] : nullptr, secs, true);
    if (s.contains("xsk"))
        print_counters("af_xdp sockets:", s["xsk"], prev ? &(*prev)["xsk"] : nullptr, secs, true);
    print_workers(s, prev);
}

struct StatsOptions {
    std::string socket = default_socket();
    bool json_out = false;
    double watch = 0;
    int count = 0;
};

void run_stats(const StatsOptions &o)
{
    ControlClient c = connect_daemon(o.socket);
    json prev;
    bool have_prev = false;
    for (int n = 0;; n++) {
        json s = json::parse(answered(c.stats()), nullptr, false);
        if (s.is_discarded() || !s.is_object())
            throw Failure("stats: the daemon answered something that is not a JSON object");
        if (o.json_out) {
            std::cout << s.dump() << "\n";
        } else {
            if (o.watch > 0 && isatty(1))
                std::printf("\033[H\033[2J");
            print_stats(s, have_prev ? &prev : nullptr, o.watch);
            if (o.watch > 0)
                std::printf("\n");
        }
        std::cout.flush();
        std::fflush(stdout);
        if (o.watch <= 0 || (o.count && n + 1 >= o.count))
            break;
        prev = std::move(s);
        have_prev = true;
        std::this_thread::sleep_for(std::chrono::duration<double>(o.watch));
    }
}

}  // namespace

void register_gateway_commands(CLI::App &app)
{
    auto socket = std::make_shared<std::string>(default_socket());
    auto *iface = app.add_subcommand("iface", "attach the gateway to interfaces: add, del, list");
    iface->add_option("--socket", *socket, "the daemon's control socket");
    auto words = std::make_shared<std::vector<std::string>>();
    iface
        ->add_option("words", *words,
                     "add DEV role protected|public [mode xdp|tun] | del DEV | list (add "
                     "again with the other mode: a protected interface changes mode in place)")
        ->required();
    auto iface_json = std::make_shared<bool>(false);
    iface->add_flag("-j,--json", *iface_json, "list: a JSON array, one object per interface");
    iface->callback([socket, words, iface_json] {
        ControlClient c = connect_daemon(*socket);
        if (*iface_json && *words == std::vector<std::string>{"list"}) {
            std::cout << iface_list_json(json::parse(answered(c.stats()))).dump() << "\n";
            return;
        }
        std::cout << answered(c.iface(*words));
    });

    auto so = std::make_shared<StatsOptions>();
    auto *stats = app.add_subcommand("stats", "the running daemon's counters, per SA and reason");
    stats->add_option("--socket", so->socket, "the daemon's control socket");
    stats->add_flag("-j,--json", so->json_out, "one JSON object (one per line with --watch)");
    stats->add_option("--watch", so->watch, "print again every SECONDS, with rates")
        ->expected(0, 1)
        ->default_str("1");
    stats->add_option("--count", so->count, "with --watch: stop after N samples");
    stats->callback([so, stats] {
        if (stats->count("--watch") && so->watch <= 0)
            so->watch = 1;
        run_stats(*so);
    });
}

}  // namespace xesp::cli
