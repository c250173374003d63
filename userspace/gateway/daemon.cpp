// `xesp daemon`: runs the gateway in the foreground (userspace/gateway/gateway.h) and serves
// the control socket that `xesp sa|policy|iface|stats` talk to. Logs go to stderr, one line per
// event (userspace/log.h). Two threads: the data thread forwards, and the control thread
// serves the socket, builds each change and hands it over (userspace/gateway/handoff.h), so
// that a request, however large, costs forwarding only the moment of the swap. SIGTERM or SIGINT: saves the state and exits. After a stop, as
// after a crash, the classifier stays attached and keeps protected traffic dropped (fail
// closed); the next start reads the state file and resumes (userspace/gateway/state_keeper.h
// keeps it). --detach-on-exit, or `xesp iface del`, hands an interface back to the kernel.
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <thread>

#include "bpf/kernel_probe.h"
#include "tools/xesp/commands.h"
#include "userspace/clock.h"
#include "userspace/control.h"
#include "userspace/gateway/gateway.h"
#include "userspace/gateway/handoff.h"
#include "userspace/gateway/state_keeper.h"
#include "userspace/log.h"
#include "userspace/netns.h"
#include "userspace/seq_reserve.h"
#include "userspace/sys_util.h"

namespace xesp::cli {

namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void on_signal(int) { g_stop.store(true, std::memory_order_relaxed); }

// The state file beside nothing else: /var/lib/xesp/<socket name>.state, so that two daemons
// with two sockets (one per network namespace) keep two states.
std::string default_state(const std::string &socket)
{
    std::string base = socket.substr(socket.rfind('/') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, ".sock") == 0)
        base.resize(base.size() - 5);
    return "/var/lib/xesp/" + base + ".state";
}

// The control requests, on the control thread. A change is built there and handed to the
// data thread (Gateway::prepare, install, finish); every change is written to the state file
// before it is answered, and a new SA sends nothing until then. What only the data thread may
// touch (interfaces, counters) runs there through the handoff.
class GatewayHandler : public ConfigHandler {
public:
    GatewayHandler(Gateway &gw, Config initial, StateKeeper *keeper, Handoff &data)
        : ConfigHandler(std::move(initial)), gw_(gw), keeper_(keeper), data_(data)
    {
    }

    Result<std::string> iface(const std::vector<std::string> &w) override
    {
        if (w.size() == 1 && w[0] == "list")
            return on_data<std::string>([&] { return iface_list(); });
        if (w.size() == 4 && w[0] == "add" && w[2] == "role" &&
            (w[3] == "public" || w[3] == "protected")) {
            IfaceRole role = w[3] == "public" ? IfaceRole::Public : IfaceRole::Protected;
            return changed_ifaces([&] { return gw_.add_iface(w[1], role); });
        }
        if (w.size() == 2 && w[0] == "del")
            return changed_ifaces([&] { return gw_.del_iface(w[1]); });
        return make_error("iface: expected `add DEV role protected|public`, `del DEV` or `list`");
    }

    // `sa add` and `sa update` answer with a warning line when two SAs share a key and salt.
    Result<std::string> command(const Command &cmd, bool show_keys) override
    {
        auto out = ConfigHandler::command(cmd, show_keys);
        if (out && cmd.object == Command::Object::Sa && cmd.verb != Command::Verb::List &&
            cmd.verb != Command::Verb::Get)
            *out += shared_key_warnings(config(), &cmd.sa);
        return out;
    }

    std::string stats_json() override
    {
        auto sample = on_data<Gateway::Stats>([&] { return gw_.stats_sample(); });
        return gw_.stats_json(sample).dump();
    }

    // On the data thread.
    void tick(uint64_t now)
    {
        if (keeper_)
            keeper_->tick(gw_, now);
    }

    // On the data thread, while the control thread does not run (start, stop).
    void save_now()
    {
        if (!keeper_)
            return;
        if (auto r = keeper_->save_now(gw_); !r)
            log(LogLevel::Error, "%s", r.error().message.c_str());
    }

    // Each pair of SAs sharing a key and salt, once in the log (batches included), whoever
    // made it.
    void log_shared_keys()
    {
        std::string now = shared_key_warnings(config());
        for (size_t pos = 0, nl; (nl = now.find('\n', pos)) != std::string::npos; pos = nl + 1) {
            std::string line = now.substr(pos, nl - pos);
            if (warned_.find(line) == std::string::npos)
                log(LogLevel::Warning, "%s", line.c_str() + 9);     // after "warning: "
        }
        warned_ = std::move(now);
    }

protected:
    Result<void> commit(Config next) override
    {
        auto ch = gw_.prepare(std::make_shared<const Config>(next));
        if (!ch)
            return ch.error();
        uint64_t ticket = 0;
        data_.call([&] {
            gw_.install(**ch);
            if (keeper_)
                ticket = keeper_->request_save(gw_, now_ns());
        });
        gw_.finish(std::move(*ch));
        auto r = ConfigHandler::commit(std::move(next));
        wait_saved(ticket);
        log_shared_keys();
        return r;
    }

private:
    template <typename T, typename F> T on_data(F &&fn)
    {
        T out;
        data_.call([&] { out = fn(); });
        return out;
    }

