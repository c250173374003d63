// `xesp bench pipeline`: frames from an in-memory RX ring through the gateway's pipeline to an
// in-memory TX ring, with no I/O: what a zero-copy NIC would feed it. The calling thread is
// the io thread (worker 0), as the gateway's data thread is: it takes a burst, has the engine
// look each packet's policy or SA up by the id the XDP classifier would have given it and
// run each SA's serial prepare step (Engine::begin_classified), submits the burst's crypto
// as one job, and reaps what the workers have done, finishing each SA's bursts in the order
// it took them (Engine::end). TX checks that each SA's packets come out in the order they came
// in and counts what went out.
//
// Encap: SA i carries the plaintext for 10.128.0.0 + i, the RX ring writes each frame's IP
// header. Decap: the RX ring copies each frame's ciphertext in (what a NIC's DMA does), from
// one packet per SA made at the start; the receiving SAs have anti-replay off, as the same
// ciphertext comes again and again.
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
#include "userspace/esp/engine.h"
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
    std::string direction = "encap";
    double rate = 0;     // packets/s offered; 0: as fast as the pipeline takes them
    size_t limit = 256;  // packets in flight per worker thread
    size_t frames = 0;   // 0: as many as can be in flight, the last freed first; else in turn
    std::string transform = "aes128gcm";
    std::string crypto = "auto";
    bool verify = false;
    bool json = false;
};

// A burst between its serial steps: prepared on the io thread, its crypto on a worker.
struct BenchJob : Job {
    size_t n = 0;
    uint64_t rx_ns = 0;  // 0: not in the latency sample
    Pkt *pkts[kMaxBurst];
    Classified cls[kMaxBurst];
    uint32_t sa[kMaxBurst];  // each packet's SA index
    uint64_t rx[kMaxBurst];  // and its place in the RX ring's order
    Engine::Burst b;
};

// The frames RX may fill. By default the last one freed comes first, and there are only as
// many as can be in flight: they stay in cache. With --frames N, N frames are taken in turn,
// as from a NIC's ring or an AF_XDP fill ring (the gateway's: 4096 frames per socket): a frame
// comes back to RX after all the others, and is cold by then unless they all fit in cache.
class FreeFrames {
public:
    FreeFrames(size_t cap, bool in_turn) : ring_(cap), in_turn_(in_turn) {}
    void push_back(Pkt *p) { ring_[(head_ + n_++) % ring_.size()] = p; }
    Pkt *take()
    {
        n_--;
        if (!in_turn_)
            return ring_[(head_ + n_) % ring_.size()];
        Pkt *p = ring_[head_];
        head_ = (head_ + 1) % ring_.size();
        return p;
    }
    size_t size() const { return n_; }

private:
    std::vector<Pkt *> ring_;
    size_t head_ = 0, n_ = 0;
    bool in_turn_;
};

void run_bench_job(Job &j)
{
    Engine::crypt(static_cast<BenchJob &>(j).b);
}

struct Result {
    double seconds = 0;
    uint64_t sent = 0, out = 0, out_of_order = 0, bad = 0;
    std::vector<uint32_t> latency;  // ns, a sample of bursts
};

// The tunnels: SA i (SPI 0x1000 + i, reqid i + 1) between 192.0.2.1 and 192.0.2.2 carries
// 10.1.0.0/16 -> 10.128.0.0 + i. `out`: the sending side (SA and out policy i at index i);
// else the receiving side (SA i at index i, and the fwd policy that lets its plaintext out).
Config bench_config(const NamedTransform &t, size_t n, bool out, uint32_t replay_window)
{
    Config c;
    c.sas.reserve(n);
    c.policies.reserve(n);
    const Prefix from = *Prefix::parse("10.1.0.0/16");
    for (size_t i = 0; i < n; i++) {
        SaConfig sa = bench_sa(t);
        sa.spi = uint32_t(0x1000 + i);
        sa.reqid = uint32_t(i + 1);
        sa.dir = out ? Dir::Out : Dir::In;
        sa.replay_window = replay_window;
        PolicyConfig p;
        p.sel.src = from;
        uint8_t host[4];
        wire::put32(host, uint32_t(0x0a800000 + i));
        p.sel.dst = Prefix{IpAddr::v4(host), 32};
        p.dir = out ? Dir::Out : Dir::Fwd;
        p.tmpl = PolicyTmpl{sa.src, sa.dst, 0, sa.reqid, Mode::Tunnel};
        c.sas.push_back(std::move(sa));
        c.policies.push_back(std::move(p));
    }
    return c;
}

