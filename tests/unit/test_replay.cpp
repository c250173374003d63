// Anti-replay as a numbered table of cases (RFC 4303 3.4.3 and Appendix A), in the manner of
// WireGuard's selftest/counter.c, plus a randomised comparison with a naive model.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "userspace/esp/replay.h"

using xesp::ReplayWindow;
using V = ReplayWindow::Verdict;

namespace {

struct Step {
    uint32_t seq_lo;
    V expect;
    uint64_t inferred;      // the full sequence number check() must infer
    bool authentic = true;  // false: the ICV check fails, so update() is never called
};

// Runs check() then, when it passes, update() as the data path does after the ICV verified.
void run(ReplayWindow &w, const std::vector<Step> &steps)
{
    int n = 0;
    for (const Step &s : steps) {
        ++n;
        INFO("case " << n << ": seq_lo " << s.seq_lo);
        uint64_t seq = 0;
        V v = w.check(s.seq_lo, &seq);
        CHECK(v == s.expect);
        CHECK(seq == s.inferred);
        if (v == V::Ok && s.authentic)
            CHECK(w.update(seq) == V::Ok);
    }
}

}  // namespace

TEST_CASE("replay window, 32-bit sequence numbers", "[replay]")
{
    ReplayWindow w;
    w.init(64, false, 0);
    run(w, {
               {1, V::Ok, 1},                    // 1: first packet
               {1, V::Replay, 1},                // 2: the same again
               {2, V::Ok, 2},                    // 3
               {64, V::Ok, 64},                  // 4: window now 1..64
               {1, V::Replay, 1},                // 5: oldest in the window, seen
               {65, V::Ok, 65},                  // 6: window 2..65
               {1, V::TooOld, 1},                // 7: fell out of the window
               {2, V::Replay, 2},                // 8
               {3, V::Ok, 3},                    // 9: inside the window, not seen yet
               {3, V::Replay, 3},                // 10
               {200, V::Ok, 200},                // 11: a jump clears the bitmap it slides over
               {137, V::Ok, 137},                // 12: 200 - 63, the bottom of the window
               {136, V::TooOld, 136},            // 13: just below it
               {65, V::TooOld, 65},              // 14: seen before the jump, now too old
               {0, V::TooOld, 0},                // 15: 0 is never sent
               {0xffffffff, V::Ok, 0xffffffff},  // 16: the last number an SA may use
           });
}

TEST_CASE("replay window, ESN high-half inference across the wrap (RFC 4303 A2.2)", "[replay]")
{
    ReplayWindow w;
    w.init(64, true, 0xfffffff0ull);
    run(w, {
               {0xfffffff1, V::Ok, 0x0fffffff1ull},      // 1: Case A, same subspace
               {0x00000005, V::Ok, 0x100000005ull},      // 2: Case A, wrapped: Th + 1
               {0xfffffff5, V::Ok, 0x0fffffff5ull},      // 3: Case B, late packet: Th - 1
               {0xfffffff1, V::Replay, 0x0fffffff1ull},  // 4: Case B, seen
               // 5: Case B, below the window: inferred as ahead (Th), and it is the ICV,
               // computed with the wrong high half, that rejects it (RFC 4303 A2.2)
               {0xffffff00, V::Ok, 0x1ffffff00ull, false},
               {0x00000006, V::Ok, 0x100000006ull},      // 6: Case B, new: Th
               {0x00000005, V::Replay, 0x100000005ull},  // 7
               {0x00000100, V::Ok, 0x100000100ull},      // 8: Case A again
               {0xfffffff8, V::Ok, 0x1fffffff8ull},      // 9: far ahead, same subspace
           });
}

TEST_CASE("replay window, ESN at the start of an SA", "[replay]")
{
    ReplayWindow w;
    w.init(128, true, 0);
    run(w, {
               {0xffffffff, V::TooOld, 0},  // 1: would be before the first packet
               {1, V::Ok, 1},               // 2
               {0, V::TooOld, 0},           // 3
           });
}

TEST_CASE("replay window, update re-checks after a concurrent accept", "[replay]")
{
    ReplayWindow w;
    w.init(64, false, 0);
    uint64_t a, b;
    REQUIRE(w.check(10, &a) == V::Ok);
    REQUIRE(w.check(10, &b) == V::Ok);  // both pass the pre-check before either is done
    CHECK(w.update(a) == V::Ok);
    CHECK(w.update(b) == V::Replay);  // the second must not be delivered
}

TEST_CASE("replay window disabled accepts repeats", "[replay]")
{
    ReplayWindow w;
    w.init(0, false, 0);
    uint64_t s;
    CHECK(w.check(5, &s) == V::Ok);
    CHECK(w.update(5) == V::Ok);
    CHECK(w.check(5, &s) == V::Ok);
}

TEST_CASE("replay window matches a naive model for every power-of-two size", "[replay]")
{
    for (uint32_t window : {32u, 64u, 128u, 1024u, 4096u}) {
        INFO("window " << window);
        ReplayWindow w;
        w.init(window, false, 0);
        std::set<uint64_t> seen;
        uint64_t top = 0;
        std::mt19937_64 rng(window);
        uint64_t base = 1;
        for (int i = 0; i < 20000; i++) {
            base += rng() % 4;
            uint64_t s = base + window * 2 - rng() % (window * 3);
            if (s == 0 || s > 0xffffffffull)
                continue;
            V expect = s > top             ? V::Ok
                       : top - s >= window ? V::TooOld
                       : seen.count(s)     ? V::Replay
                                           : V::Ok;
            uint64_t got_seq;
            V got = w.check(uint32_t(s), &got_seq);
            REQUIRE(got == expect);
            if (got == V::Ok) {
                REQUIRE(w.update(got_seq) == V::Ok);
                seen.insert(s);
                top = std::max(top, s);
            }
        }
    }
}

TEST_CASE("replay: an SA that replaces another under the same keys catches up", "[replay]")
{
    ReplayWindow old;
    old.init(64, false, 0);
    for (uint64_t s : {1, 2, 3, 100, 98})
        REQUIRE(old.update(s) == ReplayWindow::Verdict::Ok);
    uint64_t seq = 0;
    SECTION("same window: what old saw stays seen, the rest of it stays open")
    {
        ReplayWindow now;
        now.init(64, false, 0);
        now.catch_up(old);
        CHECK(now.highest() == 100);
        CHECK(now.check(100, &seq) == ReplayWindow::Verdict::Replay);
        CHECK(now.check(98, &seq) == ReplayWindow::Verdict::Replay);
        CHECK(now.check(99, &seq) == ReplayWindow::Verdict::Ok);
        CHECK(now.check(3, &seq) == ReplayWindow::Verdict::TooOld);
    }
    SECTION("a wider window: what old did not cover counts as seen")
    {
        ReplayWindow now;
        now.init(256, false, 0);
        now.catch_up(old);
        CHECK(now.check(3, &seq) != ReplayWindow::Verdict::Ok);
        CHECK(now.check(20, &seq) != ReplayWindow::Verdict::Ok);
        CHECK(now.check(99, &seq) == ReplayWindow::Verdict::Ok);
    }
    SECTION("behind: nothing changes")
    {
        ReplayWindow now;
        now.init(64, false, 500);
        now.catch_up(old);
        CHECK(now.highest() == 500);
        CHECK(now.check(499, &seq) == ReplayWindow::Verdict::Ok);
    }
}
