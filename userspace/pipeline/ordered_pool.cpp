#include "userspace/pipeline/ordered_pool.h"

#include <string>

#include "userspace/base/clock.h"
#include "userspace/base/cpu_list.h"

namespace xesp {

namespace {

constexpr int kSpins = 20000;  // polls of an empty queue before a worker sleeps

inline void cpu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

}  // namespace

Result<std::unique_ptr<OrderedPool>>
OrderedPool::create(unsigned workers, const std::vector<int> &cpus, size_t limit, bool timed)
{
    if (workers < 1 || workers > kMaxWorkers)
        return make_error("workers: " + std::to_string(workers) + " is not between 1 and " +
                          std::to_string(kMaxWorkers));
    if (limit < 1)
        return make_error("workers: a worker's limit must be at least 1");
    std::unique_ptr<OrderedPool> pool(new OrderedPool);
    pool->limit_ = limit;
    pool->timed_ = timed;
    for (unsigned i = 1; i < workers; i++) {
        auto w = std::make_unique<Worker>();
        w->timed = timed;
        w->thread = std::thread(run_worker, std::ref(*w));
        if (!cpus.empty()) {
            // cpus[0] is the io thread's: the workers go round the others, if there are any.
            int cpu = cpus.size() > 1 ? cpus[1 + (i - 1) % (cpus.size() - 1)] : cpus[0];
            if (auto r = pin_to_cpu(cpu, w->thread.native_handle()); !r) {
                w->stop.store(true);
                w->wake.fetch_add(1);
                w->wake.notify_one();
                w->thread.join();
                return make_error("workers: worker " + std::to_string(i) + ": " +
                                  r.error().message);
            }
        }
        pool->workers_.push_back(std::move(w));
    }
    return pool;
}

OrderedPool::~OrderedPool()
{
    for (auto &w : workers_) {
        w->stop.store(true, std::memory_order_seq_cst);
        w->wake.fetch_add(1, std::memory_order_seq_cst);
        w->wake.notify_one();
    }
    for (auto &w : workers_)
        w->thread.join();
}

void OrderedPool::run_worker(Worker &w)
{
    Job *j;
    int idle = 0;
    while (!w.stop.load(std::memory_order_acquire)) {
        if (w.todo.pop(&j)) {
            if (w.timed) {
                uint64_t t0 = now_ns();
                j->run(*j);
                w.busy_ns.store(w.busy_ns.load(std::memory_order_relaxed) + (now_ns() - t0),
                                std::memory_order_relaxed);
            } else {
                j->run(*j);
            }
            // Room is certain: the io thread keeps at most kDepth jobs owed by a worker.
            w.done.push(j);
            idle = 0;
            continue;
        }
        if (++idle < kSpins) {
            cpu_relax();
            continue;
        }
        // Going to sleep: say so, read the count of pushes, look once more, and sleep only if
        // the count has not moved. The io thread counts a push, then reads `sleeping`; all
        // four seq_cst, so either this thread's read of the count comes after the io thread's
        // increment (and sees its push), or the io thread's read of `sleeping` comes after
        // this thread's store (and it wakes this thread).
        w.sleeping.store(true, std::memory_order_seq_cst);
        uint32_t seen = w.wake.load(std::memory_order_seq_cst);
        if (w.todo.empty() && !w.stop.load(std::memory_order_seq_cst))
            w.wake.wait(seen, std::memory_order_seq_cst);
        w.sleeping.store(false, std::memory_order_relaxed);
        idle = 0;
    }
}

bool OrderedPool::room(unsigned worker) const
{
    if (worker == 0)
        return inline_n_ < kDepth;
    const Worker &w = *workers_[worker - 1];
    // An empty worker takes any job, however heavy.
    return w.owed < kDepth && (w.owed == 0 || w.owed_weight < limit_);
}

void OrderedPool::hand(Job &j, unsigned worker)
{
    // Behind the last job in flight in each of its keys' slots.
    j.done = false;
    j.waits = 0;
    j.own = j.linked = 0;
    j.worker = uint16_t(worker);
    static_assert(Job::kMaxKeys <= 64);
    for (uint32_t k = 0; k < j.nkeys; k++) {
        uint16_t s = slot_of(j.keys[k]);
        Job *last = slots_[s];
        if (last == &j)  // a key before this one has the slot
            continue;
        j.slot[k] = s;
        j.own |= uint64_t(1) << k;
        slots_[s] = &j;
        if (!last)
            continue;
        // Linked behind last, at last's key with the slot.
        for (uint64_t m = last->own & ~last->linked; m; m &= m - 1) {
            unsigned at = unsigned(__builtin_ctzll(m));
            if (last->slot[at] == s) {
                last->next[at] = &j;
                last->linked |= uint64_t(1) << at;
                break;
            }
        }
        j.waits++;
    }
    in_flight_++;
    if (worker == 0) {
        uint64_t t0 = timed_ ? now_ns() : 0;
        j.run(j);
        if (timed_)
            inline_stats_.busy_ns += now_ns() - t0;
        inline_[inline_n_++] = &j;
        inline_stats_.jobs++;
        inline_stats_.weight += j.weight;
        return;
    }
    Worker &w = *workers_[worker - 1];
    w.owed++;
    w.owed_weight += j.weight;
    w.stats.jobs++;
    w.stats.weight += j.weight;
    w.todo.push(&j);                                 // room is certain: owed < kDepth
    w.wake.fetch_add(1, std::memory_order_seq_cst);  // see run_worker()
    if (w.sleeping.load(std::memory_order_seq_cst))
        w.wake.notify_one();
}

bool OrderedPool::submit_to(Job &j, unsigned worker)
{
    if (worker >= workers() || !room(worker))
        return false;
    hand(j, worker);
    return true;
}

bool OrderedPool::submit(Job &j)
{
    // The worker threads in turn, passing over those without room; the io thread runs the job
    // itself only when none has room. It has the serial steps and the I/O to do, so it takes
    // crypto only when the workers are behind: the load balances itself, whatever share of a
    // packet's time the serial steps are.
    const unsigned n = unsigned(workers_.size());
    for (unsigned k = 0; k < n; k++) {
        unsigned w = (next_ + k) % n;
        if (room(w + 1)) {
            next_ = (w + 1) % n;
            hand(j, w + 1);
            return true;
        }
        workers_[w]->stats.passed++;
    }
    if (room(0)) {
        hand(j, 0);
        return true;
    }
    inline_stats_.passed++;
    return false;
}

PoolStats OrderedPool::stats(unsigned worker) const
{
    if (worker == 0)
        return inline_stats_;
    if (worker >= workers())
        return PoolStats{};
    PoolStats s = workers_[worker - 1]->stats;
    s.busy_ns = workers_[worker - 1]->busy_ns.load(std::memory_order_relaxed);
    return s;
}

}  // namespace xesp
