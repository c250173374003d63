#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "userspace/base/cpu_list.h"
#include "userspace/pipeline/ordered_pool.h"

using xesp::Job;
using xesp::OrderedPool;

namespace {

struct TestJob : Job {
    int sa = 0;  // its first key's
    uint64_t seq = 0;
    uint64_t seqs[4] = {};  // of each key: the job's place among those with that key
    uint32_t spin = 0;
    bool nap = false;                         // sleeps a millisecond: a worker stalls
    const std::atomic<bool> *gate = nullptr;  // waits until it opens: a worker stalls for long
    uint64_t work = 0;                        // written by the worker, read after reap
};

void run_test_job(Job &j)
{
    auto &t = static_cast<TestJob &>(j);
    uint64_t x = t.seq;
    for (uint32_t i = 0; i < t.spin; i++)
        x = x * 6364136223846793005ull + 1442695040888963407ull;
    if (t.nap)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    while (t.gate && !t.gate->load(std::memory_order_acquire))
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    t.work = x | 1;
}

// One key: in order with every job that has it.
void key(Job &j, uint64_t k)
{
    j.keys[0] = k;
    j.nkeys = 1;
}

std::unique_ptr<OrderedPool> make_pool(unsigned workers)
{
    auto p = OrderedPool::create(workers);
    REQUIRE(p);
    return std::move(*p);
}

// Reaps until pred() holds, for at most 10 s.
template <class Finish, class Pred> bool reap_until(OrderedPool &pool, Finish &&finish, Pred &&pred)
{
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!pred()) {
        if (std::chrono::steady_clock::now() > end)
            return false;
        if (!pool.reap(finish))
            std::this_thread::yield();
    }
    return true;
}

}  // namespace

TEST_CASE("an SA's jobs finish in the order they came, whatever order the workers end in",
          "[threads][pipeline]")
{
    // Each job a burst over one to four of the SAs.
    constexpr int kSas = 64;
    constexpr size_t kJobs = 60000, kPool = 2048;
    auto pool = make_pool(3);
    std::vector<TestJob> jobs(kPool);
    std::vector<TestJob *> free_jobs;
    for (auto &j : jobs)
        free_jobs.push_back(&j);
    std::vector<uint64_t> next_seq(kSas, 0), expect(kSas, 0);
    size_t finished = 0, out_of_order = 0, unrun = 0, early = 0;
    uint64_t latest = 0;  // the latest submitted of those finished so far
    auto finish = [&](Job &j) {
        auto &t = static_cast<TestJob &>(j);
        for (uint32_t k = 0; k < t.nkeys; k++) {
            out_of_order += t.seqs[k] != expect[t.keys[k]];
            expect[t.keys[k]] = t.seqs[k] + 1;
        }
        early += t.seq < latest;  // after a job submitted later: one with other SAs
        latest = std::max(latest, t.seq);
        unrun += t.work == 0;
        finished++;
        free_jobs.push_back(&t);
    };

    std::mt19937 rng(7);
    size_t refused = 0;
    for (size_t n = 0; n < kJobs;) {
        if (free_jobs.empty()) {
            pool->reap(finish);
            continue;
        }
        TestJob &t = *free_jobs.back();
        t.run = run_test_job;
        t.nkeys = 1 + rng() % 4;
        for (uint32_t k = 0; k < t.nkeys; k++) {
            bool again;
            do {
                t.keys[k] = rng() % kSas;
                again = false;
                for (uint32_t i = 0; i < k; i++)
                    again |= t.keys[i] == t.keys[k];
            } while (again);
            t.seqs[k] = next_seq[t.keys[k]];
        }
        t.seq = n;
        t.spin = rng() % 3000;
        t.nap = rng() % 4000 == 0;
        t.work = 0;
        if (!pool->submit(t)) {
            refused++;
            pool->reap(finish);
            continue;
        }
        free_jobs.pop_back();
        for (uint32_t k = 0; k < t.nkeys; k++)
            next_seq[t.keys[k]]++;
        n++;
        if (n % 32 == 0)
            pool->reap(finish);
    }
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
    CHECK(finished == kJobs);
    CHECK(out_of_order == 0);
    CHECK(unrun == 0);
    CHECK(early > 0);  // not one order for all
    for (int sa = 0; sa < kSas; sa++)
        CHECK(expect[sa] == next_seq[sa]);
    uint64_t by_threads = pool->stats(1).jobs + pool->stats(2).jobs;
    CHECK(by_threads + pool->stats(0).jobs == kJobs);
    CHECK(by_threads > 0);
}

