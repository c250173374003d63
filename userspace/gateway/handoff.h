// Runs work on the data thread for another thread, between two bursts: how the control
// thread changes what only the data thread may touch (interfaces) or asks it for what only
// it may read (its counters, its SAs' runtime state).
//
//   control thread                        data thread
//   call(fn): fn posted, eventfd written   poll loop: serve() is one relaxed load per round;
//             waits ...                    the eventfd wakes it from poll() when idle
//                                          serve(): runs fn, says done
//   ... returns                            goes on with the next burst
//
// One call at a time: callers queue on a mutex. The data thread waits for nobody but a
// caller between posting its call and starting to wait for it (microseconds).
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "userspace/base/result.h"

namespace xesp {

class Handoff {
public:
    static Result<std::unique_ptr<Handoff>> create();
    ~Handoff();
    Handoff(const Handoff &) = delete;
    Handoff &operator=(const Handoff &) = delete;

    // Readable while a call waits: the data thread polls it with its sockets.
    int fd() const { return efd_; }

    // Not on the data thread: runs fn there and returns when it has run; what fn throws is
    // thrown here.
    void call(const std::function<void()> &fn);

    // Whether a call waits: one relaxed load.
    bool pending() const { return pending_.load(std::memory_order_relaxed); }

    // On the data thread, between bursts: runs what waits, if anything.
    void serve()
    {
        if (pending_.load(std::memory_order_acquire)) [[unlikely]]
            run();
    }

private:
    Handoff() = default;
    void run();

    int efd_ = -1;
    std::mutex callers_;  // one call at a time
    std::mutex mu_;
    std::condition_variable cv_;
    const std::function<void()> *fn_ = nullptr;
    bool done_ = false;
    std::exception_ptr error_;
    std::atomic<bool> pending_{false};
};

}  // namespace xesp
