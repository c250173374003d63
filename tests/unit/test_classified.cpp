// Engine::process_classified, the gateway's path: handed the XDP classifier's verdict, the engine
// must produce the same bytes, verdicts and counters as process() does when it classifies the
// packets itself; ids that no longer name an SA or a policy fail closed; classified_from_meta
// reads the metadata in front of a frame.
#include <catch2/catch.hpp>

#include <cstring>

#include "bpf/abi_check.h"
#include "tests/unit/esp_fixture.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

std::unique_ptr<Engine> make_engine_opt(const Config &c, const EngineOptions &opt)
{
    auto e = Engine::create(c, Backend::Auto, opt);
    if (!e)
        throw std::runtime_error(e.error().message);
    return std::move(*e);
}

void check_same_counters(const Engine &a, const Engine &b)
{
    const EngineStats &x = a.stats(), &y = b.stats();
    CHECK(x.encrypted == y.encrypted);
    CHECK(x.decrypted == y.decrypted);
    CHECK(x.passed == y.passed);
    CHECK(x.dropped == y.dropped);
    CHECK(x.too_big == y.too_big);
    CHECK(x.esp_unknown_spi == y.esp_unknown_spi);
    CHECK(x.drops.drops == y.drops.drops);
    REQUIRE(a.sas().all().size() == b.sas().all().size());
    for (size_t i = 0; i < a.sas().all().size(); i++) {
        const Counters &s = a.sas().all()[i]->counters(), &t = b.sas().all()[i]->counters();
        CHECK(s.packets == t.packets);
        CHECK(s.bytes == t.bytes);
        CHECK(s.drops == t.drops);
    }
}

// Runs the same packets through a.process() and b.process_classified() in one burst each.
void run_both(Engine &a, Engine &b, std::vector<Frame> &fa, std::vector<Frame> &fb,
              const std::vector<Classified> &cls)
{
    std::vector<Pkt *> pa, pb;
    for (size_t i = 0; i < fa.size(); i++) {
        pa.push_back(&fa[i].pkt);
        pb.push_back(&fb[i].pkt);
    }
    a.process(pa.data(), pa.size());
    b.process_classified(pb.data(), cls.data(), pb.size());
}

Verdict run_classified(Engine &e, Frame &f, const Classified &c)
{
    Pkt *p = &f.pkt;
    e.process_classified(&p, &c, 1);
    return f.pkt.verdict;
}

PolicyConfig in_policy(const SaConfig &sa, const char *src, const char *dst)
{
    PolicyConfig p;
    p.sel.src = pfx(src);
    p.sel.dst = pfx(dst);
    p.dir = Dir::In;
    p.priority = 100;
    p.tmpl = tmpl_for(sa);
    return p;
}

constexpr uint16_t kBlockedPort = 666;

}  // namespace

