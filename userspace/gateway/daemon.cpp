// The daemon (daemon.h): the data thread's loop, the control thread and its handler, the
// state file around them.
#include <malloc.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <functional>
#include <optional>
#include <thread>

#include "bpf/kernel_probe.h"
#include "userspace/base/clock.h"
#include "userspace/base/cpu_list.h"
#include "userspace/base/wiped.h"
#include "userspace/config/xfrm_words.h"
#include "userspace/control/control.h"
#include "userspace/gateway/daemon.h"
#include "userspace/gateway/gateway.h"
#include "userspace/gateway/handoff.h"
#include "userspace/gateway/state_keeper.h"
#include "userspace/base/log.h"
#include "userspace/base/netns.h"
#include "userspace/esp/seq_reserve.h"
#include "userspace/base/sys_util.h"
#include "userspace/base/thread_priority.h"

namespace xesp {

namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free, "set from a signal handler");

void on_signal(int)
{
    g_stop.store(true, std::memory_order_relaxed);
}

// A device name as the kernel takes them (dev_valid_name()), without control characters:
// what an error or a listing may show as it is.
bool is_ifname(const std::string &n)
{
    if (n.empty() || n.size() >= IFNAMSIZ || n == "." || n == "..")
        return false;
    for (unsigned char c : n)
        if (c == '/' || c == ':' || std::isspace(c) || c < 0x20 || c == 0x7f)
            return false;
    return true;
}

// Whether the crypto backend can run what the command adds: an error naming the SA if not.
Result<void> backend_takes(const Command &cmd, Backend backend)
{
    if (cmd.object != Command::Object::Sa ||
        (cmd.verb != Command::Verb::Add && cmd.verb != Command::Verb::Update))
        return {};
    if (auto r = Sa::check(cmd.sa, backend); !r)
        return make_error(describe_sa(cmd.sa.dst, cmd.sa.spi) + ": " + r.error().message);
    return {};
}

// The control requests, on the control thread. A change is built there and handed to the
// data thread (Gateway::prepare, install, finish); every change is written to the state file
// before it is answered, and a new SA sends nothing until then. What only the data thread may
// touch (interfaces, counters) runs there through the handoff.
class GatewayHandler : public ConfigHandler {
public:
    GatewayHandler(Gateway &gw, Config initial, StateKeeper *keeper, Handoff &data)
            : ConfigHandler(std::move(initial)), gw_(gw), keeper_(keeper), data_(data)
    {}

    Result<std::string> iface(const std::vector<std::string> &w) override
    {
        if (w.size() == 1 && w[0] == "list")
            return on_data<std::string>([&] { return iface_list(); });
        if (w.size() >= 2 && (w[0] == "add" || w[0] == "del") && !is_ifname(w[1]))
            return make_error("iface " + w[0] + " " + xfrm::shown(w[1]) +
                              ": not an interface name (1 to 15 bytes, not . or .., no '/', "
                              "':', white space or control characters)");
        if ((w.size() == 4 || w.size() == 6) && w[0] == "add" && w[2] == "role" &&
            (w[3] == "public" || w[3] == "protected") &&
            (w.size() == 4 || (w[4] == "mode" && (w[5] == "xdp" || w[5] == "tun")))) {
            IfaceSpec spec{w[1], w[3] == "public" ? IfaceRole::Public : IfaceRole::Protected};
            if (w.size() == 6 && w[5] == "tun")
                spec.mode = IfaceMode::Tun;
            const bool mode_given = w.size() == 6;
            return changed_ifaces("iface add " + w[1], w[1], [&] {
                // Without `mode`, an interface added already keeps its own: adding it again
                // is refused as it is in that mode, not turned back to the default (in
                // another role, as added already).
                for (const GatewayIface &i : gw_.ifaces())
                    if (!mode_given && i.name == spec.name && !i.local && i.role == spec.role)
                        spec.mode = i.mode;
                return gw_.add_iface(spec);
            });
        }
        if (w.size() == 6 && w[0] == "add" && w[4] == "mode" && w[5] != "xdp" && w[5] != "tun")
            return make_error("iface add " + w[1] + ": mode " + xfrm::shown(w[5]) +
                              ": expected xdp or tun");
        if (w.size() == 2 && w[0] == "del")
            return changed_ifaces(
                "iface del " + w[1], w[1], [&] { return gw_.del_iface(w[1]); },
                [&] { return gw_.release_renamed(w[1]); });
        return make_error(
            "iface: expected `add DEV role protected|public [mode xdp|tun]`, `del DEV` or `list`");
    }

