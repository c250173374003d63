// `xesp bench cpus`: what it costs to hand data from one CPU to another. A pipeline whose steps
// run on different cores pays it for every cache line that one core writes and the other
// touches next: a ring's slot, a job's ops, a frame's headers and payload. How much that is
// depends on where the two CPUs sit (one core's hyperthreads, one cache complex, two
// sockets, or two vCPUs whose host moves them), so `bench pipeline`'s figures with workers
// are read beside this one's, taken in the same minute.
//
// Two threads, pinned to the two CPUs, take turns through one line:
//   - a line: each waits to see the other's count in it and writes the next: a round trip is
//     two moves of that one line;
//   - a frame: each, in its turn, also writes every 8 bytes of a --size buffer before it hands
//     over, as the io thread and a worker do with a packet's frame.
// The same writes on one CPU, with no turns, give what they cost in a warm cache, so that
//   frame_move_ns = (frame round trip - line round trip - the writes on one CPU) / 2
// is what one move of the frame's lines from one CPU to the other costs.
// Then a thread on each CPU at once reads the clock as fast as it can: a gap between two
// reads is time the thread was kept from running (an interrupt, or the host running something
// else on a virtual CPU). A packet in flight between two threads waits out the gaps of both.
// Last, one SA's AES-128-GCM cipher (intel-ipsec-mb) encrypts --size packets on the first CPU,
// then on both at once, each in frames of its own: what a second worker can add to the crypto
// when nothing else is handed over (threads that share one copy of intel-ipsec-mb before 1.4
// add less: crypto_ipsecmb.cpp).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/xesp/bench_transforms.h"
#include "tools/xesp/commands.h"
#include "userspace/base/clock.h"
#include "userspace/base/cpu_list.h"
#include "userspace/base/wire.h"
#include "userspace/crypto/crypto.h"

