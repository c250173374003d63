// Which of the daemon's threads the scheduler runs first when the cores are busy. The data
// thread forwards packets; the others (control requests, state writes) can wait a few
// milliseconds without anyone noticing, while a packet held as long is a gap in every flow.
// So the others run at a lower priority (a higher nice value) than the data thread, and the
// data thread may be given a real-time priority (SCHED_FIFO): it then preempts every normal
// thread as soon as a packet wakes it. A real-time thread that never sleeps would hold its
// core (the kernel's RT throttling leaves others 5 %): only with the default loop, which
// sleeps when idle.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "userspace/base/result.h"

namespace xesp {

// The nice value of the daemon's threads other than the data thread.
inline constexpr int kBackgroundNice = 10;

// The calling thread (not its process) at `nice`.
inline Result<void> set_thread_nice(int nice)
{
    if (::setpriority(PRIO_PROCESS, pid_t(::syscall(SYS_gettid)), nice) != 0)
        return make_error(
            std::string("cannot set the thread's nice value: ") + std::strerror(errno), errno);
    return {};
}

// The calling thread under SCHED_FIFO at `priority` (1-99).
inline Result<void> set_thread_fifo(int priority)
{
    sched_param p{};
    p.sched_priority = priority;
    if (int err = ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &p); err != 0)
        return make_error(std::string("cannot give the data thread real-time priority ") +
                              std::to_string(priority) + ": " + std::strerror(err),
                          err);
    return {};
}

}  // namespace xesp
