// Ordered parallel work: crypto on a pool of worker threads, finished in each SA's order.
//
// The flow, for one burst on the thread that owns the sockets (the io thread):
//   1. The io thread classifies the burst and runs each SA's serial prepare step (sequence
//      numbers, replay pre-check) itself: one thread, so an SA's steps are serial. It decides
//      there what goes where in each frame, but leaves the writing of the headers and trailer
//      (tunnel mode) to the thread that encrypts it: a frame's line that one thread writes
//      and another then reads moves between their caches, and with two cores that cost the
//      io thread more than its own work.
//   2. The burst's crypto becomes a Job whose keys are its SAs (Job::keys). The pool keeps,
//      for each key (hashed into 4096 order slots), the last job in flight that has it; the
//      new job is linked behind each of those it finds (Job::next) and counts them
//      (Job::waits): per-SA ordered queues through which a job may run in several at once,
//      at a cost of a slot and a link per key, whatever the number of SAs. Two keys that
//      share a slot only order more than they must.
//   3. submit() hands the job to the next worker thread with room, round robin, through a
//      bounded single-producer single-consumer ring (spsc_ring.h), up to a limit of weight
//      (packets) that keeps few frames waiting. A worker without room (stalled, or slow) is
//      passed over. When none has room, worker 0, the io thread itself, runs the job at once:
//      it has the serial steps and the I/O to do and helps with the crypto only when the
//      workers are behind, so the load balances itself. When it has no room either (kDepth
//      jobs run since the last reap()), submit() refuses the job and the caller reaps, or
//      drops and counts it. Nothing waits for a worker, and a stalled worker holds up only
//      its own jobs and those after them that share an SA with them or with a job that
//      waits.
//   4. A worker runs the job (the headers of step 1, then one call to the cipher for the
//      whole burst, in place in the frames) and pushes it back on its own completion ring.
//   5. reap() takes the completions and marks each job done. A done job that waits for no
//      earlier one is finished at once; each job linked behind it waits for one fewer, and is
//      finished in turn if that leaves it waiting for none and it is done. The serial finish
//      step (replay window, lifetimes, counters) sees an SA's packets in the order they
//      arrived, whatever order the workers ended in; bursts of other SAs do not wait for it.
//   6. No lock and no allocation on this path: jobs come from the caller's fixed pool, rings are
//      fixed arrays, and a worker with nothing to do sleeps on a futex (std::atomic::wait) that
//      the io thread touches only when the worker said it was going to sleep.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "userspace/base/result.h"
#include "userspace/pipeline/spsc_ring.h"

namespace xesp {

struct Job {
    static constexpr size_t kMaxKeys = 64;  // a burst's SAs
    // The caller's: the work (on a worker), and what it keeps order with: jobs that share a key
    // are finished in the order they were submitted, others as they are done (none: at once).
    void (*run)(Job &) = nullptr;
    uint64_t keys[kMaxKeys];
    uint32_t nkeys = 0;
    uint32_t weight = 1;  // what it counts against a worker's limit (its packets, say)
    // The pool's, on the io thread only.
    uint16_t slot[kMaxKeys];  // each key's order slot
    uint64_t own = 0;         // the keys whose slot no key before them has
    uint64_t linked = 0;      // the keys of those with a next job in flight in their slot
    Job *next[kMaxKeys];      // which
    uint32_t waits = 0;       // earlier jobs in flight it shares a slot with
    bool done = false;
    uint16_t worker = 0;
    Job *ready = nullptr;  // reap()'s list of jobs to finish
};

struct PoolStats {
    uint64_t jobs = 0;     // run by this worker
    uint64_t weight = 0;   // their weight (packets, say)
    uint64_t passed = 0;   // sent elsewhere: this worker's queue was full
    uint64_t busy_ns = 0;  // time in Job::run, if the pool is timed
};

class OrderedPool {
public:
    static constexpr size_t kDepth = 256;  // jobs in flight per worker thread
    static constexpr unsigned kMaxWorkers = 64;
    static constexpr unsigned kSlotBits = 12;  // 4096 order slots

