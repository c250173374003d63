// The gateway's pipeline (gateway.h, with workers): Engine::begin_classified() on the io
// thread, Engine::crypt() on worker threads that take their time (random delays), end() in
// the order the bursts came. What comes out must be what process_classified() makes on one
// thread: the same bytes in the same order, and on the receiving side the same verdicts for
// every packet (the replay window exact however the workers reorder their work: the packets
// it takes are the same, and so are the reasons it drops the rest for, but that a forged
// copy of a packet in flight fails on its ICV rather than as a replay, and that a copy
// may be too old by the time it is checked again), whether the
// SA's cipher may leave the io thread (intel-ipsec-mb) or not (OpenSSL).
#include <catch2/catch.hpp>

#include <chrono>
#include <random>
#include <thread>

#include "tests/unit/esp_fixture.h"
#include "userspace/pipeline/ordered_pool.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

struct BurstJob : Job {
    Engine::Burst b;
    std::vector<Pkt *> pkts;
    std::vector<Classified> cls;
    uint32_t delay_us = 0;
    size_t index = 0;
};

void run_burst_job(Job &j)
{
    auto &b = static_cast<BurstJob &>(j);
    if (b.delay_us)
        std::this_thread::sleep_for(std::chrono::microseconds(b.delay_us));
    Engine::crypt(b.b);
}

// The frames in bursts: through e.process_classified() one burst at a time, or through the
// pool's workers (begin, crypt, end in order). Returns the order the bursts ended in.
std::vector<size_t> run_bursts(Engine &e, std::vector<Frame> &frames,
                               const std::vector<size_t> &sizes, Classified cls, OrderedPool *pool,
                               std::mt19937 &rng)
{
    std::vector<size_t> ended;
    std::vector<std::unique_ptr<BurstJob>> jobs;
    size_t at = 0;
    for (size_t i = 0; i < sizes.size(); i++) {
        auto j = std::make_unique<BurstJob>();
        for (size_t k = 0; k < sizes[i]; k++)
            j->pkts.push_back(&frames[at + k].pkt);
        j->cls.assign(sizes[i], cls);
        j->index = i;
        j->delay_us = rng() % 4 == 0 ? rng() % 300 : 0;
        at += sizes[i];
        jobs.push_back(std::move(j));
    }
    if (!pool) {
        for (auto &j : jobs) {
            e.process_classified(j->pkts.data(), j->cls.data(), j->pkts.size());
            ended.push_back(j->index);
        }
        return ended;
    }
    auto finish = [&](Job &j) {
        auto &b = static_cast<BurstJob &>(j);
        e.end(b.b);
        ended.push_back(b.index);
    };
    for (auto &j : jobs) {
        REQUIRE(e.begin_classified(j->pkts.data(), j->cls.data(), j->pkts.size(), j->b));
        j->run = run_burst_job;
        j->nkeys = uint32_t(j->b.sa_keys(j->keys));
        j->weight = uint32_t(j->pkts.size());
        while (!pool->submit(*j))
            pool->reap(finish);
        pool->reap(finish);
    }
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pool->in_flight() && std::chrono::steady_clock::now() < end)
        if (!pool->reap(finish))
            std::this_thread::yield();
    return ended;
}

// Two frames of each packet: one for each run.
void twin_frames(const std::vector<std::vector<uint8_t>> &packets, std::vector<Frame> &a,
                 std::vector<Frame> &b)
{
    a.reserve(packets.size());
    b.reserve(packets.size());
    for (const auto &p : packets) {
        a.emplace_back(p);
        b.emplace_back(p);
    }
}

}  // namespace