TEST_CASE("process_classified gives the bytes and counters of process()", "[classified]")
{
    const auto &t = all_transforms();
    for (const TransformCase *tc : {&t[0], &t[4], &t[5], &t[6], &t[10]}) {
        for (Mode mode : {Mode::Tunnel, Mode::Transport}) {
            for (int family : {4, 6}) {
                for (bool natt : {false, true}) {
                    INFO(tc->name << (mode == Mode::Tunnel ? " tunnel" : " transport") << " v"
                                  << family << (natt ? " natt" : ""));
                    SaConfig sa = make_sa(*tc, mode, family, natt);
                    bool tunnel = mode == Mode::Tunnel;
                    const char *src = tunnel ? (family == 4 ? "10.1.0.1" : "fd01::1")
                                             : (family == 4 ? "192.0.2.1" : "2001:db8::1");
                    const char *dst = tunnel ? (family == 4 ? "10.2.0.1" : "fd02::1")
                                             : (family == 4 ? "192.0.2.2" : "2001:db8::2");
                    const char *spfx = tunnel ? (family == 4 ? "10.1.0.0/16" : "fd01::/16")
                                              : (family == 4 ? "192.0.2.1/32" : "2001:db8::1/128");
                    const char *dpfx = tunnel ? (family == 4 ? "10.2.0.0/16" : "fd02::/16")
                                              : (family == 4 ? "192.0.2.2/32" : "2001:db8::2/128");
                    EngineOptions opt;
                    opt.link_mtu = 1400;

                    // The receiver checks what comes out against an inbound policy, and blocks
                    // one source port with a policy in front of it.
                    Config rc = receiver(sa);
                    rc.policies.push_back(in_policy(sa, spfx, dpfx));
                    PolicyConfig block = in_policy(sa, spfx, dpfx);
                    block.tmpl.reset();
                    block.action = Action::Block;
                    block.priority = 10;
                    block.sel.proto = kProtoUdp;
                    block.sel.sport_set = true;
                    block.sel.sport = kBlockedPort;
                    rc.policies.push_back(block);

                    auto txa = make_engine_opt(sender(sa, spfx, dpfx), opt);
                    auto txb = make_engine_opt(sender(sa, spfx, dpfx), opt);
                    auto rxa = make_engine_opt(rc, opt);
                    auto rxb = make_engine_opt(rc, opt);

                    std::vector<std::vector<uint8_t>> plain;
                    for (size_t payload : {0u, 17u, 100u, 1000u})
                        plain.push_back(udp_packet(family, src, dst, payload));
                    plain.push_back(udp_packet(family, src, dst, 40, 0, kBlockedPort));
                    plain.push_back(udp_packet(family, src, dst, 1400));  // too big, DF
                    std::vector<Frame> fa, fb;
                    fa.reserve(plain.size());
                    fb.reserve(plain.size());
                    for (const auto &p : plain) {
                        fa.emplace_back(p);
                        fb.emplace_back(p);
                    }
                    // Link-layer padding behind a packet: both paths must trim it.
                    fa[1].pkt.len += 6;
                    fb[1].pkt.len += 6;
                    uint16_t hl = family == 4 ? kIpv4Len : kIpv6Len;
                    std::vector<Classified> enc(fa.size(), Classified{Classified::Encap, 0, hl});
                    run_both(*txa, *txb, fa, fb, enc);

                    // A random IV (CBC) makes the ciphertext differ, and with it the UDP
                    // checksum over IPv6; everything else up to the end of the ESP header may
                    // not.
                    bool random_iv = tc->aead == AeadAlg::None && tc->enc != EncAlg::Null;
                    size_t esp_end = hl + (natt ? kUdpLen : 0) + kEspHdrLen;
                    for (size_t i = 0; i < fa.size(); i++) {
                        INFO("encap packet " << i);
                        REQUIRE(fa[i].pkt.verdict == fb[i].pkt.verdict);
                        CHECK(fa[i].pkt.drop == fb[i].pkt.drop);
                        auto a = fa[i].bytes(), b = fb[i].bytes();
                        if (random_iv && fa[i].pkt.verdict == Verdict::Encrypted) {
                            REQUIRE(a.size() == b.size());
                            if (natt && family == 6)
                                a[hl + 6] = b[hl + 6], a[hl + 7] = b[hl + 7];
                            CHECK(std::equal(a.begin(), a.begin() + esp_end, b.begin()));
                        } else {
                            CHECK(a == b);
                        }
                    }
                    CHECK(fa[5].pkt.verdict == Verdict::TooBig);
                    CHECK(txa->stats().encrypted == 5);
                    check_same_counters(*txa, *txb);

                    // Decapsulation: the same ciphertext to both receivers, plus a replay and a
                    // packet with a broken ICV.
                    std::vector<std::vector<uint8_t>> esp;
                    for (size_t i = 0; i < 5; i++)
                        esp.push_back(fa[i].bytes());
                    esp.push_back(esp[2]);
                    esp.push_back(esp[3]);
                    esp.back().back() ^= 1;
                    std::vector<Frame> da, db;
                    da.reserve(esp.size());
                    db.reserve(esp.size());
                    for (const auto &p : esp) {
                        da.emplace_back(p);
                        db.emplace_back(p);
                    }
                    da[0].pkt.len += 4;
                    db[0].pkt.len += 4;
                    uint16_t l4 = uint16_t(hl + (natt ? kUdpLen : 0));
                    Classified dec{Classified::Decap, 0, l4, natt};
                    std::vector<Classified> decs(da.size(), dec);
                    run_both(*rxa, *rxb, da, db, decs);
                    for (size_t i = 0; i < da.size(); i++) {
                        INFO("decap packet " << i);
                        CHECK(da[i].pkt.verdict == db[i].pkt.verdict);
                        CHECK(da[i].pkt.drop == db[i].pkt.drop);
                        CHECK(da[i].bytes() == db[i].bytes());
                    }
                    for (size_t i : {0u, 1u, 2u, 3u})
                        CHECK(db[i].bytes() == plain[i]);
                    CHECK(db[4].pkt.drop == Drop::InPolBlock);
                    CHECK(db[5].pkt.drop == Drop::InReplay);
                    CHECK(db[6].pkt.drop == Drop::InIcvFail);
                    check_same_counters(*rxa, *rxb);
                }
            }
        }
    }
}

