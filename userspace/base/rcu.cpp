#include "userspace/base/rcu.h"

#include <time.h>

#include <cstdio>
#include <cstdlib>

namespace xesp {

Qsbr::Reader::Reader(Qsbr &domain) : domain_(domain), slot_(nullptr)
{
    for (Slot &s : domain.slots_) {
        bool expected = false;
        if (s.used.compare_exchange_strong(expected, true)) {
            s.owner.store(std::this_thread::get_id());
            slot_ = &s;
            break;
        }
    }
    if (!slot_) {
        std::fprintf(stderr, "xesp: more than %zu reader threads\n", kMaxReaders);
        std::abort();
    }
    online();
}

Qsbr::Reader::~Reader()
{
    offline();
    slot_->owner.store(std::thread::id());
    slot_->used.store(false, std::memory_order_release);
}

void Qsbr::synchronize()
{
    // Readers that stored an epoch at or after `target` have been quiescent since the
    // increment, which comes after whatever the caller unlinked.
    uint64_t target = epoch_.fetch_add(1, std::memory_order_seq_cst) + 1;
    waiting_.fetch_add(1, std::memory_order_relaxed);
    const std::thread::id self = std::this_thread::get_id();
    for (Slot &s : slots_) {
        if (!s.used.load(std::memory_order_acquire) || s.owner.load() == self)
            continue;
        for (unsigned spins = 0;; spins++) {
            uint64_t seen = s.seen.load(std::memory_order_seq_cst);
            if (seen == kOffline || seen >= target || !s.used.load(std::memory_order_acquire))
                break;
            if (spins < 64) {
                std::this_thread::yield();
            } else {
                timespec ts{0, 50'000};  // a burst takes tens of microseconds
                nanosleep(&ts, nullptr);
            }
        }
    }
    waiting_.fetch_sub(1, std::memory_order_relaxed);
}

size_t Qsbr::readers() const
{
    size_t n = 0;
    for (const Slot &s : slots_)
        n += s.used.load(std::memory_order_relaxed);
    return n;
}

}  // namespace xesp