    // `sa add` and `sa update` answer with a warning line when two SAs share a key and salt.
    Result<std::string> command(const Command &cmd, bool show_keys) override
    {
        auto out = ConfigHandler::command(cmd, show_keys);
        if (out && cmd.object == Command::Object::Sa && cmd.verb != Command::Verb::List &&
            cmd.verb != Command::Verb::Get)
            if (const SaConfig *now = config().find_sa(cmd.sa.dst, cmd.sa.spi))
                *out += keys_.warning_for(*now, config());
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

    // Each pair of SAs sharing a key and salt in the log, at start for all of them, then for
    // each SA a change makes (batches included), whoever made it.
    void log_shared_keys()
    {
        for (const SaConfig &c : config().sas)
            keys_.add(c);
        log_lines(shared_key_warnings(config()));
    }

protected:
    // A batch's SA that this gateway's crypto backend cannot run is refused at its line.
    Result<void> check(const Command &cmd) const override
    {
        return backend_takes(cmd, gw_.options().backend);
    }

    Result<void> commit(const ConfigChange &change) override
    {
        // The change is in the journal, and its new SAs bound to their reservations, before
        // any packet sees it: the answer means it survives a crash.
        Gateway::BeforePublish record;
        if (keeper_)
            record = [&](const std::vector<std::shared_ptr<Sa>> &made) {
                return keeper_->record_change(change, made);
            };
        auto ch = gw_.prepare(change, record);
        if (!ch)
            return ch.error();
        gw_.finish(std::move(*ch));
        for (const SaKey &k : change.del_sas)
            if (const SaConfig *old = config().sas.find(k))
                keys_.remove(*old);
        for (const SaConfig &c : change.put_sas)
            if (const SaConfig *old = config().sas.find(SaKey{c.dst, c.spi}))
                keys_.remove(*old);
        auto r = ConfigHandler::commit(change);
        for (const SaConfig &c : change.put_sas)
            keys_.add(c);
        std::string warnings;
        for (const SaConfig &c : change.put_sas)
            warnings += keys_.warning_for(c, config());
        log_lines(warnings);
        return r;
    }

private:
    static void log_lines(const std::string &lines)
    {
        for (size_t pos = 0, nl; (nl = lines.find('\n', pos)) != std::string::npos; pos = nl + 1)
            log(LogLevel::Warning, "%s", lines.substr(pos + 9, nl - pos - 9).c_str());
    }

    template <typename T, typename F> T on_data(F &&fn)
    {
        T out;
        data_.call([&] { out = fn(); });
        return out;
    }

    // An interface added, removed or changed on the data thread, then saved. If the state
    // file cannot be written, the change is undone and refused, as a change of SAs is: the
    // interfaces stay what a restart brings back, and the answer says what happened.
    // `saved_then` runs on the data thread once the change is saved (at once if there is
    // nothing to save): what an undo could not take back.
    template <typename F, typename S = Result<void> (*)()>
    Result<std::string> changed_ifaces(
        const std::string &what, const std::string &name, F &&change,
        S &&saved_then = [] { return Result<void>{}; })
    {
        Result<void> r;
        uint64_t ticket = 0;
        std::optional<IfaceSpec> before, after;
        bool left = false;  // a program an earlier daemon left was on it
        auto spec_of = [&](std::optional<IfaceSpec> *spec) {
            for (const GatewayIface &i : gw_.ifaces())
                if (i.name == name && !i.local)
                    *spec = IfaceSpec{i.name, i.role, i.mode};
        };
        data_.call([&] {
            spec_of(&before);
            left = !before && Gateway::leftover(name);
            r = change();
            spec_of(&after);
            // Nothing saved changed (`iface del` of what an earlier daemon left): no write.
            if (r && keeper_ && before != after)
                ticket = keeper_->request_save(gw_);
            else if (r)
                r = saved_then();
        });
        if (!r)
            return r.error();
        if (!ticket)
            return std::string();
        auto saved = keeper_->wait_saved(ticket);
        if (saved) {
            data_.call([&] { r = saved_then(); });
            return r ? Result<std::string>(std::string()) : r.error();
        }
        if (saved.error().code.value() == ESHUTDOWN)  // the daemon stops: nothing to undo for
            return saved.error();
        Result<void> undone;
        std::optional<IfaceSpec> now;
        data_.call([&] {
            undone = before ? gw_.add_iface(*before, true)
                     : left ? gw_.leave_iface(name)
                            : gw_.del_iface(name);
            spec_of(&now);
        });
        std::string msg = what + ": not done: " + saved.error().message;
        if (!undone)
            msg += std::string("; undoing it failed") +
                   (now == after ? ", the change stands" : "") + ": " + undone.error().message;
        log(LogLevel::Error, "%s", msg.c_str());
        return make_error(msg);
    }

    // On the data thread.
    std::string iface_list() const
    {
        std::string out;
        for (const auto &i : gw_.ifaces())
            if (!i.local) {
                std::string macs;
                for (const auto &m : i.macs)
                    macs += (macs.empty() ? "" : ",") + rtnl::mac_str(m);
                out += i.name + " role " + iface_role_name(i.role) + " mode " +
                       iface_mode_name(i.mode);
                if (i.absent && i.tried)
                    out += " absent: a device of that name is here but was not attached (see "
                           "the log)\n";
                else if (i.absent)
                    out += " absent: attached when a device of that name is here\n";
                else
                    out += " queues " + std::to_string(i.queues) + " mtu " + std::to_string(i.mtu) +
                           " macs " + (macs.empty() ? "-" : macs) + "\n";
                if (!i.warning.empty())
                    out += "  warning: " + i.warning + "\n";
                for (const auto &r : gw_.renamed())
                    if (r.was == i.name)
                        out += "  renamed " + r.name + " (index " + std::to_string(r.ifindex) +
                               ") keeps our program, parked, until `xesp iface del " + i.name +
                               "`\n";
            }
        // Devices of an interface forgotten since (a del that failed, or whose save the stop
        // cut short): still ours to hand back.
        for (const auto &r : gw_.renamed())
            if (std::none_of(gw_.ifaces().begin(), gw_.ifaces().end(),
                             [&](const GatewayIface &i) { return i.name == r.was && !i.local; }))
                out += r.name + " (index " + std::to_string(r.ifindex) + "), which was " + r.was +
                       ", keeps our program, parked, until `xesp iface del " + r.was + "`\n";
        return out;
    }

    Gateway &gw_;
    StateKeeper *keeper_;
    Handoff &data_;
    NonceKeys keys_;  // the SAs of config() by key and salt
};

// What to start with: the state file (a restart) and/or the config file.
Result<GatewayState> initial_state(const DaemonOptions &o, Backend backend,
                                   const StateKeeper *keeper)
{
    GatewayState st;
    if (keeper && keeper->loaded()) {
        const GatewayState &saved = *keeper->loaded();
        if (saved.netns && *saved.netns != netns_name())
            return make_error("state file " + keeper->path() + " was written in " +
                              describe_netns(*saved.netns) + ", and this daemon runs in " +
                              describe_netns(netns_name()) +
                              ": give it a state file of its own "
                              "(--state FILE)");
        st.config = saved.config;
        st.ifaces = saved.ifaces;
        st.renamed = saved.renamed;
        log(LogLevel::Info, "resuming from %s: %zu SAs, %zu policies, %zu interfaces",
            keeper->path().c_str(), st.config.sas.size(), st.config.policies.size(),
            st.ifaces.size());
    }
    if (!o.config_file.empty()) {
        // An SA the backend cannot run is refused at its line, as a batch's is.
        auto cfg = load_batch_file(o.config_file, {},
                                   [&](const Command &cmd) { return backend_takes(cmd, backend); });
        if (!cfg)
            return cfg.error();
        st.config = with_saved_sequence(std::move(*cfg), st.config);
    }
    return st;
}

// SIGTERM and SIGINT go to the control thread only (control_thread() unblocks them there):
// they interrupt its wait at once, and every thread made before it (the state writer)
// inherits the block.
sigset_t block_stop_signals()
{
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    return stop;
}

Result<std::unique_ptr<StateKeeper>> open_state(const DaemonOptions &o, const std::string &path)
{
    if (o.no_state) {
        log(LogLevel::Warning,
            "--no-state: sequence numbers start from the configuration at "
            "every start; with keys that were used before, nonces repeat (AES-GCM is then "
            "broken): give every SA fresh keys");
        return std::unique_ptr<StateKeeper>();
    }
    ::mkdir(parent_dir(path).c_str(), 0700);
    ReservePolicy policy;
    policy.min_ahead = o.seq_reserve;
    return StateKeeper::open(path, policy);
}

// Requests until a stop; then it finishes the one it serves, and says it is done.
void control_thread(ControlServer &server, const sigset_t &stop, std::atomic<bool> &done)
{
    pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
    if (auto r = set_thread_nice(kBackgroundNice); !r)  // the data thread first
        log(LogLevel::Warning, "control thread: %s", r.error().message.c_str());
    while (!g_stop.load(std::memory_order_relaxed)) {
        try {
            if (auto r = server.poll_once(100); !r)
                log(LogLevel::Warning, "control socket: %s", r.error().message.c_str());
        } catch (const std::exception &e) {
            log(LogLevel::Error, "control socket: %s", e.what());
        }
        wipe_stack();  // the requests' keys, as their text was parsed and their SAs built
    }
    done.store(true, std::memory_order_release);
}

// Packets first; handed-over work after every burst; routing events, completions and the
// state file once a millisecond; when nothing came in for `spin` rounds, sleep until a socket
// (or the handoff) has something, or a millisecond has passed. Runs until the control thread
// is done, as that may wait for it.
void data_loop(Gateway &g, GatewayHandler &handler, Handoff &data, uint32_t spin,
               const std::atomic<bool> &control_done)
{
    uint64_t last_house = 0;
    uint32_t idle = 0;
    std::vector<pollfd> pfds;
    // A reader of the engine's tables: between two rounds it holds nothing from them, and
    // while it sleeps the control thread does not wait for it (rcu.h).
    Qsbr::Reader tables(g.readers());
    while (!control_done.load(std::memory_order_acquire)) {
        // Bursts in flight on the workers hold pointers into the tables: quiescent only
        // without any, and without any soon when a change waits for it.
        if (g.in_flight() && g.readers().writer_waiting())
            g.drain();
        if (!g.in_flight())
            tables.quiescent();
        size_t moved = g.poll_data();
        // Handed-over work may close the sockets or sample the counters: none in flight.
        if (data.pending()) {
            g.drain();
            data.serve();
        }
        uint64_t ns = now_ns();
        if (ns / 1'000'000 != last_house) {
            last_house = ns / 1'000'000;
            g.housekeeping();
            handler.tick(ns);
        }
        if (moved || ++idle <= spin) {
            idle = moved ? 0 : idle;
            continue;
        }
        idle = 0;
        g.drain();
        g.settle();  // completions before sleeping: frames back to the pool
        g.wait_fds(&pfds);
        pfds.push_back({data.fd(), POLLIN, 0});
        tables.offline();
        // At most a millisecond: a wakeup the kernel delivers late (its softirq work deferred
        // to ksoftirqd on a busy machine) must not leave frames waiting in a ring for longer.
        if (::poll(pfds.data(), pfds.size(), 1) < 0) {
            for (pollfd &p : pfds)
                p.revents = POLLIN;  // not known: look at everything
        }
        tables.online();
        g.woke(pfds);  // routing events and the like now, not at the next tick
    }
    g.drain();  // before the state is saved: the replay windows of what was forwarded
}

}  // namespace