TEST_CASE("SA and policy ids are indexes in the configuration", "[classified]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig a = make_sa(gcm, Mode::Tunnel, 4), b = a;
    b.spi = 0x2000;
    b.dir = Dir::In;
    Config c = sender(a, "10.1.0.0/16", "10.2.0.0/16");
    c.sas.push_back(b);
    PolicyConfig first = c.policies.nth(0);
    first.priority = 200;
    PolicyConfig in = in_policy(a, "10.2.0.0/16", "10.1.0.0/16");
    in.priority = 1;
    c.policies = {first, in};
    auto e = make_engine(c);

    REQUIRE(e->sas().all().size() == 2);
    for (uint32_t i = 0; i < 2; i++) {
        CHECK(e->sa_by_id(i) == e->sas().all()[i].get());
        CHECK(e->sa_id(*e->sas().all()[i]) == i);
    }
    CHECK(e->sa_by_id(1)->config().spi == 0x2000);
    CHECK(e->sa_by_id(2) == nullptr);
    auto other = make_engine(c);
    CHECK(e->sa_id(*other->sas().all()[0]) == Engine::kNoId);

    REQUIRE(e->policy_count() == 2);
    CHECK(e->policy_by_id(0)->priority == 200);  // lookup order does not change ids
    CHECK(e->policy_by_id(1)->dir == Dir::In);
    CHECK(e->policy_by_id(2) == nullptr);
}