namespace xesp::cli {

namespace {

struct CpusOptions {
    std::string cpus = "0,1";
    uint32_t size = 1400;
    double seconds = 0.5;
    bool json = false;
};

// Reads and writes every 8 bytes, as a pass of the cipher over a frame does.
void touch(uint8_t *buf, size_t size)
{
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {
        uint64_t v;
        std::memcpy(&v, buf + i, 8);
        v++;
        std::memcpy(buf + i, &v, 8);
    }
    for (; i < size; i++)
        buf[i]++;
    asm volatile("" ::: "memory");
}

// Runs round() in batches of `batch` (256 for rounds too short to read the clock after each)
// for about `seconds`: ns per round.
template <class Round> double per_round(double seconds, Round &&round, int batch = 256)
{
    const uint64_t limit = uint64_t(seconds * 1e9);
    uint64_t rounds = 0, t0 = now_ns(), t = t0;
    while (t - t0 < limit) {
        for (int i = 0; i < batch; i++, rounds++)
            round(rounds);
        t = now_ns();
    }
    return double(t - t0) / double(rounds);
}

struct alignas(64) Turn {
    std::atomic<uint64_t> count{0};
};

// Round trips between CPUs a and b for about `seconds`, each side touching `size` bytes of
// buf in its turn. Returns ns per round trip.
double round_trip(int a, int b, uint8_t *buf, size_t size, double seconds)
{
    Turn turn;
    // Spins without a pause, to see the line the moment it comes.
    std::thread other([&] {
        uint64_t seen = 1;
        for (;;) {
            uint64_t c;
            while ((c = turn.count.load(std::memory_order_acquire)) != seen)
                if (c == UINT64_MAX)
                    return;
            touch(buf, size);
            turn.count.store(seen + 1, std::memory_order_release);
            seen += 2;
        }
    });
    // Both pinned before the first turn.
    Result<void> pinned = pin_to_cpu(b, other.native_handle());
    if (pinned)
        pinned = pin_to_cpu(a);
    if (!pinned) {
        turn.count.store(UINT64_MAX, std::memory_order_release);
        other.join();
        throw Failure("bench cpus: " + pinned.error().message);
    }
    const double ns = per_round(seconds, [&](uint64_t r) {
        touch(buf, size);
        turn.count.store(2 * r + 1, std::memory_order_release);
        while (turn.count.load(std::memory_order_acquire) != 2 * r + 2) {
        }
    });
    turn.count.store(UINT64_MAX, std::memory_order_release);
    other.join();
    return ns;
}

struct Stalls {
    uint64_t over_100us = 0, over_1ms = 0, longest_ns = 0;
};

// Runs body(i) on a thread pinned to each of cpus, all at once.
template <class Body> void on_each_cpu(const std::vector<int> &cpus, Body &&body)
{
    std::vector<std::thread> threads;
    threads.reserve(cpus.size());
    std::atomic<int> go{0};  // 1: pinned, run; -1: not pinned, end
    auto end_all = [&](int how) {
        go.store(how, std::memory_order_release);
        for (auto &t : threads)
            t.join();
    };
    try {
        for (size_t i = 0; i < cpus.size(); i++)
            threads.emplace_back([&, i] {
                int g;
                while ((g = go.load(std::memory_order_acquire)) == 0) {
                }
                if (g > 0)
                    body(i);
            });
    } catch (...) {  // a thread that could not start
        end_all(-1);
        throw;
    }
    Result<void> pinned;
    for (size_t i = 0; i < cpus.size() && pinned; i++)
        pinned = pin_to_cpu(cpus[i], threads[i].native_handle());
    end_all(pinned ? 1 : -1);
    if (!pinned)
        throw Failure("bench cpus: " + pinned.error().message);
}

// A thread on each CPU at once, reading the clock for `seconds`: the gaps between reads.
std::vector<Stalls> stalls(const std::vector<int> &cpus, double seconds)
{
    std::vector<Stalls> out(cpus.size());
    on_each_cpu(cpus, [&](size_t i) {
        // Counted in registers, and written once: the two threads share no line.
        const uint64_t limit = uint64_t(seconds * 1e9);
        uint64_t t0 = now_ns(), last = t0;
        Stalls st;
        while (last - t0 < limit) {
            uint64_t t = now_ns(), gap = t - last;
            st.over_100us += gap > 100'000;
            st.over_1ms += gap > 1'000'000;
            st.longest_ns = std::max(st.longest_ns, gap);
            last = t;
        }
        out[i] = st;
    });
    return out;
}

// One SA's cipher encrypting bursts of 32 packets of `size` bytes on each CPU of `cpus` at
// once, each thread in frames of its own, as workers do with one SA: Mpps, all together. Each
// thread encrypts a burst first (a thread's first call sets up its manager, and may load a
// copy of the library), and the timing starts when all have.
double cipher_mpps(SaCipher &cipher, uint32_t size, const std::vector<int> &cpus, double seconds)
{
    constexpr size_t kBurst = 32;
    const uint32_t payload = wire::esp_padded_len(size, 4);  // RFC 4106's ESP: blocks of 4
    const size_t slot = (payload + 64 + 63) / 64 * 64;
    std::vector<double> ns(cpus.size());
    std::atomic<size_t> ready{0};
    std::atomic<bool> failed{false};
    on_each_cpu(cpus, [&](size_t i) {
        std::vector<uint8_t> mem(kBurst * slot + 64);
        uint8_t *base = reinterpret_cast<uint8_t *>((uintptr_t(mem.data()) + 63) & ~uintptr_t(63));
        CryptoOp ops[kBurst];
        for (size_t k = 0; k < kBurst; k++)
            ops[k] = CryptoOp{base + k * slot, payload, 0, false};
        cipher.encrypt(ops, kBurst);
        for (const CryptoOp &op : ops)
            if (!op.ok)
                failed.store(true, std::memory_order_relaxed);
        ready.fetch_add(1, std::memory_order_acq_rel);
        while (ready.load(std::memory_order_acquire) < cpus.size()) {
        }
        ns[i] = per_round(
            seconds, [&](uint64_t) { cipher.encrypt(ops, kBurst); }, 1);
    });
    if (failed.load())
        throw Failure("bench cpus: the cipher failed on a thread (out of memory?)");
    double mpps = 0;
    for (double n : ns)
        mpps += kBurst * 1e3 / n;
    return mpps;
}

// Two passes over buf on one CPU, the frame's round trip without the moves: ns.
double on_one_cpu(int a, uint8_t *buf, size_t size, double seconds)
{
    if (auto r = pin_to_cpu(a); !r)
        throw Failure("bench cpus: " + r.error().message);
    return per_round(seconds, [&](uint64_t) {
        touch(buf, size);
        touch(buf, size);
    });
}

void run_cpus(const CpusOptions &o)
{
    auto cpus = parse_cpu_list(o.cpus);
    if (!cpus)
        throw Failure("bench cpus: --" + cpus.error().message);
    if (cpus->size() != 2 || (*cpus)[0] == (*cpus)[1])
        throw Failure("bench cpus: --cpus '" + o.cpus + "' is not two different CPUs");
    if (o.size < 8 || o.size > 65536)
        throw Failure("bench cpus: --size " + std::to_string(o.size) +
                      " is not between 8 and 65536");
    if (!(o.seconds >= 0.001 && o.seconds <= 60)) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", o.seconds);
        throw Failure("bench cpus: --seconds " + std::string(text) +
                      " is not between 0.001 and 60");
    }
    const int a = (*cpus)[0], b = (*cpus)[1];
    // The frame on its own lines, as a UMEM frame is.
    std::vector<uint8_t> mem(o.size + 128);
    uint8_t *buf = reinterpret_cast<uint8_t *>((uintptr_t(mem.data()) + 63) & ~uintptr_t(63));
    const double line = round_trip(a, b, buf, 0, o.seconds);
    const double frame = round_trip(a, b, buf, o.size, o.seconds);
    const double local = on_one_cpu(a, buf, o.size, o.seconds);
    const double move = (frame - line - local) / 2;
    const std::vector<Stalls> st = stalls({a, b}, o.seconds);
    const NamedTransform &t = *find_transform("aes128gcm");
    const SaConfig sa = bench_sa(t);
    auto cipher = make_cipher(Backend::IpsecMb, sa.xf, false);
    if (!cipher)
        throw Failure("bench cpus: " + cipher.error().message);
    const double one = cipher_mpps(**cipher, o.size, {a}, o.seconds);
    const double both = cipher_mpps(**cipher, o.size, {a, b}, o.seconds);
    nlohmann::json js = nlohmann::json::array();
    for (size_t i = 0; i < st.size(); i++)
        js.push_back({{"cpu", i ? b : a},
                      {"over_100us", st[i].over_100us},
                      {"over_1ms", st[i].over_1ms},
                      {"longest_ns", st[i].longest_ns}});
    nlohmann::json j = {{"cpus", {a, b}},
                        {"size", o.size},
                        {"seconds", o.seconds},
                        {"line_round_trip_ns", line},
                        {"frame_round_trip_ns", frame},
                        {"frame_writes_one_cpu_ns", local},
                        {"frame_move_ns", move},
                        {"stalls", js},
                        {"cipher",
                         {{"transform", t.name},
                          {"crypto", "ipsecmb"},
                          {"one_cpu_mpps", one},
                          {"both_cpus_mpps", both}}}};
    if (o.json) {
        std::printf("%s\n", j.dump(1).c_str());
        return;
    }
    std::printf("cpus %d and %d: a line goes there and back in %.0f ns; a %u B frame moves "
                "from one to the other in %.0f ns (its writes on one CPU: %.0f ns a pass)\n",
                a, b, line, o.size, move, local / 2);
    for (size_t i = 0; i < st.size(); i++)
        std::printf("cpu %d, busy for %g s: kept from running %llu times over 0.1 ms, %llu over "
                    "1 ms, at most %.2f ms\n",
                    i ? b : a, o.seconds, (unsigned long long)st[i].over_100us,
                    (unsigned long long)st[i].over_1ms, double(st[i].longest_ns) / 1e6);
    std::printf("one SA's %s (ipsecmb), %u B packets: %.2f Mpps on cpu %d, %.2f Mpps on "
                "both at once (%.2fx)\n",
                t.name, o.size, one, a, both, both / one);
}

}  // namespace

void register_bench_cpus_command(CLI::App &bench)
{
    auto o = std::make_shared<CpusOptions>();
    CLI::App *c = bench.add_subcommand(
        "cpus", "What handing a cache line, and a frame, from one CPU to another costs, how long "
                "a busy thread on each is kept from running, and what one SA's cipher does on "
                "one and on both");
    c->add_option("--cpus", o->cpus, "The two CPUs, comma separated");
    c->add_option("--size", o->size, "Frame size in bytes, also the cipher's packet size");
    c->add_option("--seconds", o->seconds, "Time per measurement");
    c->add_flag("--json", o->json, "Results as one JSON object");
    c->callback([o] { run_cpus(*o); });
}

}  // namespace xesp::cli
