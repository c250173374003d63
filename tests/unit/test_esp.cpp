// The ESP engine end to end through Engine::process: every transform, mode, family mix, NAT-T
// and ESN round-trips; the wire format is checked field by field; bad input is dropped with its
// own counter. Independent implementations check the bytes in tests/interop/.
#include <catch2/catch.hpp>

#include <cstring>

#include "tests/unit/esp_fixture.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

struct Family {
    int outer, inner;
    const char *inner_src, *inner_dst, *src_pfx, *dst_pfx;
};

const Family kFamilies[] = {
    {4, 4, "10.1.0.1", "10.2.0.1", "10.1.0.0/16", "10.2.0.0/16"},
    {4, 6, "fd01::1", "fd02::1", "fd01::/16", "fd02::/16"},
    {6, 4, "10.1.0.1", "10.2.0.1", "10.1.0.0/16", "10.2.0.0/16"},
    {6, 6, "fd01::1", "fd02::1", "fd01::/16", "fd02::/16"},
};

std::vector<Backend> backends_for(const Transform &xf)
{
    std::vector<Backend> out;
    for (Backend b : {Backend::OpenSsl, Backend::IpsecMb})
        if (backend_supports(b, xf))
            out.push_back(b);
    return out;
}

}  // namespace

TEST_CASE("ESP round trip: every transform, mode, family, NAT-T and ESN", "[esp]")
{
    for (const auto &t : all_transforms()) {
        for (Mode mode : {Mode::Tunnel, Mode::Transport}) {
            for (const Family &f : kFamilies) {
                if (mode == Mode::Transport && f.inner != f.outer)
                    continue;
                for (bool natt : {false, true}) {
                    for (bool esn : {false, true}) {
                        SaConfig sa = make_sa(t, mode, f.outer, natt, esn);
                        if (esn) {
                            sa.oseq = 0xfffffffe;  // cross the 2^32 boundary
                            sa.seq = 0xfffffff0;
                        }
                        const char *isrc = mode == Mode::Tunnel
                                               ? f.inner_src
                                               : (f.outer == 4 ? "192.0.2.1" : "2001:db8::1");
                        const char *idst = mode == Mode::Tunnel
                                               ? f.inner_dst
                                               : (f.outer == 4 ? "192.0.2.2" : "2001:db8::2");
                        const char *spfx =
                            mode == Mode::Tunnel
                                ? f.src_pfx
                                : (f.outer == 4 ? "192.0.2.1/32" : "2001:db8::1/128");
                        const char *dpfx =
                            mode == Mode::Tunnel
                                ? f.dst_pfx
                                : (f.outer == 4 ? "192.0.2.2/32" : "2001:db8::2/128");
                        for (Backend be : backends_for(sa.xf)) {
                            INFO(t.name << (mode == Mode::Tunnel ? " tunnel" : " transport")
                                        << " outer v" << f.outer << " inner v" << f.inner
                                        << (natt ? " natt" : "") << (esn ? " esn" : "") << " "
                                        << backend_name(be));
                            auto tx = make_engine(sender(sa, spfx, dpfx), be);
                            auto rx = make_engine(receiver(sa), be);
                            for (size_t payload : {0u, 1u, 17u, 100u, 1371u}) {
                                auto plain = udp_packet(f.inner, isrc, idst, payload);
                                Frame fr(plain);
                                REQUIRE(run(*tx, fr) == Verdict::Encrypted);
                                const uint8_t *ip = fr.pkt.ip();
                                REQUIRE((ip[0] >> 4) == f.outer);
                                uint8_t proto = f.outer == 4 ? ip[9] : ip[6];
                                CHECK(proto == (natt ? kProtoUdp : kProtoEsp));
                                // the payload is hidden unless the cipher is NULL/GMAC
                                if (payload >= 16 && t.enc != EncAlg::Null &&
                                    t.aead != AeadAlg::AesGmac) {
                                    auto out = fr.bytes();
                                    auto hay = std::search(out.begin(), out.end(), plain.end() - 16,
                                                           plain.end());
                                    CHECK(hay == out.end());
                                }
                                fr.pkt.l4 = 0;
                                REQUIRE(run(*rx, fr) == Verdict::Decrypted);
                                CHECK(fr.bytes() == plain);
                            }
                            CHECK(rx->stats().decrypted == 5);
                            CHECK(rx->sas().all()[0]->counters().packets == 5);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("ESP wire format: header, IV, sequence numbers, padding, outer header", "[esp]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    sa.oseq = 41;
    auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
    auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 5, 0xb9);  // DSCP 46, ECT(1)
    Frame fr(plain);
    REQUIRE(run(*tx, fr) == Verdict::Encrypted);
    const uint8_t *ip = fr.pkt.ip();
    CHECK(ip[0] == 0x45);
    CHECK(ip[1] == 0xb9);  // RFC 6040 normal mode: copied
    CHECK(get16(ip + 2) == fr.pkt.len);
    CHECK((ip[6] & 0x40) == 0x40);  // DF copied from the inner header
    CHECK(ip[9] == kProtoEsp);
    CHECK(csum_fold(csum_add(0, ip, 20)) == 0xffff);  // valid header checksum
    CHECK(IpAddr::v4(ip + 12) == sa.src);
    CHECK(IpAddr::v4(ip + 16) == sa.dst);
    const uint8_t *esp = ip + 20;
    CHECK(get32(esp) == 0x1000);
    CHECK(get32(esp + 4) == 42);  // replay-oseq is the last one sent
    CHECK(get32(esp + 8) == 0);   // IV = 64-bit sequence number
    CHECK(get32(esp + 12) == 42);
    // 33-byte inner + 2 trailer -> padded to 36: length = 20 + 8 + 8 + 36 + 16
    CHECK(fr.pkt.len == 20 + 8 + 8 + 36 + 16);
    CHECK(tx->sas().all()[0]->oseq() == 42);

    SECTION("IPv6 inside IPv4: DF set outside, as routers never cut IPv6 (RFC 8200 5)")
    {
        auto v6 = make_engine(sender(sa, "fd00:1::/64", "fd00:2::/64"));
        Frame f(udp_packet(6, "fd00:1::1", "fd00:2::1", 5, 0xb9));
        REQUIRE(run(*v6, f) == Verdict::Encrypted);
        CHECK((f.pkt.ip()[6] & 0x40) == 0x40);
        CHECK(f.pkt.ip()[1] == 0xb9);
        CHECK(csum_fold(csum_add(0, f.pkt.ip(), 20)) == 0xffff);
    }
}

TEST_CASE("ESP tunnel MTU accounts for headers, padding and ICV", "[esp]")
{
    auto sa = Sa::create(make_sa(all_transforms()[0], Mode::Tunnel, 4), Backend::OpenSsl);
    REQUIRE(sa);
    // 1500 - 20 (IP) - 8 (ESP) - 8 (IV) - 16 (ICV) = 1448, multiple of 4, minus the trailer
    CHECK((*sa)->inner_mtu(1500) == 1446);
    auto cbc = Sa::create(make_sa(all_transforms()[6], Mode::Tunnel, 6, true), Backend::OpenSsl);
    REQUIRE(cbc);
    // 1500 - 40 - 8 (UDP) - 8 - 16 (IV) - 12 (ICV) = 1416, down to 1408 = 88 * 16, minus
    // the trailer
    CHECK((*cbc)->inner_mtu(1500) == 1406);
}

namespace {

// A receiver for one SA and ESP packets made by a sender of the same SA, or by hand: the
// cipher encrypts a payload we choose, so the checks after the ICV can be reached.
struct Inbound {
    SaConfig sa;
    std::unique_ptr<Engine> rx;
    std::unique_ptr<SaCipher> cipher;

    explicit Inbound(SaConfig c) : sa(std::move(c)), rx(make_engine(receiver(sa)))
    {
        cipher = std::move(*make_cipher(Backend::OpenSsl, sa.xf, sa.esn));
    }

    // outer IPv4 | ESP(spi, seq) | IV | payload (encrypted as given) | ICV
    std::vector<uint8_t> craft(const std::vector<uint8_t> &payload, uint32_t seq)
    {
        uint32_t iv = sa.xf.iv_len(), icv = sa.xf.icv_len;
        std::vector<uint8_t> p(20 + 8 + iv + payload.size() + icv);
        p[0] = 0x45;
        put16(&p[2], uint16_t(p.size()));
        p[8] = 64;
        p[9] = kProtoEsp;
        std::memcpy(&p[12], sa.src.b.data(), 4);
        std::memcpy(&p[16], sa.dst.b.data(), 4);
        ipv4_set_checksum(p.data());
        put32(&p[20], sa.spi);
        put32(&p[24], seq);
        for (uint32_t i = 0; i < iv; i++)
            p[28 + i] = uint8_t(seq + i);
        std::memcpy(&p[28 + iv], payload.data(), payload.size());
        CryptoOp op{&p[20], uint32_t(payload.size()), 0, false};
        cipher->encrypt(&op, 1);
        REQUIRE(op.ok);
        return p;
    }

    Drop drop_of(const std::vector<uint8_t> &pkt)
    {
        Frame f(pkt);
        run(*rx, f);
        return f.pkt.verdict == Verdict::Drop ? f.pkt.drop : Drop::Count;
    }
};

std::vector<uint8_t> with_trailer(std::vector<uint8_t> plain, uint8_t nh, uint32_t block)
{
    uint32_t pad = (block - (plain.size() + 2) % block) % block;
    for (uint32_t i = 0; i < pad; i++)
        plain.push_back(uint8_t(i + 1));
    plain.push_back(uint8_t(pad));
    plain.push_back(nh);
    return plain;
}

}  // namespace

TEST_CASE("bad ESP input is dropped, each with its own counter", "[esp][bad-input]")
{
    const auto &gcm = all_transforms()[0];
    const auto &cbc = all_transforms()[6];
    auto inner = udp_packet(4, "10.1.0.1", "10.2.0.1", 40);

    Inbound g(make_sa(gcm, Mode::Tunnel, 4));
    auto good = g.craft(with_trailer(inner, kProtoIpIp, 4), 1);
    CHECK(g.drop_of(good) == Drop::Count);  // the control: accepted

    SECTION("truncated ESP header")
    {
        auto p = good;
        p.resize(20 + 6);
        put16(&p[2], uint16_t(p.size()));
        CHECK(g.drop_of(p) == Drop::InTruncated);
    }
    SECTION("IP total length larger than the packet")
    {
        auto p = good;
        put16(&p[2], uint16_t(p.size() + 100));
        CHECK(g.drop_of(p) == Drop::InBadLength);
    }
    SECTION("too short to hold IV and ICV")
    {
        auto p = good;
        p.resize(20 + 8 + 8 + 10);
        put16(&p[2], uint16_t(p.size()));
        CHECK(g.drop_of(p) == Drop::InShortIcv);
    }
    SECTION("payload not a multiple of the block size")
    {
        Inbound c(make_sa(cbc, Mode::Tunnel, 4));
        auto p = c.craft(with_trailer(inner, kProtoIpIp, 16), 1);
        p.insert(p.end() - 12, 4, 0);
        put16(&p[2], uint16_t(p.size()));
        CHECK(c.drop_of(p) == Drop::InBadBlockSize);
    }
    SECTION("ICV does not verify")
    {
        auto fresh = g.craft(with_trailer(inner, kProtoIpIp, 4), 2);
        auto p = fresh;
        p.back() ^= 1;
        CHECK(g.drop_of(p) == Drop::InIcvFail);
        auto q = fresh;
        q[40] ^= 0x80;
        CHECK(g.drop_of(q) == Drop::InIcvFail);
    }
    SECTION("replayed and too old")
    {
        CHECK(g.drop_of(good) == Drop::InReplay);
        auto far = g.craft(with_trailer(inner, kProtoIpIp, 4), 1000);
        CHECK(g.drop_of(far) == Drop::Count);
        auto old = g.craft(with_trailer(inner, kProtoIpIp, 4), 2);
        CHECK(g.drop_of(old) == Drop::InTooOld);
        // neither counted against the SA's lifetime
        CHECK(g.rx->sas().all()[0]->counters().packets == 2);
    }
    SECTION("padding bytes not 1, 2, 3, ...")
    {
        auto pl = with_trailer(inner, kProtoIpIp, 4);  // 68 + 2 -> pad 2
        REQUIRE(pl[pl.size() - 2] == 2);
        pl[pl.size() - 3] = 7;
        CHECK(g.drop_of(g.craft(pl, 2)) == Drop::InBadPadding);
    }
    SECTION("pad length beyond the payload")
    {
        auto pl = with_trailer(inner, kProtoIpIp, 4);
        pl[pl.size() - 2] = 250;
        CHECK(g.drop_of(g.craft(pl, 2)) == Drop::InBadPadding);
    }
    SECTION("next header neither IPv4 nor IPv6 in tunnel mode")
    {
        CHECK(g.drop_of(g.craft(with_trailer(inner, kProtoTcp, 4), 2)) == Drop::InBadNextHeader);
    }
    SECTION("dummy packet (next header 59) is dropped and counted")
    {
        CHECK(g.drop_of(g.craft(with_trailer({1, 2, 3, 4}, kProtoNone, 4), 2)) == Drop::InDummy);
        CHECK(g.rx->stats().drops[Drop::InDummy] == 1);
    }
    SECTION("inner header that lies about its length")
    {
        auto bad = inner;
        put16(&bad[2], uint16_t(bad.size() + 8));
        CHECK(g.drop_of(g.craft(with_trailer(bad, kProtoIpIp, 4), 2)) == Drop::InBadInner);
    }
    SECTION("TFC padding after the inner packet is tolerated and removed")
    {
        auto tfc = inner;
        tfc.resize(tfc.size() + 23, 0);
        Frame f(g.craft(with_trailer(tfc, kProtoIpIp, 4), 2));
        REQUIRE(run(*g.rx, f) == Verdict::Decrypted);
        CHECK(f.bytes() == inner);
    }
    SECTION("ESP for an SPI we do not have passes unchanged")
    {
        auto p = good;
        put32(&p[20], 0x9999);
        Frame f(p);
        CHECK(run(*g.rx, f) == Verdict::Pass);
        CHECK(f.bytes() == p);
        CHECK(g.rx->stats().esp_unknown_spi == 1);
    }
    SECTION("plain ESP for a NAT-T SA")
    {
        Inbound n(make_sa(gcm, Mode::Tunnel, 4, true));
        CHECK(n.drop_of(good) == Drop::InEncapMismatch);
    }
    // every drop above is also in the engine's per-reason counter
    const auto &st = g.rx->stats();
    uint64_t sum = 0;
    for (auto v : st.drops.drops)
        sum += v;
    CHECK(sum == st.dropped);
}

TEST_CASE("NAT-T: IKE and keepalives pass, ESP in UDP is decrypted", "[esp][natt]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4, true);
    auto rx = make_engine(receiver(sa));
    auto udp4500 = [&](std::vector<uint8_t> payload) {
        auto p = udp_packet(4, "192.0.2.1", "192.0.2.2", payload.size(), 0, 4500, 4500);
        std::memcpy(&p[28], payload.data(), payload.size());
        return p;
    };
    Frame ike(udp4500({0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}));
    CHECK(run(*rx, ike) == Verdict::Pass);
    Frame ka(udp4500({0xff}));
    CHECK(run(*rx, ka) == Verdict::Pass);
    CHECK(rx->stats().ike == 1);
    CHECK(rx->stats().keepalive == 1);

    auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
    auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 64);
    Frame f(plain);
    REQUIRE(run(*tx, f) == Verdict::Encrypted);
    CHECK(get16(f.pkt.ip() + 20) == 4500);
    CHECK(get16(f.pkt.ip() + 22) == 4500);
    CHECK(get16(f.pkt.ip() + 24) == f.pkt.len - 20);
    REQUIRE(run(*rx, f) == Verdict::Decrypted);
    CHECK(f.bytes() == plain);
}

TEST_CASE("sequence numbers never wrap", "[esp][seq]")
{
    const auto &gcm = all_transforms()[0];
    for (bool esn : {false, true}) {
        SaConfig sa = make_sa(gcm, Mode::Tunnel, 4, false, esn);
        sa.oseq = 0xfffffffe;
        if (esn)
            sa.oseq_hi = 0xffffffff;
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        int reports = 0;
        tx->on_expire([&](const Sa &, bool hard) { reports += hard; });
        auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 10);
        Frame a(plain), b(plain), c(plain);
        CHECK(run(*tx, a) == Verdict::Encrypted);
        CHECK(get32(a.pkt.ip() + 24) == 0xffffffff);
        CHECK(run(*tx, b) == Verdict::Drop);
        CHECK(b.pkt.drop == Drop::OutSeqExhausted);
        CHECK(reports == 1);                  // reported once, as a hard expire
        CHECK(run(*tx, c) == Verdict::Drop);  // and stays stopped
        CHECK(reports == 1);
        CHECK(tx->sas().all()[0]->hard_expired());
    }
}

TEST_CASE("lifetimes: soft limit notifies, hard limit stops the SA", "[esp][lifetime]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    sa.lifetime.soft_packets = 2;
    sa.lifetime.hard_packets = 3;
    auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
    std::vector<bool> events;
    tx->on_expire([&](const Sa &, bool hard) { events.push_back(hard); });
    auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 10);
    for (int i = 0; i < 3; i++) {
        Frame f(plain);
        CHECK(run(*tx, f) == Verdict::Encrypted);
    }
    Frame f(plain);
    CHECK(run(*tx, f) == Verdict::Drop);
    CHECK(f.pkt.drop == Drop::OutExpired);
    CHECK(events == std::vector<bool>{false, true});

    SaConfig bytes = make_sa(gcm, Mode::Tunnel, 4);
    bytes.lifetime.hard_bytes = 100;
    auto tb = make_engine(sender(bytes, "10.1.0.0/16", "10.2.0.0/16"));
    Frame small(udp_packet(4, "10.1.0.1", "10.2.0.1", 10)),
        big(udp_packet(4, "10.1.0.1", "10.2.0.1", 200));
    CHECK(run(*tb, small) == Verdict::Encrypted);
    CHECK(run(*tb, big) == Verdict::Drop);
}

TEST_CASE("time limits are checked a share at a time, every SA within a second", "[esp][lifetime]")
{
    constexpr uint64_t s = 1'000'000'000, ms = 1'000'000;
    constexpr size_t n = 1000;
    const auto &gcm = all_transforms()[0];
    Config c;
    for (size_t i = 0; i < n; i++) {
        SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
        sa.spi = uint32_t(0x1000 + i);
        sa.dir = Dir::Out;
        sa.lifetime.hard_add_s = 5;
        c.sas.push_back(sa);
    }
    auto e = make_engine(c);
    size_t hard = 0;
    e->on_expire([&](const Sa &, bool h) { hard += h; });
    uint64_t t0 = 0;
    for (const auto &sa : e->sas().all())
        t0 = std::max(t0, sa->added_ns());

    // A millisecond a call: a thousandth of the SAs each time, never all of them at once.
    uint64_t t = t0;
    e->check_time_some(t);
    size_t most = 0, total = 0, half = 0;
    while (t < t0 + 6 * s + 2 * ms) {
        t += ms;
        size_t k = e->check_time_some(t);
        most = std::max(most, k);
        total += k;
        if (t <= t0 + 5 * s - ms)
            REQUIRE(hard == 0);
        if (t == t0 + 5 * s + s / 2)
            half = hard;
    }
    CHECK(most <= 2);
    CHECK(total >= 6 * n);
    CHECK(total <= 6 * n + 2);
    // Past the limit, the round reaches every SA within a second, spread over it.
    CHECK(hard == n);
    CHECK(half > n / 3);
    CHECK(half < 2 * n / 3);

    // After a pause of a second or more, all of them at once.
    size_t all = e->check_time_some(t + 2 * s);
    CHECK(all == n);
}

TEST_CASE("lifetimes in time: since the SA was added, and since it was first used",
          "[esp][lifetime]")
{
    constexpr uint64_t s = 1'000'000'000;
    const auto &gcm = all_transforms()[0];
    auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 10);

    SECTION("time-soft and time-hard count from the add")
    {
        SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
        sa.lifetime.soft_add_s = 10;
        sa.lifetime.hard_add_s = 20;
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        std::vector<bool> events;
        tx->on_expire([&](const Sa &, bool hard) { events.push_back(hard); });
        const Sa &x = *tx->sas().all()[0];
        uint64_t t0 = x.added_ns();
        CHECK(t0 != 0);
        CHECK(x.seconds_left(t0, false) == 10);
        CHECK(x.seconds_left(t0 + 10 * s - 1, false) == 1);
        CHECK(x.seconds_left(t0 + 10 * s - 1, true) == 11);
        tx->check_time(t0 + 10 * s - 1);
        CHECK(events.empty());
        tx->check_time(t0 + 10 * s);
        CHECK(events == std::vector<bool>{false});
        CHECK(x.soft_expired());
        Frame f(plain);
        CHECK(run(*tx, f) == Verdict::Encrypted);  // soft: still carries traffic
        tx->check_time(t0 + 15 * s);
        CHECK(events.size() == 1);  // each limit tells once
        tx->check_time(t0 + 20 * s);
        CHECK(events == std::vector<bool>{false, true});
        Frame g(plain);
        CHECK(run(*tx, g) == Verdict::Drop);
        CHECK(g.pkt.drop == Drop::OutExpired);
        tx->check_time(t0 + 30 * s);
        CHECK(events.size() == 2);
    }
    SECTION("time-use-hard counts from the first packet; an unused SA never expires")
    {
        SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
        sa.lifetime.hard_use_s = 5;
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        const Sa &x = *tx->sas().all()[0];
        uint64_t t0 = x.added_ns();
        tx->check_time(t0 + 100 * s);
        CHECK(!x.hard_expired());
        CHECK(x.first_use_ns() == 0);
        CHECK(x.seconds_left(t0 + 100 * s, true) == UINT64_MAX);   // not started
        CHECK(x.seconds_left(t0 + 100 * s, false) == UINT64_MAX);  // no soft limit at all
        Frame f(plain);
        CHECK(run(*tx, f) == Verdict::Encrypted);
        tx->check_time(t0 + 200 * s);  // sees the use: the clock starts
        CHECK(x.first_use_ns() == t0 + 200 * s);
        tx->check_time(t0 + 204 * s);
        CHECK(x.seconds_left(t0 + 204 * s, true) == 1);
        CHECK(!x.hard_expired());
        tx->check_time(t0 + 205 * s);
        CHECK(x.hard_expired());
        CHECK(!x.soft_expired());
    }
    SECTION("an SA that a reload keeps keeps its clock; one that changes starts again")
    {
        SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
        sa.lifetime.hard_add_s = 20;
        Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
        auto tx = make_engine(c);
        uint64_t t0 = tx->sas().all()[0]->added_ns();
        auto same = Engine::create(c, Backend::Auto, {}, tx.get());
        REQUIRE(same);
        CHECK((*same)->sas().all()[0]->added_ns() == t0);
        c.sas.nth(0).lifetime.hard_add_s = 30;
        auto changed = Engine::create(c, Backend::Auto, {}, same->get());
        REQUIRE(changed);
        const Sa &y = *(*changed)->sas().all()[0];
        CHECK(y.added_ns() > t0);
        (*changed)->check_time(t0 + 25 * s);
        CHECK(!y.hard_expired());
        (*changed)->check_time(y.added_ns() + 30 * s);
        CHECK(y.hard_expired());
    }
}

TEST_CASE("ECN on decapsulation follows RFC 6040", "[esp][ecn]")
{
    // RFC 6040 Figure 4, indexed by codepoint: 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE; -1 = drop
    //            outer: Not-ECT     ECT(1)      ECT(0)      CE
    const int table[4][4] = {
        {kEcnNotEct, kEcnNotEct, kEcnNotEct, -1},  // inner Not-ECT
        {kEcnEct1, kEcnEct1, kEcnEct1, kEcnCe},    // inner ECT(1)
        {kEcnEct0, kEcnEct1, kEcnEct0, kEcnCe},    // inner ECT(0)
        {kEcnCe, kEcnCe, kEcnCe, kEcnCe},          // inner CE
    };
    for (int inner = 0; inner < 4; inner++)
        for (int outer = 0; outer < 4; outer++) {
            INFO("inner " << inner << " outer " << outer);
            CHECK(ecn_decapsulate(uint8_t(outer), uint8_t(inner)) == table[inner][outer]);
        }

    // through the engine: outer CE marks an ECT inner packet, drops a Not-ECT one
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
    auto rx = make_engine(receiver(sa));
    for (uint8_t inner_tos : {uint8_t(0xb8 | kEcnEct0), uint8_t(0xb8)}) {
        Frame f(udp_packet(4, "10.1.0.1", "10.2.0.1", 20, inner_tos));
        REQUIRE(run(*tx, f) == Verdict::Encrypted);
        ip_set_tos(f.pkt.ip(), uint8_t(inner_tos | kEcnCe));  // congestion on the way
        Verdict v = run(*rx, f);
        if (inner_tos & kEcnMask) {
            REQUIRE(v == Verdict::Decrypted);
            CHECK(f.pkt.ip()[1] == (0xb8 | kEcnCe));
            CHECK(csum_fold(csum_add(0, f.pkt.ip(), 20)) == 0xffff);
        } else {
            CHECK(v == Verdict::Drop);
            CHECK(f.pkt.drop == Drop::InEcnDrop);
        }
    }
}

TEST_CASE("policies: block, missing SA fails closed, inbound checks", "[esp][policy]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 10);

    SECTION("block policy drops plaintext")
    {
        Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
        PolicyConfig block;
        block.sel.src = pfx("10.1.0.0/16");
        block.sel.dst = pfx("10.2.0.1/32");
        block.dir = Dir::Out;
        block.action = Action::Block;
        block.priority = 0;
        c.policies.nth(0).priority = 10;
        c.policies.push_back(block);
        auto tx = make_engine(c);
        Frame f(plain);
        CHECK(run(*tx, f) == Verdict::Drop);
        CHECK(f.pkt.drop == Drop::OutPolBlock);
        Frame other(udp_packet(4, "10.1.0.1", "10.2.0.2", 10));
        CHECK(run(*tx, other) == Verdict::Encrypted);
    }
    SECTION("a policy whose SA is missing drops, never sends plaintext")
    {
        Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
        c.sas.clear();
        auto tx = make_engine(c);
        Frame f(plain);
        CHECK(run(*tx, f) == Verdict::Drop);
        CHECK(f.pkt.drop == Drop::OutNoStates);
    }
    SECTION("unmatched plaintext passes")
    {
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        Frame f(udp_packet(4, "10.9.0.1", "10.2.0.1", 10));
        CHECK(run(*tx, f) == Verdict::Pass);
    }
    SECTION("inner addresses outside the SA's selector")
    {
        SaConfig narrow = sa;
        narrow.sel = Selector{pfx("10.1.0.0/24"), pfx("10.2.0.0/24")};
        auto tx = make_engine(sender(sa, "10.0.0.0/8", "10.0.0.0/8"));
        auto rx = make_engine(receiver(narrow));
        Frame ok(plain), bad(udp_packet(4, "10.1.7.1", "10.2.0.1", 10));
        REQUIRE(run(*tx, ok) == Verdict::Encrypted);
        REQUIRE(run(*tx, bad) == Verdict::Encrypted);
        CHECK(run(*rx, ok) == Verdict::Decrypted);
        CHECK(run(*rx, bad) == Verdict::Drop);
        CHECK(bad.pkt.drop == Drop::InSelectorMismatch);
    }
    SECTION("what comes out of an SA and matches no in or fwd policy is dropped")
    {
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        auto rx = make_engine(receiver(sa, false));
        Frame f(plain);
        REQUIRE(run(*tx, f) == Verdict::Encrypted);
        CHECK(run(*rx, f) == Verdict::Drop);
        CHECK(f.pkt.drop == Drop::InNoPolicy);
        CHECK(rx->stats().drops[Drop::InNoPolicy] == 1);
    }
    SECTION("the fwd policies judge what is forwarded, the in policies what is delivered here")
    {
        // An in policy takes what comes out of the SA; a fwd policy of the same selector
        // blocks it. As the kernel: the gateway's own traffic meets the in policy, what it
        // forwards the fwd one. Where the gateway's addresses are not known (`xesp pcap`
        // without --local), the in policy, then the fwd one.
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        Config rc = receiver(sa, false);
        PolicyConfig in = accept_from(sa, "0.0.0.0/0"), fwd = in;
        in.dir = Dir::In;
        fwd.tmpl.reset();
        fwd.action = Action::Block;
        rc.policies.push_back(in);
        rc.policies.push_back(fwd);
        EngineOptions forwards, delivers, broadcast, unknown;
        forwards.local = std::vector<IpAddr>{sa.dst};
        delivers.local = std::vector<IpAddr>{sa.dst, addr("10.2.0.1")};
        // 10.2.0.1 a broadcast address of the gateway's (a /31 route's, say): delivered too.
        broadcast.local = std::vector<IpAddr>{sa.dst};
        broadcast.broadcast = std::vector<IpAddr>{addr("10.2.0.1"), addr("10.9.255.255")};
        struct Case {
            const char *name;
            const EngineOptions &opt;
            Verdict decrypted;  // the ESP of a packet to 10.2.0.1
            Drop drop;          // and the same packet arriving in the clear
        } cases[] = {
            {"forwarded", forwards, Verdict::Drop, Drop::InPolBlock},
            {"delivered", delivers, Verdict::Decrypted, Drop::InUnprotected},
            {"to a broadcast address", broadcast, Verdict::Decrypted, Drop::InUnprotected},
            {"not known", unknown, Verdict::Decrypted, Drop::InUnprotected},
        };
        for (const Case &c : cases) {
            INFO(c.name);
            auto rx = Engine::create(rc, Backend::Auto, c.opt);
            REQUIRE(rx);
            Frame f(plain), clear(plain);
            REQUIRE(run(*tx, f) == Verdict::Encrypted);
            CHECK(run(**rx, f) == c.decrypted);
            if (c.decrypted == Verdict::Drop)
                CHECK(f.pkt.drop == Drop::InPolBlock);
            CHECK(run(**rx, clear) == Verdict::Drop);
            CHECK(clear.pkt.drop == c.drop);
        }
        // The gateway's addresses as it learns them later (set_local), in no order.
        auto rx = Engine::create(rc, Backend::Auto, forwards);
        REQUIRE(rx);
        (*rx)->set_local({addr("fd00::1"), addr("10.2.0.1"), addr("10.9.9.9"), sa.dst,
                          addr("10.0.0.1"), addr("10.3.0.1"), addr("10.4.0.1")});
        Frame f(plain);
        REQUIRE(run(*tx, f) == Verdict::Encrypted);
        CHECK(run(**rx, f) == Verdict::Decrypted);
        // And its broadcast addresses (set_broadcast), in no order.
        (*rx)->set_local({sa.dst});
        Frame g(plain);
        REQUIRE(run(*tx, g) == Verdict::Encrypted);
        CHECK(run(**rx, g) == Verdict::Drop);
        (*rx)->set_broadcast({addr("10.3.255.255"), addr("10.2.0.1"), addr("10.1.255.255")});
        Frame h(plain);
        REQUIRE(run(*tx, h) == Verdict::Encrypted);
        CHECK(run(**rx, h) == Verdict::Decrypted);
    }
    SECTION("an SA without dir decrypts only ESP to the gateway's own addresses")
    {
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        Config rc = receiver(sa);
        EngineOptions theirs, ours;
        theirs.local = std::vector<IpAddr>{sa.src};  // the sender's side
        ours.local = std::vector<IpAddr>{addr("10.9.9.9"), sa.dst};
        struct Case {
            const char *name;
            Dir dir;
            const EngineOptions &opt;
            Verdict verdict;
        } cases[] = {
            {"no dir, to us", Dir::Unspec, ours, Verdict::Decrypted},
            {"no dir, reflected", Dir::Unspec, theirs, Verdict::Drop},
            {"dir in, not to us", Dir::In, theirs, Verdict::Decrypted},
            {"dir out, to us", Dir::Out, ours, Verdict::Drop},
        };
        for (const Case &c : cases) {
            INFO(c.name);
            rc.sas.nth(0).dir = c.dir;
            auto rx = Engine::create(rc, Backend::Auto, c.opt);
            REQUIRE(rx);
            Frame f(plain), g(plain);
            REQUIRE(run(*tx, f) == Verdict::Encrypted);
            REQUIRE(run(*tx, g) == Verdict::Encrypted);
            CHECK(run(**rx, f) == c.verdict);
            // The same through the classifier's path.
            Pkt *p = &g.pkt;
            Classified cls{Classified::Decap, 0, kIpv4Len, false};
            (*rx)->process_classified(&p, &cls, 1);
            CHECK(g.pkt.verdict == c.verdict);
            if (c.verdict == Verdict::Drop) {
                CHECK(f.pkt.drop == Drop::InReflected);
                CHECK(g.pkt.drop == Drop::InReflected);
            }
        }
    }
    SECTION("an SA replaced under the same keys keeps its replay window")
    {
        SaConfig in = sa;
        in.replay_window = 64;
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        Config rc = receiver(in);
        auto rx = make_engine(rc);
        Frame f(plain);
        REQUIRE(run(*tx, f) == Verdict::Encrypted);
        std::vector<uint8_t> esp = f.bytes();
        REQUIRE(run(*rx, f) == Verdict::Decrypted);
        rc.sas.nth(0).lifetime.hard_packets = 1000;  // `sa update` with a new limit
        auto rx2 = Engine::create(rc, Backend::Auto, {}, rx.get());
        REQUIRE(rx2);
        Frame again(esp);
        CHECK(run(**rx2, again) == Verdict::Drop);
        CHECK(again.pkt.drop == Drop::InReplay);
        rc.sas.nth(0).xf.salt = {9, 9, 9, 9};  // new keys: a new window
        auto rx3 = Engine::create(rc, Backend::Auto, {}, rx2->get());
        REQUIRE(rx3);
        CHECK((*rx3)->sas().all()[0]->replay().highest() == 0);
    }
    SECTION("inbound policy that expects another SA")
    {
        Config rc = receiver(sa, false);
        PolicyConfig in;
        in.sel.src = pfx("10.1.0.0/16");
        in.sel.dst = pfx("10.2.0.0/16");
        in.dir = Dir::Fwd;
        in.tmpl = PolicyTmpl{sa.src, sa.dst, 0, 77, Mode::Tunnel};
        rc.policies.push_back(in);
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        auto rx = make_engine(rc);
        Frame f(plain);
        REQUIRE(run(*tx, f) == Verdict::Encrypted);
        CHECK(run(*rx, f) == Verdict::Drop);
        CHECK(f.pkt.drop == Drop::InTmplMismatch);
    }
}

TEST_CASE("what the kernel takes as a martian does not come out of an SA", "[esp][policy]")
{
    // Policies that send and take any address, as a full-tunnel gateway has them. The
    // kernel's input would still drop what comes to or from these addresses (martians):
    // handed to its raw socket, they would leave as the gateway's own packets.
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    Config tc = sender(sa, "0.0.0.0/0", "0.0.0.0/0");
    for (const Config &v6 = sender(sa, "::/0", "::/0"); const PolicyConfig &p : v6.policies)
        tc.policies.push_back(p);
    auto tx = make_engine(tc);
    EngineOptions gw, unknown;
    gw.local = std::vector<IpAddr>{sa.dst,      addr("10.9.0.1"), addr("127.0.0.1"),
                                   addr("::1"), addr("fe80::1"),  addr("fd09::1")};
    gw.broadcast = std::vector<IpAddr>{addr("10.9.0.255"), addr("255.255.255.255")};
    struct Case {
        const char *src, *dst;
        bool martian;          // the gateway's addresses known
        bool unknown_martian;  // not known (`xesp pcap` without --local)
    } cases[] = {
        {"10.2.0.2", "10.1.0.2", false, false},
        {"10.2.0.2", "127.0.0.1", true, true},
        {"10.2.0.2", "127.1.2.3", true, true},
        {"127.0.0.1", "10.1.0.2", true, true},
        {"224.0.0.9", "10.1.0.2", true, true},
        {"255.255.255.255", "10.1.0.2", true, true},
        {"0.0.0.0", "10.1.0.2", true, true},
        {"0.0.0.0", "255.255.255.255", false, false},
        {"0.0.0.0", "224.0.0.1", false, false},
        {"0.0.0.0", "239.1.2.3", true, true},
        {"10.2.0.2", "0.1.2.3", true, true},
        {"10.9.0.1", "10.1.0.2", true, false},    // the gateway's own address
        {"10.9.0.255", "10.1.0.2", true, false},  // its broadcast address
        {"10.2.0.2", "239.1.2.3", false, false},  // a group: the gateway decides
        {"10.2.0.2", "10.9.0.1", false, false},
        {"fd02::2", "fd01::2", false, false},
        {"fd02::2", "::1", true, true},
        {"::1", "fd01::2", true, true},
        {"ff02::1", "fd01::2", true, true},
        {"::ffff:10.0.0.1", "fd01::2", false, false},  // as Linux takes it since 5.12
        {"fd02::2", "ff01::1", true, true},            // interface-local scope
        {"fd02::2", "ff00::1", true, true},            // reserved scope 0
        {"fd02::2", "ff02::1", false, false},
        {"fe80::2", "ff02::5", false, false},
        {"fe80::2", "fd01::2", true, false},  // forwarded from a link-local address
        {"fe80::2", "fd09::1", false, false},
        {"::", "fd01::2", true, false},
        {"::", "fd09::1", false, false},
        {"fd02::2", "fe80::5", true, false},  // to another link's link-local address
        {"fd02::2", "fe80::1", false, false},
        {"fd02::2", "::", true, true},
    };
    Config rc = receiver(sa);  // fwd policies; and in policies for what is delivered here
    for (const char *any : {"0.0.0.0/0", "::/0"}) {
        PolicyConfig in = accept_from(sa, any);
        in.dir = Dir::In;
        rc.policies.push_back(in);
    }
    for (bool known : {true, false}) {
        auto rx = Engine::create(rc, Backend::Auto, known ? gw : unknown);
        REQUIRE(rx);
        uint64_t martians = 0;
        for (const Case &c : cases) {
            INFO(c.src << " -> " << c.dst << (known ? "" : ", addresses not known"));
            const bool want = known ? c.martian : c.unknown_martian;
            Frame f(udp_packet(std::strchr(c.dst, ':') ? 6 : 4, c.src, c.dst, 12));
            REQUIRE(run(*tx, f) == Verdict::Encrypted);
            CHECK(run(**rx, f) == (want ? Verdict::Drop : Verdict::Decrypted));
            if (want)
                CHECK(f.pkt.drop == Drop::InMartian);
            martians += want;
        }
        CHECK((*rx)->stats().drops[Drop::InMartian] == martians);
    }
}

TEST_CASE("transport mode keeps IPv6 extension headers in front of ESP", "[esp][transport]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Transport, 6);
    // IPv6 | hop-by-hop (8 bytes, PadN) | UDP
    auto p = udp_packet(6, "2001:db8::1", "2001:db8::2", 30);
    std::vector<uint8_t> hbh = {kProtoUdp, 0, 1, 4, 0, 0, 0, 0};
    p.insert(p.begin() + 40, hbh.begin(), hbh.end());
    p[6] = kProtoIpv6HopByHop;
    put16(&p[4], uint16_t(p.size() - 40));
    auto tx = make_engine(sender(sa, "2001:db8::1/128", "2001:db8::2/128"));
    auto rx = make_engine(receiver(sa));
    Frame f(p);
    REQUIRE(run(*tx, f) == Verdict::Encrypted);
    CHECK(f.pkt.ip()[6] == kProtoIpv6HopByHop);
    CHECK(f.pkt.ip()[40] == kProtoEsp);
    CHECK(get32(f.pkt.ip() + 48) == 0x1000);
    REQUIRE(run(*rx, f) == Verdict::Decrypted);
    CHECK(f.bytes() == p);
}

TEST_CASE("fragments and unprotected plaintext never leak", "[esp][policy][fragment]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    auto fragment = [](uint16_t frag_field) {
        auto p = udp_packet(4, "10.1.0.1", "10.2.0.1", 64, 0, 1000, 80);
        put16(&p[6], frag_field);
        ipv4_set_checksum(p.data());
        return p;
    };
    SECTION("fragments of a protected flow are encrypted (tunnel mode carries them)")
    {
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        Frame first(fragment(0x2000)), later(fragment(0x0010));
        CHECK(run(*tx, first) == Verdict::Encrypted);
        CHECK(run(*tx, later) == Verdict::Encrypted);
    }
    SECTION("a fragment only a port-specific policy could claim is dropped")
    {
        Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
        c.policies.nth(0).sel.proto = kProtoUdp;
        c.policies.nth(0).sel.dport_set = true;
        c.policies.nth(0).sel.dport = 80;
        auto tx = make_engine(c);
        Frame whole(udp_packet(4, "10.1.0.1", "10.2.0.1", 64, 0, 1000, 80));
        CHECK(run(*tx, whole) == Verdict::Encrypted);
        Frame later(fragment(0x0010));
        CHECK(run(*tx, later) == Verdict::Drop);
        CHECK(later.pkt.drop == Drop::FragmentUnclassifiable);
    }
    SECTION("plaintext an inbound policy says must come protected is dropped")
    {
        Config rc = receiver(sa, false);
        PolicyConfig in;
        in.sel.src = pfx("10.1.0.0/16");
        in.sel.dst = pfx("10.2.0.0/16");
        in.dir = Dir::Fwd;
        in.tmpl = PolicyTmpl{sa.src, sa.dst, 0, 1, Mode::Tunnel};
        rc.policies.push_back(in);
        auto rx = make_engine(rc);
        Frame f(udp_packet(4, "10.1.0.1", "10.2.0.1", 10));
        CHECK(run(*rx, f) == Verdict::Drop);
        CHECK(f.pkt.drop == Drop::InUnprotected);
        Frame other(udp_packet(4, "10.3.0.1", "10.2.0.1", 10));
        CHECK(run(*rx, other) == Verdict::Pass);
    }
}

namespace {

// The UDP checksum of an IPv4 packet verifies (pseudo header included).
bool udp4_checksum_ok(const std::vector<uint8_t> &p)
{
    uint32_t udp_len = get16(&p[24]);
    uint32_t sum = csum_add(0, &p[12], 8) + kProtoUdp + udp_len;
    sum = csum_add(sum, &p[20], udp_len);
    return csum_fold(sum) == 0xffff;
}

std::vector<uint8_t> with_udp_checksum(std::vector<uint8_t> p)
{
    put16(&p[26], 0);
    uint32_t udp_len = get16(&p[24]);
    uint32_t sum = csum_add(0, &p[12], 8) + kProtoUdp + udp_len;
    sum = csum_add(sum, &p[20], udp_len);
    put16(&p[26], uint16_t(~csum_fold(sum)));
    return p;
}

}  // namespace

TEST_CASE("NAT-T transport mode fixes the inner checksum for the NAT-OA (RFC 3948 3.1.2)",
          "[esp][natt]")
{
    const auto &gcm = all_transforms()[0];
    // The peer thinks it is 10.0.0.5; the NAT makes it 192.0.2.1.
    SaConfig peer = make_sa(gcm, Mode::Transport, 4, true);
    peer.src = addr("10.0.0.5");
    SaConfig local = make_sa(gcm, Mode::Transport, 4, true);
    local.encap->oaddr = addr("10.0.0.5");
    auto plain = with_udp_checksum(udp_packet(4, "10.0.0.5", "192.0.2.2", 50));
    REQUIRE(udp4_checksum_ok(plain));
    auto tx = make_engine(sender(peer, "10.0.0.5/32", "192.0.2.2/32"));
    auto rx = make_engine(receiver(local));
    Frame f(plain);
    REQUIRE(run(*tx, f) == Verdict::Encrypted);
    // the NAT rewrites the source address (and the IPv4 header checksum)
    std::memcpy(f.pkt.ip() + 12, local.src.b.data(), 4);
    ipv4_set_checksum(f.pkt.ip());
    REQUIRE(run(*rx, f) == Verdict::Decrypted);
    auto out = f.bytes();
    CHECK(IpAddr::v4(&out[12]) == local.src);
    CHECK(udp4_checksum_ok(out));
    CHECK(std::equal(out.begin() + 28, out.end(), plain.begin() + 28));

    // `encap espinudp 4500 4500 0.0.0.0`: no original address known, nothing to fix
    local.encap->oaddr = addr("0.0.0.0");
    auto rx0 = make_engine(receiver(local));
    auto tx0 = make_engine(sender(local, "192.0.2.1/32", "192.0.2.2/32"));
    auto same = with_udp_checksum(udp_packet(4, "192.0.2.1", "192.0.2.2", 50));
    Frame g(same);
    REQUIRE(run(*tx0, g) == Verdict::Encrypted);
    REQUIRE(run(*rx0, g) == Verdict::Decrypted);
    CHECK(g.bytes() == same);
}

TEST_CASE("a packet that no longer fits the tunnel is answered with the MTU that does",
          "[esp][mtu]")
{
    const auto &gcm = all_transforms()[0];
    EngineOptions opt;
    opt.link_mtu = 1500;
    opt.icmp_src4 = addr("10.1.0.254");
    for (int family : {4, 6}) {
        SaConfig sa = make_sa(gcm, Mode::Tunnel, family);
        const char *src = family == 4 ? "10.1.0.1" : "fd01::1";
        const char *dst = family == 4 ? "10.2.0.1" : "fd02::1";
        auto tx = Engine::create(sender(sa, family == 4 ? "10.1.0.0/16" : "fd01::/16",
                                        family == 4 ? "10.2.0.0/16" : "fd02::/16"),
                                 Backend::Auto, opt);
        REQUIRE(tx);
        uint32_t fits = (*tx)->sas().all()[0]->inner_mtu(1500);
        size_t hdr = family == 4 ? 28 : 48;
        Frame ok(udp_packet(family, src, dst, fits - hdr));
        CHECK(run(**tx, ok) == Verdict::Encrypted);
        CHECK(ok.pkt.len <= 1500);
        auto big = udp_packet(family, src, dst, fits - hdr + 1);  // DF set for IPv4
        Frame f(big);
        REQUIRE(run(**tx, f) == Verdict::TooBig);
        auto out = f.bytes();
        if (family == 4) {
            CHECK(IpAddr::v4(&out[12]) == opt.icmp_src4);
            CHECK(IpAddr::v4(&out[16]) == addr(src));
            CHECK(out[9] == 1);
            CHECK(out[20] == 3);
            CHECK(out[21] == 4);
            CHECK(get16(&out[26]) == fits);
            CHECK(out.size() == 576);
            CHECK(csum_fold(csum_add(0, out.data(), 20)) == 0xffff);
            CHECK(csum_fold(csum_add(0, &out[20], out.size() - 20)) == 0xffff);
            CHECK(std::equal(out.begin() + 28, out.end(), big.begin()));
        } else {
            CHECK(IpAddr::v6(&out[8]) == sa.src);  // no IPv6 source given: the SA's
            CHECK(IpAddr::v6(&out[24]) == addr(src));
            CHECK(out[6] == kProtoIcmpv6);
            CHECK(out[40] == 2);
            CHECK(get32(&out[44]) == fits);
            CHECK(out.size() == 1280);
            uint32_t sum = csum_add(0, &out[8], 32) + uint32_t(out.size() - 40) + kProtoIcmpv6;
            CHECK(csum_fold(csum_add(sum, &out[40], out.size() - 40)) == 0xffff);
            CHECK(std::equal(out.begin() + 48, out.end(), big.begin()));
        }
        CHECK((*tx)->stats().too_big == 1);
    }
    SECTION("IPv4 without DF is encrypted anyway, with DF clear outside")
    {
        SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
        auto tx = Engine::create(sender(sa, "10.1.0.0/16", "10.2.0.0/16"), Backend::Auto, opt);
        REQUIRE(tx);
        auto p = udp_packet(4, "10.1.0.1", "10.2.0.1", 1472);
        p[6] = 0;
        ipv4_set_checksum(p.data());
        Frame f(p);
        CHECK(run(**tx, f) == Verdict::Encrypted);
        CHECK((f.pkt.ip()[6] & 0x40) == 0);
    }
}