TEST_CASE("classified ids that name nothing fail closed", "[classified]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 10);
    const Classified encap{Classified::Encap, 0, kIpv4Len};

    SECTION("a stale SA id drops as in-no-state")
    {
        SaConfig other = sa;
        other.spi = 0x2000;
        Config rc = receiver(sa);
        rc.sas.push_back(other);
        rc.sas.back().dir = Dir::In;
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        auto rx = make_engine(rc);
        Frame f(plain);
        REQUIRE(run(*tx, f) == Verdict::Encrypted);
        auto esp = f.bytes();

        {  // another SA's id
            Frame g(esp);
            CHECK(run_classified(*rx, g, Classified{Classified::Decap, 1, kIpv4Len}) ==
                  Verdict::Drop);
            CHECK(g.pkt.drop == Drop::InNoStates);
            CHECK(g.bytes() == esp);
        }
        CHECK(rx->stats().drops[Drop::InNoStates] == 1);
        CHECK(rx->stats().dropped == 1);
        CHECK(rx->sa_by_id(0)->counters().drops[size_t(Drop::InNoStates)] == 0);

        Frame nat(esp);
        CHECK(run_classified(*rx, nat, Classified{Classified::Decap, 0, kIpv4Len, true}) ==
              Verdict::Drop);
        CHECK(nat.pkt.drop == Drop::InEncapMismatch);
        CHECK(rx->sa_by_id(0)->counters()[Drop::InEncapMismatch] == 1);

        Frame cut(esp);
        cut.pkt.len = kIpv4Len + 4;
        put16(cut.pkt.ip() + 2, uint16_t(cut.pkt.len));
        CHECK(run_classified(*rx, cut, Classified{Classified::Decap, 0, kIpv4Len}) ==
              Verdict::Drop);
        CHECK(cut.pkt.drop == Drop::InTruncated);

        Frame ok(esp);
        CHECK(run_classified(*rx, ok, Classified{Classified::Decap, 0, kIpv4Len}) ==
              Verdict::Decrypted);
        CHECK(ok.bytes() == plain);

        for (uint32_t id : {7u, Engine::kNoId}) {  // no SA: a change removed it, look again
            INFO("id " << id);
            Frame next(plain);
            REQUIRE(run(*tx, next) == Verdict::Encrypted);
            Frame g(next.bytes());
            CHECK(run_classified(*rx, g, Classified{Classified::Decap, id, kIpv4Len}) ==
                  Verdict::Decrypted);
            CHECK(g.bytes() == plain);
        }
        CHECK(rx->stats().reclassified == 2);  // those two, none of the others
    }
    SECTION("an out policy whose SA is missing drops as out-no-state")
    {
        for (Mode mode : {Mode::Tunnel, Mode::Transport}) {
            SaConfig s = make_sa(gcm, mode, 4);
            bool tunnel = mode == Mode::Tunnel;
            Config c = sender(s, tunnel ? "10.1.0.0/16" : "192.0.2.1/32",
                              tunnel ? "10.2.0.0/16" : "192.0.2.2/32");
            c.sas.clear();
            auto tx = make_engine(c);
            Frame f(tunnel ? plain : udp_packet(4, "192.0.2.1", "192.0.2.2", 10));
            CHECK(run_classified(*tx, f, encap) == Verdict::Drop);
            CHECK(f.pkt.drop == Drop::OutNoStates);
            CHECK(tx->stats().drops[Drop::OutNoStates] == 1);
        }
        // Transport: the SA is found with the packet's addresses; other addresses, no SA.
        SaConfig s = make_sa(gcm, Mode::Transport, 4);
        auto tx = make_engine(sender(s, "192.0.0.0/8", "192.0.0.0/8"));
        Frame ok(udp_packet(4, "192.0.2.1", "192.0.2.2", 10));
        CHECK(run_classified(*tx, ok, encap) == Verdict::Encrypted);
        Frame none(udp_packet(4, "192.0.2.1", "192.0.2.3", 10));
        CHECK(run_classified(*tx, none, encap) == Verdict::Drop);
        CHECK(none.pkt.drop == Drop::OutNoStates);
    }
    SECTION("an in policy's id drops as out-no-state; an id no table has is looked up again")
    {
        Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
        c.policies.push_back(in_policy(sa, "10.2.0.0/16", "10.1.0.0/16"));
        auto tx = make_engine(c);
        Frame in(plain);  // an in policy's id
        CHECK(run_classified(*tx, in, Classified{Classified::Encap, 1, kIpv4Len}) == Verdict::Drop);
        CHECK(in.pkt.drop == Drop::OutNoStates);
        CHECK(tx->stats().dropped == 1);
        for (uint32_t id : {2u, Engine::kNoId}) {  // none: a change removed it, look again
            Frame f(plain);
            CHECK(run_classified(*tx, f, Classified{Classified::Encap, id, kIpv4Len}) ==
                  Verdict::Encrypted);
        }
        CHECK(tx->stats().reclassified == 2);
    }
    SECTION("a block policy drops; an allow policy without template passes")
    {
        Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
        PolicyConfig block = c.policies.nth(0);
        block.tmpl.reset();
        block.action = Action::Block;
        block.sel.src = pfx("10.1.0.0/24");  // a policy of its own (another selector)
        PolicyConfig bypass = c.policies.nth(0);
        bypass.tmpl.reset();
        bypass.sel.src = pfx("10.1.0.0/25");
        c.policies.push_back(block);
        c.policies.push_back(bypass);
        auto tx = make_engine(c);
        Frame f(plain);
        CHECK(run_classified(*tx, f, Classified{Classified::Encap, 1, kIpv4Len}) == Verdict::Drop);
        CHECK(f.pkt.drop == Drop::OutPolBlock);
        CHECK(tx->stats().drops[Drop::OutPolBlock] == 1);
        Frame g(plain);
        CHECK(run_classified(*tx, g, Classified{Classified::Encap, 2, kIpv4Len}) == Verdict::Pass);
        CHECK(g.bytes() == plain);
        CHECK(tx->stats().passed == 1);
    }
    SECTION("a report is the gateway's business: the engine passes it untouched")
    {
        auto tx = make_engine(sender(sa, "10.1.0.0/16", "10.2.0.0/16"));
        Frame f(plain);
        CHECK(run_classified(*tx, f, Classified{Classified::Report, 1, kIpv4Len}) == Verdict::Pass);
        CHECK(f.bytes() == plain);
        CHECK(tx->stats().encrypted == 0);
    }
}

