// xesp-gen: the traffic generator and counter of tools/xesp-bench.
//
//   xesp-gen tx --dev hosta0 --src 10.1.0.2 --dst 10.2.0.2 --size 64 --seconds 5 [--flows 8]
//   xesp-gen rx --dev hostb0 --seconds 15 [--json]
//
// Run each in the namespace of its interface. rx first: it prints "attached" on stderr once it
// counts. The rate that matters is rx's: what made it through everything in between.
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <optional>
#include <string>

#include "tools/gen/frame.h"
#include "tools/gen/gen_abi.h"
#include "tools/gen/rx.h"
#include "tools/gen/tx.h"

using namespace xesp;
using namespace xesp::gen;

namespace {

std::atomic<bool> g_stop{false};
volatile sig_atomic_t g_signal = 0;

void on_signal(int sig)
{
    g_signal = sig;
    g_stop = true;
}

// A run cut short by SIGINT or SIGTERM still reports, then dies of that signal, so that a
// calling shell sees the interruption (bash ignores a Ctrl-C its child seemed to handle).
int finish(int rc)
{
    if (int sig = g_signal) {
        std::fflush(stdout);
        signal(sig, SIG_DFL);
        raise(sig);
    }
    return rc;
}

void catch_signals()
{
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
}

// Frames and bits per second; bits count each frame with its 4-byte FCS.
double mpps(uint64_t packets, double s)
{
    return s > 0 ? double(packets) / s / 1e6 : 0;
}
double gbps(uint64_t frame_bytes, double s)
{
    return s > 0 ? double(frame_bytes) * 8 / s / 1e9 : 0;
}

int fail(const std::string &cmd, const Error &e)
{
    std::fprintf(stderr, "xesp-gen %s: %s\n", cmd.c_str(), e.message.c_str());
    return 1;
}

struct TxArgs {
    std::string dev, src, dst, method = "auto";
    std::optional<std::string> dst_mac;
    uint32_t size = 64, flows = 8, pairs = 1, pair_step = 256;
    double seconds = 5, mpps = 0;
    bool json = false;
};

int tx_main(const TxArgs &a)
{
    auto ep = resolve_endpoints(a.dev, a.src, a.dst, a.dst_mac);
    if (!ep)
        return fail("tx", ep.error());
    TxOptions o;
    o.ep = *ep;
    o.size = a.size;
    o.flows = a.flows;
    o.pairs = a.pairs;
    o.pair_step = a.pair_step;
    o.seconds = a.seconds;
    o.rate = a.mpps * 1e6;
    o.method = a.method == "packet" ? TxMethod::Packet : TxMethod::Xsk;
    auto r = run_tx(o, g_stop);
    if (!r)
        return fail("tx", r.error());
    uint64_t bytes = r->sent * a.size;
    if (a.json) {
        std::printf(
            "{\"dev\": \"%s\", \"method\": \"%s\", \"size\": %u, \"flows\": %u, "
            "\"pairs\": %u, \"queues\": %u, \"sent\": %llu, \"refused\": %llu, \"seconds\": %.3f, "
            "\"mpps\": %.4f, \"gbps\": %.4f}\n",
            a.dev.c_str(), tx_method_name(o.method), a.size, a.flows, a.pairs, r->queues,
            static_cast<unsigned long long>(r->sent), static_cast<unsigned long long>(r->refused),
            r->seconds, mpps(r->sent, r->seconds), gbps(bytes, r->seconds));
        return 0;
    }
    std::printf("xesp-gen tx: %s -> %s via %s (%s), %u B frames, %u flows, %s on %u queue(s): "
                "sent %llu in %.2f s: %.3f Mpps, %.3f Gbps (%llu refused)\n",
                a.dev.c_str(), a.dst.c_str(), mac_string(ep->dst_mac).c_str(), a.src.c_str(),
                a.size, a.flows, tx_method_name(o.method), r->queues,
                static_cast<unsigned long long>(r->sent), r->seconds, mpps(r->sent, r->seconds),
                gbps(bytes, r->seconds), static_cast<unsigned long long>(r->refused));
    return 0;
}

struct RxArgs {
    std::string dev;
    double seconds = 10, idle = 1;
    bool json = false;
};

int rx_main(const RxArgs &a)
{
    auto r = run_rx({a.dev, a.seconds, a.idle}, g_stop, [&] {
        std::fprintf(stderr, "xesp-gen rx: attached to %s, counting UDP port %d\n", a.dev.c_str(),
                     GEN_UDP_PORT);
        std::fflush(stderr);
    });
    if (!r)
        return fail("rx", r.error());
    uint64_t frame_bytes = r->bytes + r->packets * kFcsBytes;
    double s = r->active_seconds;
    if (a.json) {
        std::printf("{\"dev\": \"%s\", \"received\": %llu, \"bytes\": %llu, "
                    "\"seconds\": %.3f, \"mpps\": %.4f, \"gbps\": %.4f}\n",
                    a.dev.c_str(), static_cast<unsigned long long>(r->packets),
                    static_cast<unsigned long long>(r->bytes), s, mpps(r->packets, s),
                    gbps(frame_bytes, s));
        return 0;
    }
    std::printf("xesp-gen rx: %s: received %llu in %.2f s: %.3f Mpps, %.3f Gbps\n", a.dev.c_str(),
                static_cast<unsigned long long>(r->packets), s, mpps(r->packets, s),
                gbps(frame_bytes, s));
    return 0;
}

}  // namespace