TEST_CASE("a stalled worker holds up its own SA only", "[threads][pipeline]")
{
    auto pool = make_pool(3);
    std::atomic<bool> gate{false};
    std::vector<TestJob> x(4), y(100);
    std::vector<uint64_t> done_x, done_y;
    auto finish = [&](Job &j) {
        auto &t = static_cast<TestJob &>(j);
        (t.sa == 0 ? done_x : done_y).push_back(t.seq);
    };
    auto fill = [](TestJob &t, int sa, uint64_t seq) {
        t.run = run_test_job;
        key(t, uint64_t(sa));
        t.sa = sa;
        t.seq = seq;
    };
    fill(x[0], 0, 0);
    x[0].gate = &gate;
    REQUIRE(pool->submit_to(x[0], 1));
    for (uint64_t i = 1; i < x.size(); i++) {
        fill(x[i], 0, i);
        REQUIRE(pool->submit_to(x[i], 2));
    }
    for (uint64_t i = 0; i < y.size(); i++) {
        fill(y[i], 1, i);
        REQUIRE(pool->submit_to(y[i], i % 2 ? 2 : 0));
    }
    REQUIRE(reap_until(*pool, finish, [&] { return done_y.size() == y.size(); }));
    // X's later jobs are done on worker 2, and wait behind the stalled one.
    CHECK(done_x.empty());
    CHECK(pool->in_flight() == x.size());
    gate.store(true, std::memory_order_release);
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
    CHECK(done_x == std::vector<uint64_t>{0, 1, 2, 3});
    for (uint64_t i = 0; i < y.size(); i++)
        CHECK(done_y[i] == i);
}

TEST_CASE("bursts over several SAs: a stalled worker holds up only the bursts that share an SA "
          "with its own, after it",
          "[threads][pipeline]")
{
    auto pool = make_pool(3);
    std::atomic<bool> gate{false};
    // Jobs in the order submitted, with their SAs: 0 stalls on worker 1; 1, 3 and 4 share
    // an SA with it or with a job that waits for it; 2 and 5 do not (5 waits for 2 only).
    const std::vector<std::vector<uint64_t>> sas = {{10, 11}, {11, 12}, {13, 14},
                                                    {12},     {14, 10}, {15, 13, 16}};
    std::vector<TestJob> jobs(sas.size());
    std::vector<uint64_t> done;
    auto finish = [&](Job &j) { done.push_back(static_cast<TestJob &>(j).seq); };
    for (size_t i = 0; i < jobs.size(); i++) {
        TestJob &t = jobs[i];
        t.run = run_test_job;
        t.seq = i;
        t.nkeys = uint32_t(sas[i].size());
        std::copy(sas[i].begin(), sas[i].end(), t.keys);
        t.gate = i == 0 ? &gate : nullptr;
        REQUIRE(pool->submit_to(t, i == 0 ? 1 : 2));
    }
    REQUIRE(reap_until(*pool, finish, [&] { return done.size() == 2; }));
    CHECK(done == std::vector<uint64_t>{2, 5});
    for (int i = 0; i < 20; i++)  // done on worker 2, and still waiting
        pool->reap(finish);
    CHECK(done.size() == 2);
    CHECK(pool->in_flight() == 4);
    gate.store(true, std::memory_order_release);
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
    REQUIRE(done.size() == 6);
    // 0 first, then 1 before 3 (SA 12) and 0 before 4 (SA 10).
    CHECK(done[2] == 0);
    auto at = [&](uint64_t seq) { return std::find(done.begin(), done.end(), seq) - done.begin(); };
    CHECK(at(1) < at(3));
    // A job with no key waits for nothing.
    TestJob none;
    none.run = run_test_job;
    none.nkeys = 0;
    none.seq = 99;
    gate.store(false);
    jobs[0].gate = &gate;
    key(jobs[0], 1);
    REQUIRE(pool->submit_to(jobs[0], 1));
    REQUIRE(pool->submit_to(none, 2));
    REQUIRE(reap_until(*pool, finish, [&] { return done.back() == 99; }));
    gate.store(true, std::memory_order_release);
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
}

TEST_CASE("keys that share an order slot keep order with each other; in one job, once",
          "[threads][pipeline]")
{
    const uint64_t a = 1000;
    uint64_t b = a + 1;
    while (OrderedPool::slot_of(b) != OrderedPool::slot_of(a))
        b++;
    auto pool = make_pool(3);
    std::atomic<bool> gate{false};
    std::vector<TestJob> jobs(4);
    std::vector<uint64_t> done;
    auto finish = [&](Job &j) { done.push_back(static_cast<TestJob &>(j).seq); };
    // 0 {a} stalls; 1 {a, b}: both keys in one slot, one wait; 2 {b}: another key, the same
    // slot; 3 {b + 1}: another slot.
    const std::vector<std::vector<uint64_t>> keys = {{a}, {a, b}, {b}, {b + 1}};
    for (size_t i = 0; i < jobs.size(); i++) {
        TestJob &t = jobs[i];
        t.run = run_test_job;
        t.seq = i;
        t.nkeys = uint32_t(keys[i].size());
        std::copy(keys[i].begin(), keys[i].end(), t.keys);
        t.gate = i == 0 ? &gate : nullptr;
        REQUIRE(pool->submit_to(t, i == 0 ? 1 : 2));
    }
    REQUIRE(reap_until(*pool, finish, [&] { return done.size() == 1; }));
    CHECK(done == std::vector<uint64_t>{3});
    CHECK(pool->in_flight() == 3);
    gate.store(true, std::memory_order_release);
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
    CHECK(done == std::vector<uint64_t>{3, 0, 1, 2});
    // Nothing left in the slot: a job with both keys now waits for none.
    jobs[1].gate = &gate;
    REQUIRE(pool->submit_to(jobs[1], 2));
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
    CHECK(done.back() == 1);
}