    // An interface added or removed on the data thread, then saved.
    template <typename F> Result<std::string> changed_ifaces(F &&change)
    {
        Result<void> r;
        uint64_t ticket = 0;
        data_.call([&] {
            r = change();
            if (r && keeper_)
                ticket = keeper_->request_save(gw_, now_ns());
        });
        if (!r)
            return r.error();
        wait_saved(ticket);
        return std::string();
    }

    void wait_saved(uint64_t ticket)
    {
        if (!keeper_)
            return;
        if (auto r = keeper_->wait_saved(ticket); !r)
            log(LogLevel::Error, "%s", r.error().message.c_str());
    }

    // On the data thread.
    std::string iface_list() const
    {
        std::string out;
        for (const auto &i : gw_.ifaces())
            if (!i.local) {
                out += i.name + " role " + (i.role == IfaceRole::Public ? "public" : "protected") +
                   " queues " + std::to_string(i.queues) + " mtu " + std::to_string(i.mtu) + "\n";
                if (!i.warning.empty())
                    out += "  warning: " + i.warning + "\n";
            }
        return out;
    }

    Gateway &gw_;
    StateKeeper *keeper_;
    Handoff &data_;
    std::string warned_;            // shared_key_warnings() as last logged
};

struct DaemonOptions {
    std::string config_file;
    std::string socket = default_socket();
    std::string state;
    bool no_state = false;
    std::string crypto = "auto";
    uint32_t ring_size = kDefaultRingSize;
    bool busy_poll = false;
    uint32_t spin = 0;
    uint32_t pmtu_expires = kPmtuExpiresSeconds;
    bool detach_on_exit = false;
    uint64_t seq_reserve = ReservePolicy{}.min_ahead;
    bool check = false;
};

// What to start with: the state file (a restart) and/or the config file.
GatewayState initial_state(const DaemonOptions &o, const StateKeeper *keeper)
{
    GatewayState st;
    if (keeper && keeper->loaded()) {
        const GatewayState &saved = *keeper->loaded();
        if (saved.netns && *saved.netns != netns_name())
            throw Failure("state file " + keeper->path() + " was written in " +
                          describe_netns(*saved.netns) + ", and this daemon runs in " +
                          describe_netns(netns_name()) + ": give it a state file of its own "
                          "(--state FILE)");
        st.config = saved.config;
        st.ifaces = saved.ifaces;
        log(LogLevel::Info, "resuming from %s: %zu SAs, %zu policies, %zu interfaces",
            keeper->path().c_str(), st.config.sas.size(), st.config.policies.size(),
            st.ifaces.size());
    }
    if (!o.config_file.empty()) {
        auto cfg = load_batch_file(o.config_file);
        if (!cfg)
            throw Failure(cfg.error().message);
        st.config = with_saved_sequence(std::move(*cfg), st.config);
    }
    return st;
}

// What the gateway needs from the kernel: one line, and the daemon does not start without it.
void check_kernel(const DaemonOptions &o)
{
    if (auto r = probe_kernel(); !r)
        throw Failure(r.error().message);
    if (o.check)
        std::printf("kernel %s: has what xesp needs\n", kernel_release().c_str());
}