TEST_CASE("bursts through delayed workers come out as on one thread, in order, replay exact",
          "[threads][pipeline]")
{
    const auto &t = all_transforms();
    for (const TransformCase *tc : {&t[0], &t[6]}) {
        for (Backend backend : {Backend::Auto, Backend::OpenSsl}) {
            INFO(tc->name << (backend == Backend::Auto ? " auto" : " openssl"));
            SaConfig sa = make_sa(*tc, Mode::Tunnel, 4);
            auto tx_one = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"), backend);
            auto tx_pipe = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"), backend);
            auto rx_one = make_engine(receiver(sa), backend);
            auto rx_pipe = make_engine(receiver(sa), backend);
            if (backend == Backend::Auto)
                REQUIRE(tx_pipe->sas().all()[0]->cipher().thread_safe());
            else
                REQUIRE_FALSE(tx_pipe->sas().all()[0]->cipher().thread_safe());
            auto pool = OrderedPool::create(3, {}, 64);
            REQUIRE(pool);
            std::mt19937 rng(42);

            // Encap: 150 bursts of 1 to 24 packets of varied sizes.
            std::vector<size_t> sizes;
            std::vector<std::vector<uint8_t>> plain;
            for (size_t i = 0; i < 150; i++) {
                sizes.push_back(1 + rng() % 24);
                for (size_t k = 0; k < sizes.back(); k++)
                    plain.push_back(udp_packet(4, "10.1.0.1", "10.2.0.1", rng() % 1200));
            }
            std::vector<Frame> a, b;
            twin_frames(plain, a, b);
            Classified enc{Classified::Encap, 0, kIpv4Len};
            run_bursts(*tx_one, a, sizes, enc, nullptr, rng);
            std::vector<size_t> order = run_bursts(*tx_pipe, b, sizes, enc, pool->get(), rng);
            REQUIRE(order.size() == sizes.size());
            for (size_t i = 0; i < order.size(); i++)
                REQUIRE(order[i] == i);
            bool random_iv = tc->aead == AeadAlg::None;
            for (size_t i = 0; i < a.size(); i++) {
                INFO("encap packet " << i);
                REQUIRE(a[i].pkt.verdict == Verdict::Encrypted);
                REQUIRE(b[i].pkt.verdict == Verdict::Encrypted);
                auto x = a[i].bytes(), y = b[i].bytes();
                if (random_iv) {  // the outer header, SPI and sequence number
                    REQUIRE(x.size() == y.size());
                    CHECK(std::equal(x.begin(), x.begin() + kIpv4Len + kEspHdrLen, y.begin()));
                } else {
                    CHECK(x == y);
                }
            }
            CHECK(tx_one->stats().encrypted == tx_pipe->stats().encrypted);
            // What the workers made decrypts, on one thread and another backend, to what went
            // in, packet by packet.
            auto rx_check = make_engine(receiver(sa), Backend::OpenSsl);
            for (size_t i = 0; i < b.size(); i++) {
                INFO("pipelined packet " << i);
                Frame f(b[i].bytes());
                Pkt *p = &f.pkt;
                Classified c{Classified::Decap, 0, kIpv4Len, false};
                rx_check->process_classified(&p, &c, 1);
                REQUIRE(f.pkt.verdict == Verdict::Decrypted);
                CHECK(f.bytes() == plain[i]);
            }

            // Decap: the ciphertext in a disorderly arrival, each run of 16 shuffled (within
            // the replay window), some packets twice, a few copies with a broken ICV.
            std::vector<std::vector<uint8_t>> esp;
            for (auto &f : a)
                esp.push_back(f.bytes());
            for (size_t i = 0; i < esp.size(); i += 16)
                std::shuffle(esp.begin() + long(i),
                             esp.begin() + long(std::min(esp.size(), i + 16)), rng);
            for (size_t i = 0; i < 200; i++) {
                size_t from = rng() % esp.size(), to = rng() % esp.size();
                auto copy = esp[from];
                if (i % 10 == 0)
                    copy.back() ^= 1;
                esp.insert(esp.begin() + long(std::max(from, to)), copy);
            }
            std::vector<Frame> da, db;
            twin_frames(esp, da, db);
            std::vector<size_t> dsizes;
            for (size_t left = esp.size(); left;) {
                dsizes.push_back(std::min(left, size_t(1 + rng() % 32)));
                left -= dsizes.back();
            }
            Classified dec{Classified::Decap, 0, kIpv4Len, false};
            run_bursts(*rx_one, da, dsizes, dec, nullptr, rng);
            order = run_bursts(*rx_pipe, db, dsizes, dec, pool->get(), rng);
            REQUIRE(order.size() == dsizes.size());
            size_t replays = 0, decrypted = 0, forged_in_flight = 0;
            for (size_t i = 0; i < da.size(); i++) {
                INFO("decap packet " << i);
                REQUIRE(da[i].pkt.verdict == db[i].pkt.verdict);
                // A forged copy of a packet still in flight passes the pre-check that a
                // serial run's window would stop it at; its ICV fails instead. Dropped
                // either way, and only such a packet.
                // One that is both a copy and too old by the time its number is checked again
                // may be called either.
                auto seq_error = [](Drop d) { return d == Drop::InReplay || d == Drop::InTooOld; };
                if (seq_error(da[i].pkt.drop) && db[i].pkt.drop == Drop::InIcvFail)
                    forged_in_flight++;
                else if (!seq_error(da[i].pkt.drop) || !seq_error(db[i].pkt.drop))
                    REQUIRE(da[i].pkt.drop == db[i].pkt.drop);
                if (da[i].pkt.verdict == Verdict::Decrypted)
                    CHECK(da[i].bytes() == db[i].bytes());
                replays += seq_error(da[i].pkt.drop);
                decrypted += da[i].pkt.verdict == Verdict::Decrypted;
            }
            CHECK(decrypted == plain.size());  // every packet once, none lost
            CHECK(replays > 100);              // and the copies caught
            CHECK(rx_one->stats().decrypted == rx_pipe->stats().decrypted);
            CHECK(rx_one->stats().dropped == rx_pipe->stats().dropped);
            CHECK(forged_in_flight <= 20);  // of the 20 forged copies
        }
    }
}