namespace {

// A received frame as XskPort::rx_burst hands it out: link-layer header (Ethernet, `vlans`
// tags), the IP packet, link padding to 60 bytes, the XDP metadata in front.
struct RxFrame {
    std::vector<uint8_t> buf = std::vector<uint8_t>(kFrameSize);
    Pkt pkt;
    uint16_t l2;

    RxFrame(const std::vector<uint8_t> &ip, int vlans)
    {
        l2 = uint16_t(14 + 4 * vlans);
        uint8_t *eth = buf.data() + kFrameHeadroom;
        std::memset(eth, 0x02, 12);
        uint16_t type = (ip[0] >> 4) == 6 ? 0x86dd : 0x0800;
        for (int i = 0; i < vlans; i++) {
            put16(eth + 12 + 4 * i, 0x8100);
            put16(eth + 14 + 4 * i, uint16_t(100 + i));
        }
        put16(eth + l2 - 2, type);
        std::memcpy(eth + l2, ip.data(), ip.size());
        uint32_t len = uint32_t(std::max<size_t>(l2 + ip.size(), 60));
        pkt = Pkt{buf.data(), kFrameSize, kFrameHeadroom, len};
    }
    xesp_meta *meta() { return reinterpret_cast<xesp_meta *>(buf.data() + kFrameHeadroom) - 1; }
    void set_meta(uint8_t kind, uint32_t id, uint16_t l4, uint8_t flags = 0)
    {
        xesp_meta m{};
        m.magic = XESP_META_MAGIC;
        m.kind = kind;
        m.flags = flags;
        m.id = id;
        m.l3_off = l2;
        m.l4_off = uint16_t(l2 + l4);
        std::memcpy(meta(), &m, sizeof m);
    }
};

}  // namespace