void run_daemon(const DaemonOptions &o)
{
    check_kernel(o);
    if (o.check)
        return;
    auto backend = parse_backend(o.crypto);
    if (!backend)
        throw Failure("--crypto " + o.crypto + ": expected auto, openssl or ipsecmb");
    std::string state_path = o.no_state ? "" : (o.state.empty() ? default_state(o.socket) : o.state);
    if (o.no_state)
        log(LogLevel::Warning, "--no-state: sequence numbers start from the configuration at "
            "every start; with keys that were used before, nonces repeat (AES-GCM is then "
            "broken): give every SA fresh keys");
    // SIGTERM and SIGINT go to the control thread only: they interrupt its wait at once,
    // and every thread made before it (the state writer) inherits the block.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);

    std::unique_ptr<StateKeeper> keeper;
    if (!state_path.empty()) {
        ::mkdir(parent_dir(state_path).c_str(), 0700);
        ReservePolicy policy;
        policy.min_ahead = o.seq_reserve;
        auto k = StateKeeper::open(state_path, policy);
        if (!k)
            throw Failure(k.error().message);
        keeper = std::move(*k);
    }
    GatewayState st = initial_state(o, keeper.get());

    GatewayOptions go;
    go.backend = *backend;
    go.ring_size = o.ring_size;
    go.busy_poll = o.busy_poll;
    go.pmtu_expires_s = o.pmtu_expires;
    auto gw = Gateway::create(st.config, go);
    if (!gw)
        throw Failure(gw.error().message);
    if (keeper)
        keeper->restore_replay(**gw);
    auto data = Handoff::create();
    if (!data)
        throw Failure(data.error().message);
    GatewayHandler handler(**gw, std::move(st.config), keeper.get(), **data);
    handler.log_shared_keys();
    st.config = {};         // the handler's copy lives on: a deleted SA's key must not stay here
    auto server = ControlServer::listen(handler, o.socket);
    if (!server)
        throw Failure(server.error().message);
    for (const auto &[name, role] : st.ifaces)
        if (auto r = (*gw)->add_iface(name, role); !r)
            log(LogLevel::Error, "%s (from the state file)", r.error().message.c_str());
    handler.save_now();

    log(LogLevel::Info, "running: control socket %s, state %s, crypto %s", o.socket.c_str(),
        state_path.empty() ? "(none)" : state_path.c_str(), o.crypto.c_str());

    // The control thread: requests until a stop, then it finishes the one it serves.
    std::atomic<bool> control_done{false};
    std::thread control([&] {
        pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
        while (!g_stop.load(std::memory_order_relaxed)) {
            try {
                if (auto r = server->poll_once(100); !r)
                    log(LogLevel::Warning, "control socket: %s", r.error().message.c_str());
            } catch (const std::exception &e) {
                log(LogLevel::Error, "control socket: %s", e.what());
            }
        }
        control_done.store(true, std::memory_order_release);
    });

    // The data thread. Packets first; handed-over work after every burst; routing events,
    // completions and the state file once a millisecond; when nothing came in for `spin`
    // rounds, sleep until a socket (or the handoff) has something. It runs until the control
    // thread is done, as that may wait for it.
    Gateway &g = **gw;
    uint64_t last_house = 0;
    uint32_t idle = 0;
    std::vector<pollfd> pfds;
    while (!control_done.load(std::memory_order_acquire)) {
        size_t moved = g.poll_data();
        (*data)->serve();
        uint64_t ns = now_ns();
        if (ns / 1'000'000 != last_house) {
            last_house = ns / 1'000'000;
            g.housekeeping();
            handler.tick(ns);
        }
        if (moved || ++idle <= o.spin) {
            idle = moved ? 0 : idle;
            continue;
        }
        idle = 0;
        g.housekeeping();           // completions before sleeping: frames back to the pool
        pfds.clear();
        for (int fd : g.wait_fds())
            pfds.push_back({fd, POLLIN, 0});
        pfds.push_back({(*data)->fd(), POLLIN, 0});
        ::poll(pfds.data(), pfds.size(), 10);
    }
    control.join();
    log(LogLevel::Info, "stopping: saving the state");
    handler.save_now();
    g.shutdown(o.detach_on_exit);
}

} // namespace

void register_daemon_command(CLI::App &app)
{
    auto o = std::make_shared<DaemonOptions>();
    auto *sub = app.add_subcommand("daemon", "run the gateway (foreground; logs on stderr)");
    sub->add_option("-b,--batch", o->config_file,
                    "apply this config file (sa/policy lines) at start");
    sub->add_option("--socket", o->socket,
                    std::string("control socket (default: $XESP_SOCKET, else ") +
                        kDefaultSocketHelp + ")");
    sub->add_option("--state", o->state,
                    "state file (default: /var/lib/xesp/<socket name>.state; the socket's name "
                    "carries the network namespace's)");
    sub->add_flag("--no-state", o->no_state, "neither read nor write a state file");
    sub->add_option("--crypto", o->crypto, "auto, openssl or ipsecmb");
    sub->add_option("--ring-size", o->ring_size, "entries in each AF_XDP ring (a power of two)");
    sub->add_flag("--busy-poll", o->busy_poll, "busy-poll the sockets instead of waiting");
    sub->add_option("--spin", o->spin,
                    "empty polling rounds before sleeping (0: sleep as soon as idle)");
    sub->add_option("--seq-reserve", o->seq_reserve,
                    "sequence numbers each SA may send beyond what the state file holds, at "
                    "least (default 1048576; more at higher rates)")
        ->check(CLI::Range(uint64_t(1), uint64_t(1) << 40));
    sub->add_option("--pmtu-expires", o->pmtu_expires,
                    "seconds a path MTU learnt from ICMP lasts (default 600, RFC 1191)")
        ->check(CLI::Range(1u, 86400u));
    sub->add_flag("--detach-on-exit", o->detach_on_exit,
                  "on SIGTERM/SIGINT, hand the interfaces back to the kernel (default: the "
                  "classifier stays and drops protected traffic until the next daemon)");
    sub->add_flag("--check", o->check,
                  "only check that this kernel has what the gateway needs, and exit");
    sub->callback([o] { run_daemon(*o); });
}

} // namespace xesp::cli
