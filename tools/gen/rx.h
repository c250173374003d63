// The receiving side of xesp-gen: gen_rx.bpf.c on an interface counts and drops the bench
// packets that arrive (through a bpf_link, so it goes away with this process), and the counts
// are read every kPollMs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "userspace/base/result.h"

namespace xesp::gen {

struct RxOptions {
    std::string dev;
    double seconds = 10;  // longest run
    double idle = 1;      // stop once packets came and then none for this long
};

struct RxResult {
    uint64_t packets = 0;
    uint64_t bytes = 0;  // frame bytes without FCS
    // From the last poll that saw no packet yet to the first poll that saw the final count:
    // the time the packets took to arrive, overstated by at most two poll periods.
    double active_seconds = 0;
    double seconds = 0;  // the whole run
};

// Calls on_attached once the program counts.
Result<RxResult> run_rx(const RxOptions &options, const std::atomic<bool> &stop,
                        const std::function<void()> &on_attached);

}  // namespace xesp::gen
