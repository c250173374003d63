// Ordered parallel work: crypto on a pool of worker threads, finished in each SA's order.
//
// The flow, for one burst on the thread that owns the sockets (the io thread):
//   1. The io thread classifies the burst and runs each SA's serial prepare step (sequence
//      numbers, replay pre-check) itself: one thread, so an SA's steps are serial.
//   2. Each SA's group of the burst becomes a Job, chained behind the jobs of the same SA still
//      in flight (Job::next, from the SA's tail slot, Job::tail): a per-SA ordered queue that
//      costs two pointers, whatever the number of SAs.
//   3. submit() hands the job to the next worker thread with room, round robin, through a
//      bounded single-producer single-consumer ring (spsc_ring.h), up to a limit of weight
//      (packets) that keeps few frames waiting. A worker without room (stalled, or slow) is
//      passed over. When none has room, worker 0, the io thread itself, runs the job at once:
//      it has the serial steps and the I/O to do and helps with the crypto only when the
//      workers are behind, so the load balances itself. When it has no room either (kDepth
//      jobs run since the last reap()), submit() refuses the job and the caller reaps, or
//      drops and counts it. Nothing waits for a worker, and a stalled worker holds up only
//      its own jobs and those behind them in the same chain.
//   4. A worker runs the job (one call to the cipher for the whole group, in place in the
//      frames) and pushes it back on its own completion ring.
//   5. reap() takes the completions and marks each job done. A job whose SA has no earlier job
//      in flight (the head of its chain) is finished at once, then the jobs behind it that are
//      done too, in order: the serial finish step (replay window, lifetimes, counters) sees an
//      SA's packets in the order they arrived, whatever order the workers ended in.
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
    // The caller's: the work (on a worker), and where its SA keeps the tail of its chain
    // (nullptr before the first job; the pool's thereafter, on the io thread only).
    void (*run)(Job &) = nullptr;
    Job **tail = nullptr;
    uint32_t weight = 1;  // what it counts against a worker's limit (its packets, say)
    // The pool's, on the io thread only.
    Job *next = nullptr;  // the next job of the same SA
    bool head = false;    // no earlier job of its SA in flight
    bool done = false;
    uint16_t worker = 0;
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

    // The io thread's. submit() takes the job into its SA's chain and onto a worker thread
    // with room, round robin, else onto the io thread; false: no room anywhere (step 3), the
    // job is not taken.
    // submit_to() asks for one worker (tests), and false when that one has no room.
    bool submit(Job &j);
    bool submit_to(Job &j, unsigned worker);
    // Finishes, in each SA's order, every job that can be: finish(Job &) for each. Returns how
    // many were finished.
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
        size_t n = 0;
        for (Job *at = &j; at && at->head && at->done;) {
            Job *next = at->next;
            Job **tail = at->tail;
            in_flight_--;
            if (next)
                next->head = true;
            else
                *tail = nullptr;  // the SA has nothing in flight any more
            finish(*at);
            n++;
            at = next;
        }
        return n;
    }

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