TEST_CASE("an SA updated while its bursts are in flight: the next burst waits for them, the "
          "replay window stays exact",
          "[threads][pipeline]")
{
    const TransformCase &tc = all_transforms()[0];
    SaConfig sa = make_sa(tc, Mode::Tunnel, 4);
    auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
    auto rx = make_engine(receiver(sa));
    std::vector<std::vector<uint8_t>> esp;
    for (int i = 0; i < 8; i++) {
        Frame f(udp_packet(4, "10.1.0.1", "10.2.0.1", 100));
        REQUIRE(run(*tx, f) == Verdict::Encrypted);
        esp.push_back(f.bytes());
    }
    // Burst a: the eight packets, begun and in flight. Then `sa update` (the same SA, a new
    // lifetime), and burst b: an attacker's copies of the eight.
    std::vector<Frame> fa, fb;
    twin_frames(esp, fa, fb);
    std::vector<Pkt *> pa, pb;
    for (size_t i = 0; i < esp.size(); i++) {
        pa.push_back(&fa[i].pkt);
        pb.push_back(&fb[i].pkt);
    }
    std::vector<Classified> cls(esp.size(), Classified{Classified::Decap, 0, kIpv4Len, false});
    Engine::Burst a, b;
    REQUIRE(rx->begin_classified(pa.data(), cls.data(), pa.size(), a));
    // Updated twice: the second change brings the tables a reader sees back to the same
    // of their two copies.
    SaConfig limited = sa;
    limited.dir = Dir::In;
    for (uint64_t hard : {1000u, 2000u}) {
        EngineChange update;
        limited.lifetime.hard_packets = hard;
        update.put_sas.push_back(limited);
        REQUIRE(rx->change(update, Backend::Auto));
    }
    Sa *now = rx->sas().find_in(limited.dst, limited.spi);
    REQUIRE(now);
    REQUIRE(now->following());

    // Begun now, b's SA would take over a window without a's numbers in it.
    CHECK_FALSE(rx->begin_classified(pb.data(), cls.data(), pb.size(), b));
    Engine::crypt(a);
    rx->end(a);
    for (auto &f : fa)
        REQUIRE(f.pkt.verdict == Verdict::Decrypted);
    REQUIRE(rx->begin_classified(pb.data(), cls.data(), pb.size(), b));
    Engine::crypt(b);
    rx->end(b);
    for (size_t i = 0; i < fb.size(); i++) {
        INFO("copy " << i);
        CHECK(fb[i].pkt.verdict == Verdict::Drop);
        CHECK(fb[i].pkt.drop == Drop::InReplay);
    }
    CHECK(rx->stats().decrypted == esp.size());
}