    // `workers` counts the io thread: 1 runs everything on it, with no thread. cpus, if not
    // empty, pins the workers i >= 1 to cpus[1..] in turn, or to cpus[0] if that is all
    // (cpus[0] is the io thread's, for the caller to pin). A worker takes at most kDepth jobs and `limit` weight (Job::weight) at
    // a time: a deep queue of big jobs only adds latency and cache misses (frames go cold
    // while they wait). `timed`: each worker adds up the time its jobs take (two clock reads
    // a job), for PoolStats::busy_ns.
    static Result<std::unique_ptr<OrderedPool>> create(unsigned workers,
                                                       const std::vector<int> &cpus = {},
                                                       size_t limit = kDepth, bool timed = false);
    ~OrderedPool();
    OrderedPool(const OrderedPool &) = delete;
    OrderedPool &operator=(const OrderedPool &) = delete;

    // The io thread's. submit() links the job behind those in flight it shares keys with and
    // hands it to a worker thread with room, round robin, else to the io thread; false: no
    // room anywhere (step 3), the job is not taken.
    // submit_to() asks for one worker (tests), and false when that one has no room.
    bool submit(Job &j);
    bool submit_to(Job &j, unsigned worker);
    // Finishes, in each key's order, every job that can be: finish(Job &) for each. Returns
    // how many were finished.
    template <class Finish> size_t reap(Finish &&finish)
    {
        size_t n = 0;
        Job *j;
        for (auto &w : workers_)
            while (w->done.pop(&j))
                n += complete(*j, finish);
        for (size_t i = 0; i < inline_n_; i++)
            n += complete(*inline_[i], finish);
        inline_n_ = 0;
        return n;
    }
    // The order slot of a key: keys that share one keep order with each other.
    static uint16_t slot_of(uint64_t key)
    {
        return uint16_t((key * 0x9e3779b97f4a7c15ull) >> (64 - kSlotBits));
    }
    // Jobs submitted and not finished yet.
    size_t in_flight() const { return in_flight_; }
    unsigned workers() const { return unsigned(workers_.size()) + 1; }
    // Per worker, 0 being the io thread. Read on the io thread; a worker's `jobs` is exact
    // once reap() has seen its jobs.
    PoolStats stats(unsigned worker) const;

private:
    struct Worker {
        SpscRing<Job *, kDepth> todo;  // io -> worker
        SpscRing<Job *, kDepth> done;  // worker -> io
        std::atomic<uint32_t> wake{0};
        std::atomic<bool> sleeping{false};
        std::atomic<bool> stop{false};
        bool timed = false;
        std::atomic<uint64_t> busy_ns{0};  // the worker's; read anywhere
        size_t owed = 0;                   // the io thread's: jobs submitted, not yet reaped
        size_t owed_weight = 0;            // and their weight
        PoolStats stats;                   // the io thread's
        std::thread thread;
    };
    OrderedPool() = default;
    static void run_worker(Worker &w);
    bool room(unsigned worker) const;
    void hand(Job &j, unsigned worker);

    template <class Finish> size_t complete(Job &j, Finish &finish)
    {
        if (j.worker) {
            Worker &w = *workers_[j.worker - 1];
            w.owed--;
            w.owed_weight -= j.weight;
        }
        j.done = true;
        if (j.waits)
            return 0;
        size_t n = 0;
        j.ready = nullptr;
        for (Job *ready = &j; ready;) {
            Job *at = ready;
            ready = at->ready;
            in_flight_--;
            for (uint64_t m = at->own; m; m &= m - 1) {
                unsigned k = unsigned(__builtin_ctzll(m));
                if (!(at->linked >> k & 1)) {
                    slots_[at->slot[k]] = nullptr;  // the last in flight in this slot
                    continue;
                }
                Job *next = at->next[k];
                if (--next->waits == 0 && next->done) {
                    next->ready = ready;
                    ready = next;
                }
            }
            finish(*at);
            n++;
        }
        return n;
    }

    Job *slots_[1u << kSlotBits] = {};  // the last job in flight in each order slot

    std::vector<std::unique_ptr<Worker>> workers_;  // threads: workers 1..N-1
    Job *inline_[kDepth];                           // run on the io thread, waiting for reap()
    size_t inline_n_ = 0;
    PoolStats inline_stats_;
    unsigned next_ = 0;  // round robin
    size_t limit_ = kDepth;
    bool timed_ = false;
    size_t in_flight_ = 0;
};

}  // namespace xesp
