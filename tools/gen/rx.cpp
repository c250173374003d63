#include "tools/gen/rx.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <net/if.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gen_rx.skel.h"
#include "tools/gen/gen_abi.h"
#include "userspace/base/clock.h"

static_assert(sizeof(gen_count) == 16, "gen_count: two __u64, as gen_rx.bpf.c counts them");

namespace xesp::gen {

namespace {

constexpr int kPollMs = 20;

// The skeleton and its link, released together.
struct Counter {
    ::gen_rx *skel = nullptr;
    bpf_link *link = nullptr;
    ~Counter()
    {
        bpf_link__destroy(link);
        gen_rx__destroy(skel);
    }
};

Result<gen_count> read_counts(int map_fd, int cpus)
{
    std::vector<gen_count> per_cpu(static_cast<size_t>(cpus));
    uint32_t key = 0;
    if (bpf_map_lookup_elem(map_fd, &key, per_cpu.data()))
        return make_error(std::string("reading the counters: ") + std::strerror(errno), errno);
    gen_count sum{};
    for (const auto &c : per_cpu) {
        sum.packets += c.packets;
        sum.bytes += c.bytes;
    }
    return sum;
}

}  // namespace

Result<RxResult> run_rx(const RxOptions &o, const std::atomic<bool> &stop,
                        const std::function<void()> &on_attached)
{
    unsigned ifindex = if_nametoindex(o.dev.c_str());
    if (!ifindex)
        return make_error(o.dev + ": no such interface in this network namespace");
    int cpus = libbpf_num_possible_cpus();
    if (cpus <= 0)
        return make_error("cannot count the possible CPUs: " + std::string(std::strerror(-cpus)));
    Counter c;
    c.skel = gen_rx__open_and_load();
    if (!c.skel)
        return make_error(std::string("loading gen_rx.bpf.o: ") + std::strerror(errno) +
                              "; needs root (CAP_BPF, CAP_NET_ADMIN)",
                          errno);
    c.link = bpf_program__attach_xdp(c.skel->progs.gen_rx_count, int(ifindex));
    if (!c.link)
        return make_error(o.dev + ": attaching the XDP counter: " + std::strerror(errno) +
                              (errno == EBUSY || errno == EEXIST
                                   ? "; another XDP program is attached there"
                                   : ""),
                          errno);
    int fd = bpf_map__fd(c.skel->maps.counts);
    on_attached();

    RxResult r;
    auto t0 = Clock::now();
    auto end = t0 + std::chrono::duration<double>(o.seconds);
    auto idle = std::chrono::duration<double>(o.idle);
    Clock::time_point before_first = t0, last_change{};
    uint64_t last = 0;
    for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
        auto now = Clock::now();
        auto s = read_counts(fd, cpus);
        if (!s)
            return s.error();
        if (s->packets != last) {
            last = s->packets;
            last_change = now;
            r.packets = s->packets;
            r.bytes = s->bytes;
        } else if (!last) {
            before_first = now;
        }
        if (stop.load() || now >= end || (last && now - last_change >= idle))
            break;
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.packets)
        r.active_seconds = std::chrono::duration<double>(last_change - before_first).count();
    return r;
}

}  // namespace xesp::gen
