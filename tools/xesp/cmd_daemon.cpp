// `xesp daemon`: runs the gateway in the foreground (userspace/gateway/gateway.h) and serves
// the control socket that `xesp sa|policy|iface|stats` talk to. Logs go to stderr, one line per
// event (userspace/log.h). SIGTERM or SIGINT: saves the state and exits. After a stop, as
// after a crash, the classifier stays attached and keeps protected traffic dropped (fail
// closed); the next start reads the state file and resumes. --detach-on-exit, or `xesp iface
// del`, hands an interface back to the kernel.
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <map>

#include "bpf/kernel_probe.h"
#include "tools/xesp/commands.h"
#include "userspace/control.h"
#include "userspace/gateway/gateway.h"
#include "userspace/gateway/state.h"
#include "userspace/log.h"
#include "userspace/sys_util.h"

namespace xesp::cli {

namespace {

volatile sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

uint64_t now_ms()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

// The state file beside nothing else: /var/lib/xesp/<socket name>.state, so that two daemons
// with two sockets (one per network namespace) keep two states.
std::string default_state(const std::string &socket)
{
    std::string base = socket.substr(socket.rfind('/') + 1);
    if (base.size() > 5 && base.compare(base.size() - 5, 5, ".sock") == 0)
        base.resize(base.size() - 5);
    return "/var/lib/xesp/" + base + ".state";
}

// The control requests, applied to the running gateway.
class GatewayHandler : public ConfigHandler {
public:
    GatewayHandler(Gateway &gw, Config initial, std::string state_path)
        : ConfigHandler(std::move(initial)), gw_(gw), state_path_(std::move(state_path))
    {
    }

    Result<std::string> iface(const std::vector<std::string> &w) override
    {
        if (w.size() == 1 && w[0] == "list")
            return iface_list();
        if (w.size() == 4 && w[0] == "add" && w[2] == "role" &&
            (w[3] == "public" || w[3] == "protected")) {
            auto r = gw_.add_iface(w[1], w[3] == "public" ? IfaceRole::Public
                                                          : IfaceRole::Protected);
            if (!r)
                return r.error();
            save();
            return std::string();
        }
        if (w.size() == 2 && w[0] == "del") {
            if (auto r = gw_.del_iface(w[1]); !r)
                return r.error();
            save();
            return std::string();
        }
        return make_error("iface: expected `add DEV role protected|public`, `del DEV` or `list`");
    }

    std::string stats_json() override { return gw_.stats_json().dump(); }

    // Writes the state file when the configuration changed or an output counter is halfway
    // through the margin the file reserved for it.
    void save_if_due()
    {
        bool due = false;
        Config now = gw_.running_config(0);
        for (const auto &sa : now.sas) {
            uint64_t o = uint64_t(sa.oseq_hi) << 32 | sa.oseq;
            auto it = reserved_.find(describe_sa(sa.dst, sa.spi));
            uint64_t r = it == reserved_.end() ? 0 : it->second;
            due |= o && o + kStateSeqMargin / 2 > r;
        }
        if (due)
            save();
    }

    void save()
    {
        if (state_path_.empty())
            return;
        GatewayState st;
        st.config = gw_.running_config(kStateSeqMargin);
        for (const auto &i : gw_.ifaces())
            if (!i.local)                   // made afresh at each start
                st.ifaces.emplace_back(i.name, i.role);
        if (auto r = save_state(state_path_, st); !r) {
            log(LogLevel::Error, "%s; sequence numbers will not survive a restart",
                r.error().message.c_str());
            return;
        }
        reserved_.clear();
        for (const auto &sa : st.config.sas)
            reserved_[describe_sa(sa.dst, sa.spi)] = uint64_t(sa.oseq_hi) << 32 | sa.oseq;
    }

protected:
    Result<void> commit(Config next) override
    {
        if (auto r = gw_.apply(next); !r)
            return r;
        auto r = ConfigHandler::commit(std::move(next));
        save();
        return r;
    }

private:
    Result<std::string> iface_list()
    {
        std::string out;
        for (const auto &i : gw_.ifaces())
            if (!i.local)
                out += i.name + " role " + (i.role == IfaceRole::Public ? "public" : "protected") +
                   " queues " + std::to_string(i.queues) + " mtu " + std::to_string(i.mtu) + "\n";
        return out;
    }

    Gateway &gw_;
    std::string state_path_;
    std::map<std::string, uint64_t> reserved_;      // output counters the file covers
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
    bool check = false;
};

// What to start with: the state file (a restart) and/or the config file.
GatewayState initial_state(const DaemonOptions &o, const std::string &state_path)
{
    GatewayState st;
    if (!state_path.empty()) {
        auto saved = load_state(state_path);
        if (!saved)
            throw Failure(saved.error().message);
        if (*saved) {
            st = std::move(**saved);
            log(LogLevel::Info, "resuming from %s: %zu SAs, %zu policies, %zu interfaces",
                state_path.c_str(), st.config.sas.size(), st.config.policies.size(),
                st.ifaces.size());
        }
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
    if (!state_path.empty())
        ::mkdir(parent_dir(state_path).c_str(), 0700);
    GatewayState st = initial_state(o, state_path);

    GatewayOptions go;
    go.backend = *backend;
    go.ring_size = o.ring_size;
    go.busy_poll = o.busy_poll;
    go.pmtu_expires_s = o.pmtu_expires;
    auto gw = Gateway::create(st.config, go);
    if (!gw)
        throw Failure(gw.error().message);
    GatewayHandler handler(**gw, st.config, state_path);
    auto server = ControlServer::listen(handler, o.socket);
    if (!server)
        throw Failure(server.error().message);
    for (const auto &[name, role] : st.ifaces)
        if (auto r = (*gw)->add_iface(name, role); !r)
            log(LogLevel::Error, "%s (from the state file)", r.error().message.c_str());
    handler.save();

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    log(LogLevel::Info, "running: control socket %s, state %s, crypto %s", o.socket.c_str(),
        state_path.empty() ? "(none)" : state_path.c_str(), o.crypto.c_str());

    // Packets first; the control socket, routing events and completions once a millisecond;
    // when nothing came in for `spin` rounds, sleep until a socket has something.
    Gateway &g = **gw;
    uint64_t last_save = now_ms(), last_house = 0;
    uint32_t idle = 0;
    std::vector<pollfd> pfds;
    while (!g_stop) {
        size_t moved = g.poll_data();
        uint64_t now = now_ms();
        if (now != last_house) {
            last_house = now;
            g.housekeeping();
            if (auto r = server->poll_once(0); !r)
                log(LogLevel::Warning, "control socket: %s", r.error().message.c_str());
            if (now - last_save >= 1000) {
                last_save = now;
                handler.save_if_due();
            }
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
        ::poll(pfds.data(), pfds.size(), 10);
    }
    log(LogLevel::Info, "stopping: saving the state");
    handler.save();
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
                    "control socket (default: $XESP_SOCKET, else " +
                        std::string(kDefaultControlSocket) + ")");
    sub->add_option("--state", o->state,
                    "state file (default: /var/lib/xesp/<socket name>.state)");
    sub->add_flag("--no-state", o->no_state, "neither read nor write a state file");
    sub->add_option("--crypto", o->crypto, "auto, openssl or ipsecmb");
    sub->add_option("--ring-size", o->ring_size, "entries in each AF_XDP ring (a power of two)");
    sub->add_flag("--busy-poll", o->busy_poll, "busy-poll the sockets instead of waiting");
    sub->add_option("--spin", o->spin,
                    "empty polling rounds before sleeping (0: sleep as soon as idle)");
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