std::unique_ptr<Engine> make_bench_engine(const Config &c, Backend backend)
{
    auto e = Engine::create(c, backend);
    if (!e)
        throw Failure("bench pipeline: " + e.error().message);
    return std::move(*e);
}

// The plaintext of SA i: IPv4/UDP from 10.1.0.1 to 10.128.0.0 + i, its payload a counting
// pattern.
void write_inner(uint8_t *ip, uint32_t size, size_t sa, bool payload)
{
    if (payload)
        for (uint32_t i = 28; i < size; i++)
            ip[i] = uint8_t(i);
    ip[0] = 0x45;
    ip[1] = 0;
    wire::put16(ip + 2, uint16_t(size));
    std::memset(ip + 4, 0, 4);
    ip[8] = 64;
    ip[9] = wire::kProtoUdp;
    wire::put16(ip + 10, 0);
    wire::put32(ip + 12, 0x0a010001);
    wire::put32(ip + 16, uint32_t(0x0a800000 + sa));
    wire::ipv4_set_checksum(ip);
    wire::put16(ip + 20, 4500);
    wire::put16(ip + 22, 4500);
    wire::put16(ip + 24, uint16_t(size - 20));
    wire::put16(ip + 26, 0);
}

Result run_bench(const PipelineOptions &o, Engine &engine, Engine *checker,
                 const std::vector<std::vector<uint8_t>> &ciphertext, OrderedPool &pool)
{
    const bool encap = o.direction == "encap";
    // Enough bursts for every worker thread to hold `limit` packets and the io thread its
    // own, and frames for all of them.
    const size_t per_worker = (o.limit + o.burst - 1) / o.burst + 2;
    const size_t depth = std::min(OrderedPool::kDepth, per_worker * pool.workers()) + 1;
    std::vector<BenchJob> jobs(depth);
    std::vector<BenchJob *> free_jobs;
    for (auto &j : jobs)
        free_jobs.push_back(&j);
    const size_t nframes = std::max<size_t>(depth * o.burst, o.frames);
    std::vector<uint8_t> mem(nframes * kFrameSize);
    std::vector<Pkt> pkts(nframes);
    FreeFrames free_frames(nframes, o.frames != 0);
    for (size_t i = 0; i < nframes; i++)
        free_frames.push_back(&pkts[i]);
    for (size_t i = 0; i < nframes; i++)
        write_inner(mem.data() + i * kFrameSize + kFrameHeadroom, o.size, 0, true);
    std::vector<uint8_t> plain(o.size);
    write_inner(plain.data(), o.size, 0, true);
    // Each SA's IPv4 and UDP headers, made once: RX copies them in.
    constexpr size_t kHdr = 28;
    std::vector<uint8_t> headers(encap ? o.sas * kHdr : 0);
    for (size_t i = 0; encap && i < o.sas; i++) {
        write_inner(plain.data(), o.size, i, false);
        std::memcpy(headers.data() + i * kHdr, plain.data(), kHdr);
    }

    std::vector<uint64_t> last(o.sas, 0);  // encap: ESP sequence numbers; decap: RX order + 1
    Result r;
    const uint64_t sample_every = std::max<uint64_t>(1, o.packets / o.burst / 100000);
    r.latency.reserve(o.packets / o.burst / sample_every + 2);
    uint64_t bursts = 0;
    auto finish = [&](Job &job) {
        auto &j = static_cast<BenchJob &>(job);
        engine.end(j.b);
        if (j.rx_ns)
            r.latency.push_back(uint32_t(std::min<uint64_t>(now_ns() - j.rx_ns, UINT32_MAX)));
        for (size_t i = 0; i < j.n; i++) {
            Pkt &p = *j.pkts[i];
            const size_t sa = j.sa[i];
            if (p.verdict == (encap ? Verdict::Encrypted : Verdict::Decrypted)) {
                // TX. Encap: the ESP sequence number behind the outer IPv4 header and the
                // SPI; decap: where the packet was in the RX ring's order.
                uint64_t seq = encap ? wire::get32(p.ip() + wire::kIpv4Len + 4) : j.rx[i] + 1;
                r.out_of_order += encap ? seq != last[sa] + 1 : seq <= last[sa];
                last[sa] = seq;
                r.out++;
                if (o.verify) {
                    Pkt *one = &p;
                    if (encap) {  // the receiving side, another backend, takes it back
                        Classified c{Classified::Decap, uint32_t(sa), wire::kIpv4Len, false};
                        checker->process_classified(&one, &c, 1);
                    }
                    write_inner(plain.data(), o.size, sa, false);
                    r.bad += p.verdict != Verdict::Decrypted || p.len != o.size ||
                             std::memcmp(p.ip(), plain.data(), o.size) != 0;
                }
            } else {
                r.bad++;
            }
            free_frames.push_back(&p);
        }
        free_jobs.push_back(&j);
    };

    uint64_t next_sa = 0;
    const uint64_t t0 = now_ns();
    const double gap_ns = o.rate > 0 ? 1e9 / o.rate : 0;
    while (r.sent < o.packets) {
        size_t k = std::min<uint64_t>(o.burst, o.packets - r.sent);
        if (gap_ns > 0) {
            uint64_t due = t0 + uint64_t(double(r.sent) * gap_ns);
            while (now_ns() < due)
                pool.reap(finish);
        }
        while (free_frames.size() < k || free_jobs.empty())
            pool.reap(finish);
        // RX: k frames, the packets spread evenly over the SAs, each with the id the XDP
        // classifier would give it (out policy i, SA i).
        BenchJob &j = *free_jobs.back();
        free_jobs.pop_back();
        j.n = k;
        j.rx_ns = bursts++ % sample_every == 0 ? now_ns() : 0;
        for (size_t i = 0; i < k; i++) {
            Pkt *p = free_frames.take();
            const size_t sa = size_t(next_sa++ % o.sas);
            uint8_t *f = mem.data() + size_t(p - pkts.data()) * kFrameSize;
            uint32_t len = o.size;
            if (encap) {
                std::memcpy(f + kFrameHeadroom, headers.data() + sa * kHdr, kHdr);
            } else {
                const auto &c = ciphertext[sa];
                std::memcpy(f + kFrameHeadroom, c.data(), c.size());
                len = uint32_t(c.size());
            }
            *p = Pkt{f, kFrameSize, kFrameHeadroom, len};
            j.pkts[i] = p;
            j.sa[i] = uint32_t(sa);
            j.rx[i] = r.sent + i;
            j.cls[i] = encap ? Classified{Classified::Encap, uint32_t(sa), wire::kIpv4Len, false}
                             : Classified{Classified::Decap, uint32_t(sa), wire::kIpv4Len, false};
        }
        while (!engine.begin_classified(j.pkts, j.cls, k, j.b))  // tables changed: never here
            while (pool.in_flight())
                pool.reap(finish);
        j.run = run_bench_job;
        j.weight = uint32_t(k);
        j.nkeys = uint32_t(j.b.sa_keys(j.keys));
        while (!pool.submit(j))
            pool.reap(finish);
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
    if (o.direction != "encap" && o.direction != "decap")
        throw Failure("bench pipeline: --direction '" + o.direction + "' (encap or decap)");
    if (o.sas < 1 || o.sas > 100000)
        throw Failure("bench pipeline: --sas " + std::to_string(o.sas) +
                      " is not between 1 and 100000");
    if (o.burst < 1 || o.burst > kMaxBurst)
        throw Failure("bench pipeline: --burst " + std::to_string(o.burst) +
                      " is not between 1 and " + std::to_string(kMaxBurst));
    if (o.size < 28 || o.size > 1500)
        throw Failure("bench pipeline: --size " + std::to_string(o.size) +
                      " is not between 28 and 1500");
    const bool encap = o.direction == "encap";
    auto sender = make_bench_engine(bench_config(*t, o.sas, true, 64), *backend);
    Engine *cipher_side = sender.get();
    std::unique_ptr<Engine> receiver, checker;
    std::vector<std::vector<uint8_t>> ciphertext;
    if (!encap) {
        // One packet per SA, encrypted by the sending side.
        std::vector<uint8_t> frame(kFrameSize);
        for (size_t i = 0; i < o.sas; i++) {
            write_inner(frame.data() + kFrameHeadroom, o.size, i, true);
            Pkt p{frame.data(), kFrameSize, kFrameHeadroom, o.size};
            Pkt *one = &p;
            Classified c{Classified::Encap, uint32_t(i), wire::kIpv4Len, false};
            sender->process_classified(&one, &c, 1);
            if (p.verdict != Verdict::Encrypted)
                throw Failure("bench pipeline: cannot make the ciphertext of SA " +
                              std::to_string(i));
            ciphertext.emplace_back(p.ip(), p.ip() + p.len);
        }
        receiver = make_bench_engine(bench_config(*t, o.sas, false, 0), *backend);
        cipher_side = receiver.get();
    } else if (o.verify) {
        checker = make_bench_engine(bench_config(*t, o.sas, false, 0), Backend::OpenSsl);
    }
    // OpenSSL's contexts are per SA: its SAs are encrypted on the io thread alone.
    if (o.workers > 1 && !cipher_side->sas().all()[0]->cipher().thread_safe())
        throw Failure("bench pipeline: --workers " + std::to_string(o.workers) +
                      " needs the ipsecmb backend for " + o.transform +
                      " (OpenSSL contexts are per SA, not per thread)");
    // This thread (worker 0) on cpus[0], the other workers on the rest in turn; by default
    // worker i on CPU i
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
    Result r = run_bench(o, *cipher_side, checker.get(), ciphertext, **pool);

    double mpps = double(r.out) / r.seconds / 1e6;
    nlohmann::json j = {{"direction", o.direction},
                        {"workers", o.workers},
                        {"sas", o.sas},
                        {"size", o.size},
                        {"burst", o.burst},
                        {"packets", o.packets},
                        {"rate", o.rate},
                        {"limit", o.limit},
                        {"frames", o.frames},
                        {"transform", o.transform},
                        {"crypto", backend_name(cipher_side->sas().all()[0]->cipher().backend())},
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
        per.push_back({{"jobs", s.jobs}, {"packets", s.weight}, {"passed", s.passed}});
    }
    j["per_worker"] = per;
    if (o.json) {
        std::printf("%s\n", j.dump(1).c_str());
        return;
    }
    std::printf("pipeline: %s %s (%s), %u B, %zu SA(s), bursts of %zu, %u worker(s): "
                "%.3f Mpps, %.2f Gbps; %llu out of order, %llu lost%s; latency p50 %u ns, p99 "
                "%u ns, p99.9 %u ns\n",
                o.direction.c_str(), o.transform.c_str(), j["crypto"].get<std::string>().c_str(),
                o.size, o.sas, o.burst, o.workers, mpps, mpps * o.size * 8 / 1e3,
                (unsigned long long)r.out_of_order, (unsigned long long)(r.sent - r.out),
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
    c->add_option("--direction", o->direction,
                  "encap (plaintext in, ESP out) or decap (ESP in, plaintext out)");
    c->add_option("--rate", o->rate, "Packets a second offered (0: as fast as taken)");
    c->add_option("--limit", o->limit, "Packets in flight per worker thread");
    c->add_option("--frames", o->frames,
                  "Frames RX fills in turn, as a NIC's ring (0: as many as in flight, the last "
                  "freed first, so that they stay in cache)");
    c->add_option("--transform", o->transform, "aes128gcm, aes256gcm, ...");
    c->add_option("--crypto", o->crypto, "auto, openssl or ipsecmb");
    c->add_flag("--verify", o->verify,
                "Check every packet that comes out against the plaintext that went in (encap: "
                "decrypted by OpenSSL first; slower)");
    c->add_flag("--json", o->json, "Results as one JSON object");
    c->callback([o] { run_pipeline(*o); });
}

}  // namespace xesp::cli
