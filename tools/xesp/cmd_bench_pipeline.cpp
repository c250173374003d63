// `xesp bench pipeline`: frames from an in-memory RX ring through the ordered pipeline
// (ordered_pool.h) to an in-memory TX ring, with no I/O: what a zero-copy NIC would feed it.
// The calling thread is the io thread (worker 0): it takes a burst, groups it by SA, runs each
// group's serial prepare step, submits the group as one job, and reaps what the workers have
// done, finishing each SA's jobs in order. TX checks each SA's ESP sequence numbers come out
// in order and counts what went out.
#include <sched.h>

#include <algorithm>
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
#include "userspace/esp/esp.h"
#include "userspace/esp/sa.h"
#include "userspace/pipeline/ordered_pool.h"

namespace xesp::cli {

namespace {

struct PipelineOptions {
    unsigned workers = 2;
    std::string cpus;
    size_t sas = 1;
    uint32_t size = 1400;
    size_t burst = 32;
    uint64_t packets = 1'000'000;
    double rate = 0;     // packets/s offered; 0: as fast as the pipeline takes them
    size_t limit = 256;  // packets in flight per worker thread
    std::string transform = "aes128gcm";
    std::string crypto = "auto";
    bool verify = false;
    bool json = false;
};

// One SA's group of a burst: prepared on the io thread, encrypted on a worker.
struct EncapJob : Job {
    Sa *sa = nullptr;
    size_t sa_index = 0;
    uint64_t rx_ns = 0;
    size_t n = 0;
    Pkt *pkts[kMaxBurst];
    EspBurst b;
};

void run_encap_job(Job &j)
{
    auto &e = static_cast<EncapJob &>(j);
    e.sa->cipher().encrypt(e.b.ops, e.b.n);
}

struct Result {
    double seconds = 0;
    uint64_t sent = 0, out = 0, out_of_order = 0, bad = 0;
    std::vector<uint32_t> latency;  // ns, a sample of packets
};

Result run_encap(const PipelineOptions &o, std::vector<std::unique_ptr<Sa>> &sas,
                 std::vector<std::unique_ptr<Sa>> &checkers, OrderedPool &pool)
{
    const size_t depth = OrderedPool::kDepth * pool.workers() + 1;
    std::vector<EncapJob> jobs(depth);
    std::vector<EncapJob *> free_jobs;
    for (auto &j : jobs)
        free_jobs.push_back(&j);
    const size_t nframes = depth * o.burst;
    std::vector<uint8_t> mem(nframes * kFrameSize);
    std::vector<Pkt> pkts(nframes);
    std::vector<Pkt *> free_frames;
    for (size_t i = 0; i < nframes; i++)
        free_frames.push_back(&pkts[i]);
    // The inner packet: IPv4/UDP, its payload a counting pattern.
    std::vector<uint8_t> inner(o.size);
    for (uint32_t i = 0; i < o.size; i++)
        inner[i] = uint8_t(i);
    inner[0] = 0x45;
    inner[1] = 0;
    wire::put16(inner.data() + 2, uint16_t(o.size));
    std::memset(inner.data() + 4, 0, 4);
    inner[8] = 64;
    inner[9] = wire::kProtoUdp;
    wire::put16(inner.data() + 10, 0);
    wire::ipv4_set_checksum(inner.data());
    wire::put16(inner.data() + 24, uint16_t(o.size - 20));
    for (size_t i = 0; i < nframes; i++)
        std::memcpy(mem.data() + i * kFrameSize + kFrameHeadroom, inner.data(), o.size);

    std::vector<Job *> tails(sas.size(), nullptr);
    std::vector<uint32_t> last_seq(sas.size(), 0);
    Result r;
    const uint64_t sample_every = std::max<uint64_t>(1, o.packets / 100000);
    r.latency.reserve(o.packets / sample_every + 1);
    uint64_t finished_pkts = 0;
    auto finish = [&](Job &j) {
        auto &e = static_cast<EncapJob &>(j);
        esp_encap_finish(*e.sa, e.b, 0, e.b.n);
        uint64_t now = now_ns();
        for (size_t i = 0; i < e.n; i++) {
            Pkt &p = *e.pkts[i];
            if (p.verdict == Verdict::Encrypted) {
                // TX: the outer IPv4 header, then ESP: SPI, sequence number.
                uint32_t seq = wire::get32(p.ip() + wire::kIpv4Len + 4);
                r.out_of_order += seq != last_seq[e.sa_index] + 1;
                last_seq[e.sa_index] = seq;
                r.out++;
                if (!checkers.empty()) {
                    // --verify: the receiving SA takes it back to the packet that went in.
                    Pkt *one = &p;
                    p.l4 = wire::kIpv4Len;
                    esp_decap_burst(*checkers[e.sa_index], &one, 1);
                    r.bad += p.verdict != Verdict::Decrypted || p.len != o.size ||
                             std::memcmp(p.ip() + 28, inner.data() + 28, o.size - 28) != 0;
                }
            }
            if (finished_pkts++ % sample_every == 0)
                r.latency.push_back(uint32_t(std::min<uint64_t>(now - e.rx_ns, UINT32_MAX)));
            free_frames.push_back(&p);
        }
        free_jobs.push_back(&e);
    };

    const size_t burst = o.burst;
    std::vector<Pkt *> rx(burst);
    std::vector<size_t> rx_sa(burst);
    uint64_t next_sa = 0;
    const uint64_t t0 = now_ns();
    const double gap_ns = o.rate > 0 ? 1e9 / o.rate : 0;
    while (r.sent < o.packets) {
        size_t k = std::min<uint64_t>(burst, o.packets - r.sent);
        if (gap_ns > 0) {
            uint64_t due = t0 + uint64_t(double(r.sent) * gap_ns);
            while (now_ns() < due)
                pool.reap(finish);
        }
        while (free_frames.size() < k || free_jobs.size() < k)
            pool.reap(finish);
        // RX: k frames, the packets spread evenly over the SAs.
        const uint64_t rx_ns = now_ns();
        for (size_t i = 0; i < k; i++) {
            Pkt *p = free_frames.back();
            free_frames.pop_back();
            size_t idx = size_t(p - pkts.data());
            uint8_t *f = mem.data() + idx * kFrameSize;
            std::memcpy(f + kFrameHeadroom, inner.data(), wire::kIpv4Len + 8);
            *p = Pkt{f, kFrameSize, kFrameHeadroom, o.size};
            rx[i] = p;
            rx_sa[i] = size_t(next_sa++ % sas.size());
        }
        // Group by SA, in order of first appearance; each group one job.
        size_t done = 0;
        while (done < k) {
            size_t sa = rx_sa[done];
            EncapJob &j = *free_jobs.back();
            free_jobs.pop_back();
            j.n = 0;
            for (size_t i = done; i < k; i++)
                if (rx_sa[i] == sa && rx[i]) {
                    j.pkts[j.n++] = rx[i];
                    rx[i] = nullptr;
                }
            while (done < k && !rx[done])
                done++;
            j.sa = sas[sa].get();
            j.sa_index = sa;
            j.rx_ns = rx_ns;
            j.run = run_encap_job;
            j.weight = uint32_t(j.n);
            j.tail = &tails[sa];
            j.b.n = 0;
            esp_encap_prepare(*j.sa, j.pkts, j.n, j.b);
            while (!pool.submit(j))
                pool.reap(finish);
        }
        r.sent += k;
        pool.reap(finish);
    }
    while (pool.in_flight())
        pool.reap(finish);
    r.seconds = double(now_ns() - t0) / 1e9;
    return r;
}

uint32_t percentile(std::vector<uint32_t> &v, double q)
{
    if (v.empty())
        return 0;
    size_t at = std::min(v.size() - 1, size_t(double(v.size()) * q));
    std::nth_element(v.begin(), v.begin() + long(at), v.end());
    return v[at];
}

void run_pipeline(const PipelineOptions &o)
{
    const NamedTransform *t = find_transform(o.transform);
    if (!t)
        throw Failure("bench pipeline: unknown transform '" + o.transform + "'");
    auto backend = parse_backend(o.crypto);
    if (!backend)
        throw Failure("bench pipeline: unknown --crypto '" + o.crypto +
                      "' (auto, openssl, ipsecmb)");
    if (o.sas < 1 || o.sas > 100000)
        throw Failure("bench pipeline: --sas " + std::to_string(o.sas) +
                      " is not between 1 and 100000");
    if (o.burst < 1 || o.burst > kMaxBurst)
        throw Failure("bench pipeline: --burst " + std::to_string(o.burst) +
                      " is not between 1 and " + std::to_string(kMaxBurst));
    if (o.size < 28 || o.size > 1500)
        throw Failure("bench pipeline: --size " + std::to_string(o.size) +
                      " is not between 28 and 1500");
    std::vector<std::unique_ptr<Sa>> sas, checkers;
    for (size_t i = 0; i < o.sas; i++) {
        SaConfig cfg = bench_sa(*t);
        cfg.spi = uint32_t(0x1000 + i);
        cfg.dir = Dir::Out;
        if (o.verify) {
            SaConfig in = cfg;
            in.dir = Dir::In;
            in.replay_window = 0;
            auto c = Sa::create(in, Backend::OpenSsl);  // another backend checks it
            if (!c)
                throw Failure("bench pipeline: " + c.error().message);
            checkers.push_back(std::move(*c));
        }
        auto sa = Sa::create(cfg, *backend);
        if (!sa)
            throw Failure("bench pipeline: " + sa.error().message);
        // Workers share an SA's cipher: only a backend whose per-SA state is read-only
        // while it runs (ipsec-mb: per-thread managers) may be given to more than one.
        if (o.workers > 1 && (*sa)->cipher().backend() != Backend::IpsecMb)
            throw Failure("bench pipeline: --workers " + std::to_string(o.workers) +
                          " needs the ipsecmb backend for " + o.transform +
                          " (OpenSSL contexts are per SA, not per thread)");
        sas.push_back(std::move(*sa));
    }
    // Worker i on cpus[i % size], this thread being worker 0; by default worker i on CPU i
    // while there are as many.
    auto parsed = parse_cpu_list(o.cpus);
    if (!parsed)
        throw Failure("bench pipeline: --" + parsed.error().message);
    std::vector<int> cpus = std::move(*parsed);
    if (cpus.empty() && o.workers > 1 && o.workers <= std::thread::hardware_concurrency())
        for (unsigned i = 0; i < o.workers; i++)
            cpus.push_back(int(i));
    if (!cpus.empty())
        if (auto r = pin_to_cpu(cpus[0]); !r)
            throw Failure("bench pipeline: " + r.error().message);
    auto pool = OrderedPool::create(o.workers, cpus, o.limit);
    if (!pool)
        throw Failure("bench pipeline: " + pool.error().message);
    Result r = run_encap(o, sas, checkers, **pool);

    double mpps = double(r.out) / r.seconds / 1e6;
    nlohmann::json j = {{"direction", "encap"},
                        {"workers", o.workers},
                        {"sas", o.sas},
                        {"size", o.size},
                        {"burst", o.burst},
                        {"packets", o.packets},
                        {"rate", o.rate},
                        {"limit", o.limit},
                        {"transform", o.transform},
                        {"crypto", backend_name(sas[0]->cipher().backend())},
                        {"seconds", r.seconds},
                        {"mpps", mpps},
                        {"gbps", mpps * o.size * 8 / 1e3},
                        {"out_of_order", r.out_of_order},
                        {"verified", o.verify},
                        {"bad", r.bad},
                        {"lost", r.sent - r.out},
                        {"latency_ns",
                         {{"p50", percentile(r.latency, 0.5)},
                          {"p99", percentile(r.latency, 0.99)},
                          {"p999", percentile(r.latency, 0.999)}}}};
    nlohmann::json per = nlohmann::json::array();
    for (unsigned w = 0; w < o.workers; w++) {
        PoolStats s = (*pool)->stats(w);
        per.push_back({{"jobs", s.jobs}, {"passed", s.passed}});
    }
    j["per_worker"] = per;
    if (o.json) {
        std::printf("%s\n", j.dump(1).c_str());
        return;
    }
    std::printf("pipeline: encap %s (%s), %u B, %zu SA(s), bursts of %zu, %u worker(s): "
                "%.3f Mpps, %.2f Gbps; %llu out of order, %llu lost%s; latency p50 %u ns, p99 "
                "%u ns, p99.9 %u ns\n",
                o.transform.c_str(), j["crypto"].get<std::string>().c_str(), o.size, o.sas, o.burst,
                o.workers, mpps, mpps * o.size * 8 / 1e3, (unsigned long long)r.out_of_order,
                (unsigned long long)(r.sent - r.out),
                o.verify ? (", " + std::to_string(r.bad) + " bad").c_str() : "",
                j["latency_ns"]["p50"].get<uint32_t>(), j["latency_ns"]["p99"].get<uint32_t>(),
                j["latency_ns"]["p999"].get<uint32_t>());
}

}  // namespace

void register_bench_pipeline_command(CLI::App &bench)
{
    auto o = std::make_shared<PipelineOptions>();
    CLI::App *c = bench.add_subcommand(
        "pipeline", "ESP through the ordered worker pipeline, in-memory rings, no I/O");
    c->add_option("--workers", o->workers, "Workers, the calling thread included");
    c->add_option("--cpus", o->cpus, "CPUs for workers 1.., comma separated");
    c->add_option("--sas", o->sas, "SAs, the traffic spread evenly over them (1..100000)");
    c->add_option("--size", o->size, "Inner packet size in bytes");
    c->add_option("--burst", o->burst, "Packets taken from the RX ring at a time");
    c->add_option("--packets", o->packets, "Packets in all");
    c->add_option("--rate", o->rate, "Packets a second offered (0: as fast as taken)");
    c->add_option("--limit", o->limit, "Packets in flight per worker thread");
    c->add_option("--transform", o->transform, "aes128gcm, aes256gcm, ...");
    c->add_option("--crypto", o->crypto, "auto, openssl or ipsecmb");
    c->add_flag("--verify", o->verify,
                "Decrypt every packet that comes out with the other backend (slower)");
    c->add_flag("--json", o->json, "Results as one JSON object");
    c->callback([o] { run_pipeline(*o); });
}

}  // namespace xesp::cli
