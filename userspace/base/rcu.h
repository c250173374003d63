// Read-mostly tables shared between the threads that forward packets (readers) and the one
// thread that changes them (the writer), without a lock or a write on the readers' side
// beyond one store per burst.
//
// The scheme is quiescent-state-based reclamation (QSBR, as liburcu's urcu-qsbr and the
// kernel's RCU): a reader holds pointers into the tables only within a burst, and between two
// bursts says so (Qsbr::Reader::quiescent()), or before it blocks (offline()). A writer that
// has unlinked something calls synchronize(), which returns once every reader has passed such
// a point since: nobody can hold the old thing any more, and it may be freed or changed.
//
// LeftRight<T> (Ramalhete and Correia's left-right technique) builds tables on it: two copies
// of T, readers on the live one; a change is made to the other copy, published with one
// pointer store, and after synchronize() made again to the first. Readers never see a
// half-made change, whatever its size (a batch is one publish), the writer's cost is that of
// the change (twice), and T can be any single-threaded structure (hash maps that rehash,
// vectors that grow).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <thread>

namespace xesp {

class Qsbr {
    static constexpr uint64_t kOffline = 0;
    struct alignas(64) Slot {
        std::atomic<uint64_t> seen{kOffline};
        std::atomic<bool> used{false};
        std::atomic<std::thread::id> owner{};
    };

public:
    static constexpr size_t kMaxReaders = 64;

    // A reader thread's registration, for the thread's life (or the object's).
    class Reader {
    public:
        explicit Reader(Qsbr &domain);
        ~Reader();
        Reader(const Reader &) = delete;
        Reader &operator=(const Reader &) = delete;

        // Holds no pointer from before: a writer waiting in synchronize() may go on.
        void quiescent() { slot_->seen.store(domain_.epoch_.load(), std::memory_order_seq_cst); }
        // Holds none until online(): the writer does not wait for this reader.
        void offline() { slot_->seen.store(kOffline, std::memory_order_seq_cst); }
        void online() { quiescent(); }

    private:
        Qsbr &domain_;
        Slot *slot_;
    };

    // Returns once every reader registered now has been quiescent or offline since the call
    // began. The calling thread, if it is a reader itself, counts as quiescent: it is in no
    // burst while it changes tables.
    void synchronize();
    // Whether a writer waits in synchronize() now: for a reader that may hold pointers
    // across its rounds (work in flight on other threads) and is quiescent only when it
    // holds none, to make sure that it soon holds none.
    bool writer_waiting() const { return waiting_.load(std::memory_order_relaxed) != 0; }

    size_t readers() const;

private:
    std::atomic<uint64_t> epoch_{1};
    std::atomic<uint32_t> waiting_{0};
    std::array<Slot, kMaxReaders> slots_;
};

// Two copies of T for readers and one writer (see the top of this file).
//
// Readers: read() at the start of a burst, and use that copy until their next quiescent state.
// The writer: change(fn) calls fn on the copy readers are not on, publishes it, waits until no
// reader is on the other, and calls fn on that one too; fn must do the same to both (it may
// not depend on anything that changes between the two calls). standby() is the writer's view
// between changes (equal to the live copy). Without a domain there are no other threads: both
// copies change at once.
template <typename T> class LeftRight {
public:
    explicit LeftRight(Qsbr *domain = nullptr) : domain_(domain) {}
    LeftRight(const LeftRight &) = delete;
    LeftRight &operator=(const LeftRight &) = delete;

    const T &read() const { return *live_.load(std::memory_order_seq_cst); }
    // On the writer's thread only.
    const T &standby() const { return copies_[other()]; }

    template <typename F> void change(F &&fn)
    {
        T &next = copies_[other()];
        fn(next);
        T *old = live_.load(std::memory_order_relaxed);
        live_.store(&next, std::memory_order_seq_cst);
        if (domain_)
            domain_->synchronize();
        fn(*old);
    }

    Qsbr *domain() const { return domain_; }

private:
    size_t other() const { return live_.load(std::memory_order_relaxed) == &copies_[0] ? 1 : 0; }

    Qsbr *domain_;
    T copies_[2];
    std::atomic<T *> live_{&copies_[0]};
};

}  // namespace xesp
