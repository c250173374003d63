// The clock of everything that ages: path MTUs, rate limits, SA lifetimes.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace xesp {

inline constexpr uint64_t kSecondNs = 1'000'000'000;

// CLOCK_MONOTONIC in nanoseconds: unaffected by changes to the wall clock.
inline uint64_t now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * kSecondNs + uint64_t(ts.tv_nsec);
}

// The same clock for code that keeps std::chrono time points and durations (deadlines).
using Clock = std::chrono::steady_clock;
static_assert(Clock::is_steady, "CLOCK_MONOTONIC");

}  // namespace xesp