TEST_CASE("classified_from_meta reads the XDP metadata", "[classified][meta]")
{
    auto ip = udp_packet(4, "10.1.0.1", "10.2.0.1", 100);
    Classified c;

    SECTION("Ethernet")
    {
        RxFrame f(ip, 0);
        f.set_meta(XESP_META_DECAP, 3, 28, XESP_META_F_NATT);
        REQUIRE(classified_from_meta(f.meta(), sizeof(xesp_meta), f.pkt, &c));
        CHECK(f.pkt.l3 == kFrameHeadroom + 14);
        CHECK(f.pkt.l2_len == 14);
        CHECK(f.pkt.len == ip.size());
        CHECK(c.kind == Classified::Decap);
        CHECK(c.id == 3);
        CHECK(c.l4 == 28);
        CHECK(c.natt);
        CHECK(std::memcmp(f.pkt.ip(), ip.data(), ip.size()) == 0);
    }
    SECTION("a VLAN tag")
    {
        RxFrame f(ip, 1);
        f.set_meta(XESP_META_ENCAP, 9, 20, XESP_META_F_NATT);
        REQUIRE(classified_from_meta(f.meta(), sizeof(xesp_meta), f.pkt, &c));
        CHECK(f.pkt.l3 == kFrameHeadroom + 18);
        CHECK(f.pkt.l2_len == 18);
        CHECK(f.pkt.len == ip.size());
        CHECK(c.kind == Classified::Encap);
        CHECK(c.id == 9);
        CHECK(c.l4 == 20);
        CHECK(!c.natt);
        CHECK(std::memcmp(f.pkt.ip(), ip.data(), ip.size()) == 0);
    }
    SECTION("an ICMP report for a host behind the gateway")
    {
        RxFrame f(ip, 0);
        f.set_meta(XESP_META_REPORT, 0, 20, XESP_META_F_IPV6);
        REQUIRE(classified_from_meta(f.meta(), sizeof(xesp_meta), f.pkt, &c));
        CHECK(f.pkt.l3 == kFrameHeadroom + 14);
        CHECK(c.kind == Classified::Report);
        CHECK(c.l4 == 20);
        CHECK(!c.natt);
    }
    SECTION("no valid metadata: the packet is left alone")
    {
        RxFrame f(ip, 0);
        const Pkt before = f.pkt;
        auto unchanged = [&] {
            CHECK(f.pkt.l3 == before.l3);
            CHECK(f.pkt.l2_len == 0);
            CHECK(f.pkt.len == before.len);
        };
        f.set_meta(XESP_META_DECAP, 3, 20);
        f.meta()->magic = 0xe5e4;
        CHECK(!classified_from_meta(f.meta(), sizeof(xesp_meta), f.pkt, &c));
        unchanged();
        f.set_meta(XESP_META_DECAP, 3, 20);
        CHECK(!classified_from_meta(f.meta(), sizeof(xesp_meta) - 1, f.pkt, &c));
        CHECK(!classified_from_meta(nullptr, sizeof(xesp_meta), f.pkt, &c));
        unchanged();
        f.set_meta(7, 3, 20);
        CHECK(!classified_from_meta(f.meta(), sizeof(xesp_meta), f.pkt, &c));
        f.set_meta(XESP_META_DECAP, 3, 20);
        f.meta()->l3_off = uint16_t(f.pkt.len);
        CHECK(!classified_from_meta(f.meta(), sizeof(xesp_meta), f.pkt, &c));
        f.set_meta(XESP_META_DECAP, 3, 20);
        f.meta()->l4_off = 10;
        CHECK(!classified_from_meta(f.meta(), sizeof(xesp_meta), f.pkt, &c));
        unchanged();
    }
}