int main(int argc, char **argv)
{
    CLI::App app{"xesp-gen: UDP bench traffic out of one interface (tx), counted on another (rx)"};
    app.require_subcommand(1);

    TxArgs tx;
    CLI::App *t =
        app.add_subcommand("tx", "Send UDP/IPv4 frames to port " + std::to_string(GEN_UDP_PORT) +
                                     " as fast as one thread can, to the next hop's MAC");
    t->add_option("--dev", tx.dev, "Interface to send from")->required();
    t->add_option("--src", tx.src, "Source IPv4 address")->required();
    t->add_option("--dst", tx.dst, "Destination IPv4 address")->required();
    t->add_option("--size", tx.size,
                  "Ethernet frame length in bytes including the 4-byte FCS (RFC 2544): 64 sends "
                  "60 bytes (a 46-byte IP packet), 1400 a 1382-byte IP packet. The datagrams "
                  "have DF set: one too big for a tunnel gets \"fragmentation needed\"")
        ->check(CLI::Range(kMinFrame, kMaxFrame))
        ->capture_default_str();
    t->add_option("--seconds", tx.seconds, "How long to send")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    t->add_option("--flows", tx.flows,
                  "Source ports " + std::to_string(GEN_SRC_PORT_BASE) +
                      ".. +K-1, so that receive queues and gateway threads spread")
        ->check(CLI::Range(1, 4096))
        ->capture_default_str();
    t->add_option(
         "--pairs", tx.pairs,
         "Address pairs: the K-th frame goes from SRC + (K mod N) * STEP to DST + (K mod N) "
         "* STEP, spreading the traffic over N subnets (a gateway's tunnels)")
        ->check(CLI::Range(1, 4194304))
        ->capture_default_str();
    t->add_option("--pair-step", tx.pair_step, "STEP of --pairs: addresses between two pairs")
        ->check(CLI::Range(1u, 1u << 24))
        ->capture_default_str();
    t->add_option("--mpps", tx.mpps,
                  "Offered rate in million frames per second, paced by sleeping (0: as fast as "
                  "possible, the sender spinning on its CPU)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    t->add_option("--method", tx.method,
                  "xsk: AF_XDP copy mode, one socket per TX queue (auto: the faster on veth); "
                  "packet: AF_PACKET sendmmsg, qdisc bypassed")
        ->check(CLI::IsMember({"auto", "packet", "xsk"}))
        ->capture_default_str();
    t->add_option("--dst-mac", tx.dst_mac, "Next hop's MAC (default: from the neighbour table)");
    t->add_flag("--json", tx.json, "One JSON object on stdout");

    RxArgs rx;
    CLI::App *r = app.add_subcommand(
        "rx", "Count and drop the bench frames arriving on an interface (XDP), print the rate");
    r->add_option("--dev", rx.dev, "Interface to count on")->required();
    r->add_option("--seconds", rx.seconds, "Longest run")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    r->add_option("--idle", rx.idle, "Stop once frames came and then none for this long")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    r->add_flag("--json", rx.json, "One JSON object on stdout");

    CLI11_PARSE(app, argc, argv);
    catch_signals();
    return finish(t->parsed() ? tx_main(tx) : rx_main(rx));
}
