// `xesp daemon`: the gateway (gateway.h) in the foreground, with the control socket that
// `xesp sa|policy|iface|stats` talk to and the state file (state_keeper.h). Logs go to stderr,
// one line per event (log.h).
//
// Two threads: the data thread forwards, and the control thread serves the socket, builds each
// change and hands it over (handoff.h), so that a request, however large, costs forwarding
// only the moment of the swap. SIGTERM or SIGINT: the state is saved and run_daemon()
// returns. After a stop, as after a crash, the classifier stays attached and keeps protected
// traffic dropped (fail closed); the next start reads the state file and resumes.
// detach_on_exit, or `xesp iface del`, hands an interface back to the kernel.
#pragma once

#include <cstdint>
#include <string>

#include "userspace/gateway/gateway.h"
#include "userspace/kernel/pmtu.h"
#include "userspace/base/result.h"
#include "userspace/esp/seq_reserve.h"

namespace xesp {

struct DaemonOptions {
    std::string config_file;  // applied at start, over what the state file holds
    std::string socket;       // the control socket
    std::string state;        // "": default_state_file(socket)
    bool no_state = false;
    std::string crypto = "auto";
    uint32_t ring_size = kDefaultRingSize;
    bool busy_poll = false;
    uint32_t spin = 0;  // empty polling rounds before sleeping
    uint32_t pmtu_expires = kPmtuExpiresSeconds;
    bool detach_on_exit = false;
    uint64_t seq_reserve = ReservePolicy{}.min_ahead;
    uint32_t data_priority = 0;  // SCHED_FIFO priority of the data thread; 0: a normal thread
    unsigned workers = 0;        // crypto threads, the data thread included; 0: default_workers()
    std::string cpus;  // CPU list (cpu_list.h): the data thread on the first, workers on the rest
};

// /var/lib/xesp/<socket name>.state: two daemons with two sockets (one per network
// namespace) keep two states.
std::string default_state_file(const std::string &socket);

// Runs until SIGTERM or SIGINT; an error when it cannot start (the kernel lacks something, the
// state file is another's, a socket or interface cannot be had), saying what.
Result<void> run_daemon(const DaemonOptions &options);

}  // namespace xesp