TEST_CASE("from the metadata to the verdict", "[classified][meta]")
{
    const auto &gcm = all_transforms()[0];
    for (bool natt : {false, true}) {
        INFO((natt ? "natt" : "raw ESP"));
        SaConfig sa = make_sa(gcm, Mode::Tunnel, 4, natt);
        auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 10);
        Config tc = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
        PolicyConfig block = tc.policies.nth(0);
        block.tmpl.reset();
        block.action = Action::Block;
        block.sel.src = pfx("10.1.0.0/24");  // a policy of its own (another selector)
        tc.policies.push_back(block);
        auto tx = make_engine(tc);
        auto rx = make_engine(receiver(sa));

        // Encapsulation from a tagged frame, padded to the Ethernet minimum: the engine trims
        // the padding and writes in front of the IP header, over the old link-layer header,
        // which the sender must then write anew.
        RxFrame pf(plain, 1);
        pf.set_meta(XESP_META_ENCAP, 0, kIpv4Len);
        Classified c;
        REQUIRE(classified_from_meta(pf.meta(), sizeof(xesp_meta), pf.pkt, &c));
        Pkt *p = &pf.pkt;
        tx->process_classified(&p, &c, 1);
        REQUIRE(pf.pkt.verdict == Verdict::Encrypted);
        CHECK(pf.pkt.l2_len == 0);
        std::vector<uint8_t> esp(pf.pkt.ip(), pf.pkt.ip() + pf.pkt.len);

        // A dropped packet keeps its place and its link-layer header.
        RxFrame bf(plain, 0);
        bf.set_meta(XESP_META_ENCAP, 1, kIpv4Len);
        REQUIRE(classified_from_meta(bf.meta(), sizeof(xesp_meta), bf.pkt, &c));
        p = &bf.pkt;
        tx->process_classified(&p, &c, 1);
        CHECK(bf.pkt.verdict == Verdict::Drop);
        CHECK(bf.pkt.drop == Drop::OutPolBlock);
        CHECK(bf.pkt.l2_len == 14);
        CHECK(bf.pkt.l3 == kFrameHeadroom + 14);

        // Decapsulation, with the ESP header behind UDP for NAT-T.
        RxFrame ef(esp, 0);
        ef.set_meta(XESP_META_DECAP, 0, uint16_t(kIpv4Len + (natt ? kUdpLen : 0)),
                    natt ? XESP_META_F_NATT : 0);
        REQUIRE(classified_from_meta(ef.meta(), sizeof(xesp_meta), ef.pkt, &c));
        p = &ef.pkt;
        rx->process_classified(&p, &c, 1);
        REQUIRE(ef.pkt.verdict == Verdict::Decrypted);
        CHECK(ef.pkt.l2_len == 0);
        CHECK(std::vector<uint8_t>(ef.pkt.ip(), ef.pkt.ip() + ef.pkt.len) == plain);
    }
}

TEST_CASE("Classified::Plain: plaintext looked up from its headers, never taken in as ESP",
          "[classified]")
{
    const TransformCase &tc = all_transforms()[0];
    SaConfig sa = make_sa(tc, Mode::Tunnel, 4);
    // One engine sends and receives: an out policy for 10.1/16 -> 10.2/16, and the SA it
    // encrypts with also decrypts (the receiver's SA, a copy with the same keys).
    Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
    EngineOptions opt;
    opt.link_mtu = 1500;
    auto tx = make_engine_opt(c, opt);
    auto rx = make_engine(receiver(sa));

    // Plaintext the out policy protects: encrypted, byte for byte as the classified path does.
    auto plain = udp_packet(4, "10.1.0.1", "10.2.0.1", 100);
    Frame a(plain), b(plain);
    CHECK(run_classified(*tx, a, Classified{Classified::Plain}) == Verdict::Encrypted);
    auto tx2 = make_engine_opt(c, opt);
    CHECK(run_classified(*tx2, b, Classified{Classified::Encap, 0, kIpv4Len}) ==
          Verdict::Encrypted);
    CHECK(a.bytes() == b.bytes());

    // ESP for an SA the engine holds, handed over as plaintext: not decrypted. process() would
    // take it in; as Plain it is only plaintext, and no out policy covers it.
    Frame esp(a.bytes());
    Frame esp2(a.bytes());
    CHECK(run(*rx, esp2) == Verdict::Decrypted);  // the control: it is valid ESP
    CHECK(run_classified(*rx, esp, Classified{Classified::Plain}) != Verdict::Decrypted);
    CHECK(rx->stats().decrypted == 1);

    // What cannot be read is dropped: it came because a policy protects it.
    auto cut = plain;
    cut.resize(10);
    Frame bad(cut);
    CHECK(run_classified(*tx, bad, Classified{Classified::Plain}) == Verdict::Drop);
    CHECK(bad.pkt.drop == Drop::OutBadInner);
    // An IPv4 header whose total length is beyond the packet: the same.
    auto lies = plain;
    lies[2] = 0x7f;
    Frame liar(lies);
    CHECK(run_classified(*tx, liar, Classified{Classified::Plain}) == Verdict::Drop);
    CHECK(liar.pkt.drop == Drop::OutBadInner);

    // The inner MTU of a super-packet: its SA's, within the link MTU; none for what no out
    // policy protects.
    auto big = udp_packet(4, "10.1.0.1", "10.2.0.1", 1000);
    uint32_t mtu = tx->plain_inner_mtu(big.data(), uint32_t(big.size()));
    CHECK(mtu > 1400);
    CHECK(mtu < 1500);
    const Sa &s = *tx->sas().all()[0];
    CHECK(mtu == s.inner_mtu(1500));
    auto other = udp_packet(4, "10.9.0.1", "10.2.0.1", 100);
    CHECK(tx->plain_inner_mtu(other.data(), uint32_t(other.size())) == 0);
}