TEST_CASE("bursts over SAs of every kind come out of the workers as on one thread",
          "[threads][pipeline]")
{
    // In the same bursts: ciphers that may leave the io thread (GCM and CBC through
    // intel-ipsec-mb; their tunnel-mode headers are written on the worker) and one that may
    // not (ChaCha20-Poly1305 through OpenSSL, all on the io thread); IPv4 and IPv6 outer and
    // inner headers, NAT-T, and transport mode (whose headers prepare() writes).
    const auto &t = all_transforms();
    struct Kind {
        const TransformCase *tc;
        Mode mode;
        int outer, inner;
        bool natt;
    };
    const std::vector<Kind> kinds = {
        {&t[0], Mode::Tunnel, 4, 4, false},    {&t[5], Mode::Tunnel, 4, 4, false},
        {&t[0], Mode::Tunnel, 6, 4, false},    {&t[6], Mode::Tunnel, 4, 4, true},
        {&t[0], Mode::Transport, 4, 4, false}, {&t[2], Mode::Tunnel, 6, 6, true},
        {&t[0], Mode::Tunnel, 4, 6, false},
    };
    // Tunnel i carries 10.i.0.0/16 -> 10.200.i.0/24, or fd00:i::/64 -> fd00:200:i::/64.
    auto inner_addr = [&](size_t i, bool dst) {
        const std::string n = std::to_string(i);
        if (kinds[i].mode == Mode::Transport)
            return std::string(dst ? "192.0.2.2" : "192.0.2.1");
        if (kinds[i].inner == 6)
            return std::string(dst ? "fd00:200:" + n + "::1" : "fd00:" + n + "::1");
        return std::string(dst ? "10.200." + n + ".1" : "10." + n + ".0.1");
    };
    Config c;
    std::vector<SaConfig> sas;
    for (size_t i = 0; i < kinds.size(); i++) {
        SaConfig sa = make_sa(*kinds[i].tc, kinds[i].mode, kinds[i].outer, kinds[i].natt);
        sa.spi = uint32_t(0x2000 + i);
        sa.reqid = uint32_t(i + 1);
        sa.dir = Dir::Out;
        PolicyConfig p;
        p.dir = Dir::Out;
        const std::string len = kinds[i].inner == 6 ? "/64" : "/24";
        p.sel.src = pfx((inner_addr(i, false) + len).c_str());
        p.sel.dst = pfx((inner_addr(i, true) + len).c_str());
        p.tmpl = tmpl_for(sa);
        c.sas.push_back(sa);
        c.policies.push_back(p);
        sas.push_back(sa);
    }
    auto one = make_engine(c);
    auto pipe = make_engine(c);
    REQUIRE(pipe->sas().all()[0]->cipher().thread_safe());
    REQUIRE_FALSE(pipe->sas().all()[1]->cipher().thread_safe());
    auto pool = OrderedPool::create(3, {}, 64);
    REQUIRE(pool);
    std::mt19937 rng(4303);

    std::vector<size_t> sizes, sa_of;
    std::vector<std::vector<uint8_t>> plain;
    for (size_t i = 0; i < 200; i++) {
        sizes.push_back(1 + rng() % 40);
        for (size_t k = 0; k < sizes.back(); k++) {
            size_t s = rng() % kinds.size();
            sa_of.push_back(s);
            plain.push_back(udp_packet(kinds[s].inner, inner_addr(s, false).c_str(),
                                       inner_addr(s, true).c_str(), rng() % 1200, uint8_t(rng())));
        }
    }
    std::vector<Frame> a, b;
    twin_frames(plain, a, b);
    run_bursts(*one, a, sizes, Classified{Classified::Plain}, nullptr, rng);
    std::vector<size_t> order =
        run_bursts(*pipe, b, sizes, Classified{Classified::Plain}, pool->get(), rng);
    REQUIRE(order.size() == sizes.size());
    std::vector<std::unique_ptr<Engine>> rx;
    for (const SaConfig &sa : sas)
        rx.push_back(make_engine(receiver(sa), Backend::OpenSsl));
    size_t cbc = 0;
    for (size_t i = 0; i < a.size(); i++) {
        INFO("packet " << i << ", SA " << sa_of[i]);
        REQUIRE(a[i].pkt.verdict == Verdict::Encrypted);
        REQUIRE(b[i].pkt.verdict == Verdict::Encrypted);
        auto x = a[i].bytes(), y = b[i].bytes();
        if (kinds[sa_of[i]].tc->aead == AeadAlg::None) {  // random IVs: up to the IV
            size_t iv_at = kIpv4Len + kUdpLen + kEspHdrLen;
            REQUIRE(x.size() == y.size());
            CHECK(std::equal(x.begin(), x.begin() + long(iv_at), y.begin()));
            cbc++;
        } else {
            CHECK(x == y);
        }
        Frame f(y);  // what the workers made decrypts to what went in
        REQUIRE(run(*rx[sa_of[i]], f) == Verdict::Decrypted);
        CHECK(f.bytes() == plain[i]);
    }
    CHECK(cbc > 0);
    CHECK(one->stats().encrypted == pipe->stats().encrypted);
}
