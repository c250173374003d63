// A bounded ring between exactly two threads: one pushes, the other pops. No lock: each side
// owns one index and reads the other's with acquire, the classic Lamport queue (as DPDK's
// rte_ring in single-producer/single-consumer mode). Each index sits on its own cache line,
// with a copy of the other side's index kept by each side, so that a push or a pop reads the
// other side's line only when its copy says the ring looks full or empty.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace xesp {

template <class T, size_t N> class SpscRing {
    static_assert(N >= 2 && (N & (N - 1)) == 0, "a power of two");

public:
    static constexpr size_t kCapacity = N;

    // Producer: false when full (nothing taken).
    bool push(const T &v)
    {
        uint64_t t = tail_.v.load(std::memory_order_relaxed);
        if (t - head_seen_ == N) {
            head_seen_ = head_.v.load(std::memory_order_acquire);
            if (t - head_seen_ == N)
                return false;
        }
        slots_[t & (N - 1)] = v;
        tail_.v.store(t + 1, std::memory_order_release);
        return true;
    }

    // Consumer: false when empty.
    bool pop(T *v)
    {
        uint64_t h = head_.v.load(std::memory_order_relaxed);
        if (h == tail_seen_) {
            tail_seen_ = tail_.v.load(std::memory_order_acquire);
            if (h == tail_seen_)
                return false;
        }
        *v = slots_[h & (N - 1)];
        head_.v.store(h + 1, std::memory_order_release);
        return true;
    }

    // Either side, as a hint: what the other side may change at once.
    bool empty() const
    {
        return head_.v.load(std::memory_order_acquire) == tail_.v.load(std::memory_order_acquire);
    }

private:
    struct alignas(64) Index {
        std::atomic<uint64_t> v{0};
    };
    Index head_;                          // the consumer's
    alignas(64) uint64_t tail_seen_ = 0;  // the consumer's copy of tail_
    Index tail_;                          // the producer's
    alignas(64) uint64_t head_seen_ = 0;  // the producer's copy of head_
    alignas(64) T slots_[N];
};

}  // namespace xesp
