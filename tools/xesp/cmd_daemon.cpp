// `xesp daemon`: the command line of the gateway daemon (userspace/gateway/daemon.h).
#include <cstdio>

#include "bpf/kernel_probe.h"
#include "tools/xesp/commands.h"
#include "userspace/gateway/daemon.h"

namespace xesp::cli {

namespace {

// What the gateway needs from the kernel, in one line.
void check_kernel()
{
    if (auto r = probe_kernel(); !r)
        throw Failure(r.error().message);
    std::printf("kernel %s: has what xesp needs\n", kernel_release().c_str());
}

}  // namespace

void register_daemon_command(CLI::App &app)
{
    auto o = std::make_shared<DaemonOptions>();
    auto check = std::make_shared<bool>(false);
    o->socket = default_socket();
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
    sub->add_option("--data-priority", o->data_priority,
                    "run the data thread under SCHED_FIFO at this priority (1-99), ahead of "
                    "every normal thread; default: a normal thread (the daemon's other "
                    "threads run at nice 10 either way)")
        ->check(CLI::Range(1u, 99u));
    sub->add_option("--workers", o->workers,
                    "threads that run the crypto, the data thread included (default: half the "
                    "CPUs this process may use, at least 1; 1: the data thread alone)")
        ->check(CLI::Range(1u, 64u));
    sub->add_option("--cpus", o->cpus,
                    "CPUs for the workers, as 0,2,4-7: the data thread on the first, the other "
                    "workers on the rest in turn; default: the scheduler's choice");
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
    sub->add_flag("--check", *check,
                  "only check that this kernel has what the gateway needs, and exit");
    sub->callback([o, check] {
        if (*check)
            return check_kernel();
        if (auto r = run_daemon(*o); !r)
            throw Failure(r.error().message);
    });
}

}  // namespace xesp::cli