TEST_CASE("a full worker is passed over; with no room anywhere, submit refuses",
          "[threads][pipeline]")
{
    constexpr size_t kDepth = OrderedPool::kDepth;
    auto pool = make_pool(2);
    std::atomic<bool> gate{false};
    std::vector<TestJob> jobs(2 * kDepth + 1);
    std::vector<uint64_t> done;
    auto finish = [&](Job &j) { done.push_back(static_cast<TestJob &>(j).seq); };
    for (uint64_t i = 0; i < jobs.size(); i++) {
        TestJob &t = jobs[i];
        t.run = run_test_job;
        key(t, 1);
        t.seq = i;
        t.gate = i == 0 ? &gate : nullptr;
    }
    // The thread stalls on the first; it takes the others until it holds kDepth, the io
    // thread the rest until it holds kDepth too; then there is no room.
    REQUIRE(pool->submit_to(jobs[0], 1));
    for (size_t i = 1; i < 2 * kDepth; i++)
        REQUIRE(pool->submit(jobs[i]));
    CHECK_FALSE(pool->submit(jobs[2 * kDepth]));
    CHECK(pool->stats(1).jobs == kDepth);
    CHECK(pool->stats(0).jobs == kDepth);
    CHECK(pool->stats(1).passed >= 1);
    CHECK(pool->stats(0).passed >= 1);
    // Everything waits behind the stalled first job, done or not.
    pool->reap(finish);
    CHECK(done.empty());
    gate.store(true, std::memory_order_release);
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
    REQUIRE(done.size() == 2 * kDepth);
    for (uint64_t i = 0; i < done.size(); i++)
        REQUIRE(done[i] == i);
    // Room again.
    REQUIRE(pool->submit(jobs[2 * kDepth]));
    REQUIRE(reap_until(*pool, finish, [&] { return pool->in_flight() == 0; }));
    CHECK(done.back() == 2 * kDepth);
}

TEST_CASE("worker threads with room get the jobs; the io thread helps only when they are full",
          "[threads][pipeline]")
{
    auto p = OrderedPool::create(3, {}, 4);  // 4 weight a worker thread
    REQUIRE(p);
    auto &pool = **p;
    std::vector<TestJob> jobs(10);
    for (auto &t : jobs) {
        t.run = run_test_job;
        key(t, 1);
        t.weight = 2;
    }
    size_t finished = 0;
    auto finish = [&](Job &) { finished++; };
    for (size_t i = 0; i < 4; i++)
        REQUIRE(pool.submit(jobs[i]));
    CHECK(pool.stats(0).jobs == 0);  // none for the io thread while the threads have room
    CHECK(pool.stats(1).jobs == 2);
    CHECK(pool.stats(2).jobs == 2);
    // Both threads at their limit (nothing reaped): the io thread runs the next itself.
    REQUIRE(pool.submit(jobs[4]));
    CHECK(pool.stats(0).jobs == 1);
    CHECK(pool.stats(0).weight == 2);
    REQUIRE(reap_until(pool, finish, [&] { return pool.in_flight() == 0; }));
    CHECK(finished == 5);
    CHECK(pool.stats(1).weight + pool.stats(2).weight == 8);
}

TEST_CASE("one worker runs every job on the calling thread", "[pipeline]")
{
    auto pool = make_pool(1);
    CHECK(pool->workers() == 1);
    std::vector<TestJob> jobs(10);
    std::vector<uint64_t> done;
    for (uint64_t i = 0; i < jobs.size(); i++) {
        jobs[i].run = run_test_job;
        key(jobs[i], 1);
        jobs[i].seq = i;
        REQUIRE(pool->submit(jobs[i]));
        CHECK(jobs[i].work != 0);  // run at once
    }
    CHECK(pool->reap([&](Job &j) { done.push_back(static_cast<TestJob &>(j).seq); }) == 10);
    CHECK(done == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    CHECK(pool->in_flight() == 0);
    CHECK_FALSE(OrderedPool::create(0));
    CHECK_FALSE(OrderedPool::create(OrderedPool::kMaxWorkers + 1));
}

TEST_CASE("CPU lists as the kernel writes them", "[pipeline]")
{
    auto l = xesp::parse_cpu_list("0,2,4-6");
    REQUIRE(l);
    CHECK(*l == std::vector<int>{0, 2, 4, 5, 6});
    auto empty = xesp::parse_cpu_list("");
    REQUIRE(empty);
    CHECK(empty->empty());
    for (const char *bad : {"x", "0,", "1-", "3-1", "-1", "0,,1", "1.5", "99999"}) {
        INFO(bad);
        auto r = xesp::parse_cpu_list(bad);
        REQUIRE_FALSE(r);
        CHECK(r.error().message.find("cpus: '") == 0);
    }
}
