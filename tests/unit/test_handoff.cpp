// Changes built on one thread while another forwards: the handoff runs work on the data
// thread between its rounds, and an engine built from the running one (sharing its SAs) takes
// over without restarting them: the sequence numbers the data thread sends go on, none twice.
#include <catch2/catch.hpp>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "tests/unit/esp_fixture.h"
#include "userspace/gateway/handoff.h"

using namespace xesp;
using namespace xesp::test;

namespace {

// A data thread: serves the handoff and runs `round` until told to stop.
template <typename F> std::thread data_thread(Handoff &h, std::atomic<bool> &stop, F round)
{
    return std::thread([&h, &stop, round]() mutable {
        while (!stop.load(std::memory_order_relaxed)) {
            round();
            h.serve();
        }
    });
}

}  // namespace

TEST_CASE("a handoff runs the call on the data thread and returns after it", "[handoff][threads]")
{
    auto h = Handoff::create();
    REQUIRE(h);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> rounds{0};
    std::thread::id data_id;
    std::thread t = data_thread(**h, stop, [&] { rounds.fetch_add(1); });
    data_id = t.get_id();
    for (int i = 0; i < 100; i++) {
        std::thread::id ran_on;
        bool done_before_return = false;
        (*h)->call([&] {
            ran_on = std::this_thread::get_id();
            done_before_return = true;
        });
        CHECK(ran_on == data_id);
        CHECK(done_before_return);
    }
    SECTION("what the call throws reaches the caller, and the data thread goes on")
    {
        CHECK_THROWS_AS((*h)->call([] { throw std::runtime_error("refused"); }),
                        std::runtime_error);
        std::thread::id ran_on;
        (*h)->call([&] { ran_on = std::this_thread::get_id(); });
        CHECK(ran_on == data_id);
    }
    stop = true;
    t.join();
}

TEST_CASE("a call wakes a data thread that sleeps in poll(), and leaves nothing to wake it again",
          "[handoff][threads]")
{
    auto h = Handoff::create();
    REQUIRE(h);
    std::atomic<bool> stop{false};
    std::atomic<int> wakeups{0};
    std::thread t([&] {
        while (!stop.load()) {
            pollfd p{(*h)->fd(), POLLIN, 0};
            if (::poll(&p, 1, 10'000) > 0)  // ten seconds: only a call wakes it
                wakeups++;
            (*h)->serve();
        }
    });
    for (int i = 0; i < 20; i++) {
        auto t0 = std::chrono::steady_clock::now();
        (*h)->call([] {});
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
        pollfd p{(*h)->fd(), POLLIN, 0};
        CHECK(::poll(&p, 1, 0) == 0);  // the counter was emptied
    }
    CHECK(wakeups.load() >= 20);
    (*h)->call([&] { stop = true; });  // set on the data thread: no call is lost
    t.join();
}

TEST_CASE("engines built beside the running one take over without restarting its SAs",
          "[handoff][engine][rebuild][threads]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    Config base = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
    std::unique_ptr<Engine> live = make_engine(base);
    auto h = Handoff::create();
    REQUIRE(h);

    // The data thread encrypts one packet a round with whatever engine is live and records
    // the sequence numbers.
    std::atomic<bool> stop{false};
    std::vector<uint32_t> seqs;
    bool all_encrypted = true;
    std::thread t = data_thread(**h, stop, [&] {
        Frame f(udp_packet(4, "10.1.0.1", "10.2.0.1", 64));
        all_encrypted &= run(*live, f) == Verdict::Encrypted;
        seqs.push_back(wire::get32(f.pkt.ip() + 20 + 4));
    });

    // This thread: 50 changes, each adding and removing other tunnels, each engine built from
    // the live one while the data thread runs it.
    for (int i = 0; i < 50; i++) {
        Config next = base;
        for (int j = 0; j <= i % 5; j++) {
            SaConfig other = make_sa(gcm, Mode::Tunnel, 4);
            other.spi = 0x10000 + i * 8 + j;
            other.reqid = 100 + j;
            other.dst = addr("203.0.113.9");
            next.sas.push_back(other);
        }
        auto e = Engine::create(next, Backend::Auto, {}, live.get());
        REQUIRE(e);
        (*h)->call([&] { std::swap(live, *e); });
        e->reset();  // the old engine, freed here
    }
    stop = true;
    t.join();

    CHECK(all_encrypted);
    REQUIRE(seqs.size() >= 50);  // a round before each call, at least
    bool in_order = true;
    for (size_t i = 0; i < seqs.size(); i++)
        in_order &= seqs[i] == i + 1;
    CHECK(in_order);  // 1, 2, 3, ...: never restarted, never repeated
}
