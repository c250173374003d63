#include "userspace/gateway/handoff.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>
#include <utility>

namespace xesp {

Result<std::unique_ptr<Handoff>> Handoff::create()
{
    std::unique_ptr<Handoff> h(new Handoff());
    h->efd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->efd_ < 0)
        return make_error(std::string("eventfd: ") + std::strerror(errno));
    return h;
}

Handoff::~Handoff()
{
    if (efd_ >= 0)
        ::close(efd_);
}

void Handoff::call(const std::function<void()> &fn)
{
    std::lock_guard<std::mutex> one(callers_);
    std::unique_lock<std::mutex> lk(mu_);
    fn_ = &fn;
    done_ = false;
    pending_.store(true, std::memory_order_release);
    uint64_t one_event = 1;
    (void)!::write(efd_, &one_event, sizeof one_event);
    cv_.wait(lk, [this] { return done_; });
    fn_ = nullptr;
    if (auto e = std::exchange(error_, nullptr))
        std::rethrow_exception(e);  // the caller's, not the data thread's
}

void Handoff::run()
{
    // The caller holds mu_ from setting pending_ to writing the eventfd: once we have the
    // lock, the write is done and this read empties the counter (it must not stay readable,
    // or an idle data thread's poll() would return at once, round after round).
    std::lock_guard<std::mutex> lk(mu_);
    uint64_t events;
    (void)!::read(efd_, &events, sizeof events);
    pending_.store(false, std::memory_order_relaxed);
    try {
        (*fn_)();
    } catch (...) {
        error_ = std::current_exception();
    }
    done_ = true;
    cv_.notify_all();
}

}  // namespace xesp