TEST_CASE("Classified::Plain: a fragment cut by the gateway takes its packet's ports",
          "[classified]")
{
    const TransformCase &tc = all_transforms()[0];
    SaConfig sa = make_sa(tc, Mode::Tunnel, 4);
    // The only policy that protects names a port: a fragment without ports is unsure of it.
    Config c;
    SaConfig out = sa;
    out.dir = Dir::Out;
    c.sas.push_back(out);
    PolicyConfig pol;
    pol.sel.src = pfx("10.1.0.0/16");
    pol.sel.dst = pfx("10.2.0.0/16");
    pol.sel.proto = kProtoUdp;
    pol.sel.dport_set = true;
    pol.sel.dport = 5301;
    pol.tmpl = tmpl_for(sa);
    c.policies.push_back(pol);
    auto tx = make_engine(c);

    // A non-first fragment of a datagram to port 5301: offset 64 bytes, no UDP header.
    auto later = [] {
        auto p = udp_packet(4, "10.1.0.1", "10.2.0.1", 200, 0, 1000, 5301);
        wire::put16(&p[6], 64 / 8);  // DF clear, MF clear, offset 8 units
        wire::ipv4_set_checksum(p.data());
        return p;
    };
    Frame alone(later());
    CHECK(run_classified(*tx, alone, Classified{Classified::Plain}) == Verdict::Drop);
    CHECK(alone.pkt.drop == Drop::FragmentUnclassifiable);

    // What the gateway gives the fragments it cuts: the datagram's ports; none from what is
    // a fragment already.
    auto datagram = udp_packet(4, "10.1.0.1", "10.2.0.1", 200, 0, 1000, 5301);
    Classified cut = plain_fragments(datagram.data(), uint32_t(datagram.size()));
    CHECK(cut.kind == Classified::Plain);
    CHECK(cut.whole_ports);
    CHECK(cut.sport == 1000);
    CHECK(cut.dport == 5301);
    auto frag = later();
    CHECK(!plain_fragments(frag.data(), uint32_t(frag.size())).whole_ports);
    Frame taken(later());
    CHECK(run_classified(*tx, taken, cut) == Verdict::Encrypted);
    // Its packet's ports, not any: under another port it goes where that one would.
    cut.dport = 5302;
    Frame other(later());
    CHECK(run_classified(*tx, other, cut) == Verdict::Pass);
    // A whole packet is looked up with its own ports, whatever it is given.
    Frame whole(udp_packet(4, "10.1.0.1", "10.2.0.1", 200, 0, 1000, 5302));
    cut.dport = 5301;
    CHECK(run_classified(*tx, whole, cut) == Verdict::Pass);
}