std::string default_state_file(const std::string &socket)
{
    std::string base = socket.substr(socket.rfind('/') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, ".sock") == 0)
        base.resize(base.size() - 5);
    return "/var/lib/xesp/" + base + ".state";
}

Result<void> run_daemon(const DaemonOptions &o)
{
    if (auto r = probe_kernel(); !r)
        return r.error();
    if (o.data_priority && o.busy_poll)
        return make_error("--data-priority: a real-time data thread must sleep when idle, and "
                          "--busy-poll never does; drop one of them");
    auto backend = parse_backend(o.crypto);
    if (!backend)
        return make_error("--crypto " + o.crypto + ": expected auto, openssl or ipsecmb");
    std::string state_path =
        o.no_state ? "" : (o.state.empty() ? default_state_file(o.socket) : o.state);
    sigset_t stop = block_stop_signals();
    auto keeper = open_state(o, state_path);
    if (!keeper)
        return keeper.error();
    auto st = initial_state(o, *backend, keeper->get());
    if (!st)
        return st.error();

    GatewayOptions go;
    go.workers = o.workers ? o.workers : default_workers();
    if (!o.cpus.empty()) {
        auto cpus = parse_cpu_list(o.cpus);
        if (!cpus)
            return make_error("--" + cpus.error().message);  // --cpus: what and where
        go.cpus = std::move(*cpus);
    }
    if (go.workers > OrderedPool::kMaxWorkers)
        return make_error("--workers " + std::to_string(go.workers) + ": at most " +
                          std::to_string(OrderedPool::kMaxWorkers));
    if (go.workers > 1 && *backend == Backend::OpenSsl)
        log(LogLevel::Warning,
            "--workers %u with --crypto openssl: OpenSSL's contexts are per SA, "
            "so every SA's crypto stays on the data thread; the other workers idle",
            go.workers);
    go.backend = *backend;
    go.ring_size = o.ring_size;
    go.busy_poll = o.busy_poll;
    go.pmtu_expires_s = o.pmtu_expires;
    go.hold_new_sas = *keeper != nullptr;
    if (*keeper)
        (*keeper)->set_config(st->config);
    auto gw = Gateway::create(st->config, go);
    if (!gw)
        return gw.error();
    if (*keeper)
        (*keeper)->restore_replay(**gw);
    auto data = Handoff::create();
    if (!data)
        return data.error();
    GatewayHandler handler(**gw, std::move(st->config), keeper->get(), **data);
    handler.log_shared_keys();
    st->config = {};  // the handler's copy lives on: a deleted SA's key must not stay here
    auto server = ControlServer::listen(handler, o.socket);
    if (!server)
        return server.error();
    for (const auto &spec : st->ifaces)
        if (auto r = (*gw)->add_iface(spec, true); !r)
            log(LogLevel::Error, "%s (from the state file)", r.error().message.c_str());
    for (const auto &r : st->renamed)
        (*gw)->note_renamed(r.was, r.ifindex);  // if it still keeps our program
    handler.save_now();
    // Loading many tunnels leaves the heap with free room behind it (the parsed batch, the
    // change, the first write's text): give the pages back rather than keep them resident.
    malloc_trim(0);
    log(LogLevel::Info, "running: control socket %s, state %s, crypto %s, %u worker(s)",
        o.socket.c_str(), state_path.empty() ? "(none)" : state_path.c_str(), o.crypto.c_str(),
        go.workers);

    std::atomic<bool> control_done{false};
    std::thread control(control_thread, std::ref(*server), std::cref(stop), std::ref(control_done));
    // After the other threads are made: they do not inherit it.
    if (!go.cpus.empty())
        if (auto r = pin_to_cpu(go.cpus[0]); !r)
            log(LogLevel::Warning, "data thread: %s", r.error().message.c_str());
    if (o.data_priority)
        if (auto r = set_thread_fifo(int(o.data_priority)); !r)
            log(LogLevel::Warning, "%s; it runs as a normal thread", r.error().message.c_str());
    wipe_stack();  // the keys of the start: the state file, the batch, the SAs' contexts
    data_loop(**gw, handler, **data, o.spin, control_done);
    control.join();
    log(LogLevel::Info, "stopping: saving the state");
    handler.save_now();
    (*gw)->shutdown(o.detach_on_exit);
    return {};
}

}  // namespace xesp
