// Traffic spread over many SAs: a burst whose packets belong to different SAs, encrypted and
// decrypted in one call, must give what the same packets give one at a time.
#include <catch2/catch.hpp>

#include <cstring>
#include <optional>
#include <set>

#include "tests/unit/esp_fixture.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

constexpr size_t kTunnels = 40;

std::string inner(int side, size_t tunnel)
{
    return "10." + std::to_string(side) + "." + std::to_string(tunnel) + ".0/24";
}

std::string host(int side, size_t tunnel)
{
    return "10." + std::to_string(side) + "." + std::to_string(tunnel) + ".7";
}

// Tunnel t, one way: transforms in turn, ESN on every third.
SaConfig tunnel_sa(size_t t, bool from_a)
{
    const auto &xfs = all_transforms();
    SaConfig c = make_sa(xfs[t % xfs.size()], Mode::Tunnel, 4, false, t % 3 == 0);
    c.xf = make_transform(xfs[t % xfs.size()], uint8_t(t + (from_a ? 1 : 101)));
    c.src = addr(from_a ? "192.0.2.1" : "192.0.2.2");
    c.dst = addr(from_a ? "192.0.2.2" : "192.0.2.1");
    c.spi = uint32_t((from_a ? 0x1000 : 0x2000) + t);
    c.reqid = uint32_t((from_a ? 1000 : 2000) + t);
    return c;
}

// Gateway A (side 1 behind it) or B (side 2), every tunnel both ways.
Config gateway(bool a)
{
    Config c;
    for (size_t t = 0; t < kTunnels; t++) {
        SaConfig out = tunnel_sa(t, a), in = tunnel_sa(t, !a);
        out.dir = Dir::Out;
        in.dir = Dir::In;
        c.sas.push_back(out);
        c.sas.push_back(in);
        PolicyConfig po;
        po.sel.src = pfx(inner(a ? 1 : 2, t).c_str());
        po.sel.dst = pfx(inner(a ? 2 : 1, t).c_str());
        po.dir = Dir::Out;
        po.tmpl = tmpl_for(out);
        c.policies.push_back(po);
        PolicyConfig pf;
        pf.sel.src = po.sel.dst;
        pf.sel.dst = po.sel.src;
        pf.dir = Dir::Fwd;
        pf.tmpl = tmpl_for(in);
        c.policies.push_back(pf);
    }
    return c;
}

// Which tunnel each packet takes: runs of one tunnel (1 to 4 packets) between single packets
// of others, so that a burst holds groups of every size.
std::vector<size_t> spread(size_t n)
{
    std::vector<size_t> owner;
    for (size_t i = 0; owner.size() < n; i++) {
        size_t t = (i * 7) % kTunnels;
        for (size_t k = 0; k < 1 + i % 4 && owner.size() < n; k++)
            owner.push_back(t);
    }
    return owner;
}

std::vector<Pkt *> pointers(std::vector<Frame> &frames)
{
    std::vector<Pkt *> p;
    for (Frame &f : frames)
        p.push_back(&f.pkt);
    return p;
}

}  // namespace

TEST_CASE("a burst spread over many SAs gives the packets of one SA at a time", "[spread]")
{
    const size_t n = 300;
    const std::vector<size_t> owner = spread(n);
    // B's plaintext to A, encrypted by B one packet at a time: what A decrypts.
    auto b = make_engine(gateway(false));
    std::vector<std::vector<uint8_t>> to_a_plain, from_a_plain;
    std::vector<Frame> from_b;
    for (size_t i = 0; i < n; i++) {
        size_t t = owner[i];
        to_a_plain.push_back(udp_packet(4, host(2, t).c_str(), host(1, t).c_str(), 40 + i % 200));
        from_b.emplace_back(to_a_plain.back());
        REQUIRE(run(*b, from_b.back()) == Verdict::Encrypted);
        from_a_plain.push_back(udp_packet(4, host(1, t).c_str(), host(2, t).c_str(), 30 + i % 300));
    }
    // A's input: plaintext for B and ESP from B, mixed, packet i of each at 2i and 2i + 1.
    std::vector<Frame> burst, single;
    for (size_t i = 0; i < n; i++) {
        burst.emplace_back(from_a_plain[i]);
        burst.push_back(from_b[i]);
        burst.back().pkt.frame = burst.back().buf.data();
    }
    single = burst;
    for (Frame &f : single)
        f.pkt.frame = f.buf.data();
    for (Frame &f : burst)
        f.pkt.frame = f.buf.data();

    auto a_burst = make_engine(gateway(true)), a_single = make_engine(gateway(true));
    auto pb = pointers(burst);
    a_burst->process(pb.data(), pb.size());  // in bursts of kMaxBurst
    for (Frame &f : single)
        run(*a_single, f);

    std::vector<uint32_t> seq(kTunnels, 0);
    for (size_t i = 0; i < 2 * n; i++) {
        const size_t t = owner[i / 2];
        const bool out = i % 2 == 0;
        const SaConfig sa = tunnel_sa(t, true);
        INFO("packet " << i << " tunnel " << t << " "
                       << all_transforms()[t % all_transforms().size()].name);
        REQUIRE(burst[i].pkt.verdict == single[i].pkt.verdict);
        if (!out) {
            CHECK(burst[i].pkt.verdict == Verdict::Decrypted);
            CHECK(burst[i].bytes() == to_a_plain[i / 2]);
            continue;
        }
        REQUIRE(burst[i].pkt.verdict == Verdict::Encrypted);
        const std::vector<uint8_t> got = burst[i].bytes();
        // SPI and sequence number: the tunnel's own, in the order of its packets.
        const uint8_t *esp = got.data() + kIpv4Len;
        CHECK(get32(esp) == sa.spi);
        CHECK(get32(esp + 4) == ++seq[t]);
        if (sa.xf.is_aead())  // the IV is the sequence number: the same bytes
            CHECK(got == single[i].bytes());
        // B decrypts it to what A was given.
        Frame back(got);
        REQUIRE(run(*b, back) == Verdict::Decrypted);
        CHECK(back.bytes() == from_a_plain[i / 2]);
    }
    for (size_t id = 0; id < a_burst->sas().all().size(); id++) {
        CHECK(a_burst->sas().all()[id]->counters().packets ==
              a_single->sas().all()[id]->counters().packets);
        CHECK(a_burst->sas().all()[id]->oseq() == a_single->sas().all()[id]->oseq());
    }
    CHECK(a_burst->stats().encrypted == n);
    CHECK(a_burst->stats().decrypted == n);
    CHECK(a_burst->stats().dropped == 0);
}

TEST_CASE("packets that no longer fit in a shared burst are dropped, never passed", "[spread]")
{
    auto a = make_engine(gateway(true));
    Sa &out = *a->sas().all()[0];
    std::vector<Frame> frames;
    for (int i = 0; i < 3; i++)
        frames.emplace_back(udp_packet(4, host(1, 0).c_str(), host(2, 0).c_str(), 100));
    auto p = pointers(frames);
    EspBurst b;
    b.n = kMaxBurst - 1;  // another SA's packets took the rest
    esp_encap_prepare(out, p.data(), p.size(), b);
    CHECK(b.n == kMaxBurst);
    CHECK(frames[0].pkt.verdict == Verdict::Pass);  // prepared, waits for the cipher
    for (int i = 1; i < 3; i++) {
        CHECK(frames[i].pkt.verdict == Verdict::Drop);
        CHECK(frames[i].pkt.drop == Drop::OutCryptoError);
    }
}

TEST_CASE("AES-CBC IVs drawn from the pool never repeat, across SAs and refills", "[spread]")
{
    auto a = make_engine(gateway(true));
    std::set<std::vector<uint8_t>> seen;
    size_t cbc = 0;
    // 16-byte IVs: enough packets to empty a 4 KB pool several times over.
    for (size_t i = 0; i < 3000; i++) {
        const size_t t = i % kTunnels;
        const SaConfig sa = tunnel_sa(t, true);
        if (sa.xf.enc != EncAlg::AesCbc)
            continue;
        Frame f(udp_packet(4, host(1, t).c_str(), host(2, t).c_str(), 64));
        REQUIRE(run(*a, f) == Verdict::Encrypted);
        const uint8_t *iv = f.pkt.ip() + kIpv4Len + kEspHdrLen;
        CHECK(seen.insert(std::vector<uint8_t>(iv, iv + 16)).second);
        cbc++;
    }
    CHECK(cbc * 16 > 3 * 4096);
}

TEST_CASE("a burst mixing every outcome of classification gives what one packet at a time gives",
          "[spread]")
{
    // Beside the tunnels: a block policy, a bypass policy, a policy whose template has no SA,
    // and a tunnel whose template names an SA of the other mode. On the way in, B sends
    // through tunnels 5, 6 and 7 what A's inbound policies refuse: a flow none covers, a
    // flow an in policy blocks, and a flow whose fwd policy names tunnel 8.
    Config c = gateway(true);
    auto out_policy = [&](size_t t) {
        PolicyConfig p;
        p.sel.src = pfx(inner(1, t).c_str());
        p.sel.dst = pfx(inner(2, t).c_str());
        p.dir = Dir::Out;
        return p;
    };
    PolicyConfig block = out_policy(200), bypass = out_policy(201), missing = out_policy(202),
                 wrong_mode = out_policy(203);
    block.action = Action::Block;
    missing.tmpl = tmpl_for(tunnel_sa(0, true));
    missing.tmpl->reqid = 99999;
    wrong_mode.tmpl = tmpl_for(tunnel_sa(1, true));
    wrong_mode.tmpl->mode = Mode::Transport;
    for (const PolicyConfig &p : {block, bypass, missing, wrong_mode})
        c.policies.push_back(p);
    PolicyConfig in_block, in_other;
    in_block.sel.src = pfx(inner(2, 211).c_str());
    in_block.sel.dst = pfx(inner(1, 211).c_str());
    in_block.dir = Dir::In;
    in_block.action = Action::Block;
    in_other.sel.src = pfx(inner(2, 212).c_str());
    in_other.sel.dst = pfx(inner(1, 212).c_str());
    in_other.dir = Dir::Fwd;
    in_other.tmpl = tmpl_for(tunnel_sa(8, false));
    c.policies.push_back(in_block);
    c.policies.push_back(in_other);
    Config cb = gateway(false);
    for (size_t k = 0; k < 3; k++) {
        PolicyConfig p;
        p.sel.src = pfx(inner(2, 210 + k).c_str());
        p.sel.dst = pfx(inner(1, 210 + k).c_str());
        p.dir = Dir::Out;
        p.tmpl = tmpl_for(tunnel_sa(5 + k, false));
        cb.policies.push_back(p);
    }

    std::vector<std::vector<uint8_t>> packets;
    std::vector<bool> aead;  // the IV is the sequence number: burst and single give one text
    std::vector<std::optional<Drop>> refused;  // case 8: the drop each must get
    auto b = make_engine(cb);
    for (size_t i = 0; i < 225; i++) {
        size_t t = (i * 11) % kTunnels;
        aead.push_back(tunnel_sa(t, true).xf.is_aead());
        refused.push_back(std::nullopt);
        switch (i % 9) {
        case 0:  // protected by tunnel t
            packets.push_back(udp_packet(4, host(1, t).c_str(), host(2, t).c_str(), 50 + i));
            break;
        case 1: {  // ESP from B for tunnel t
            Frame f(udp_packet(4, host(2, t).c_str(), host(1, t).c_str(), 60 + i));
            REQUIRE(run(*b, f) == Verdict::Encrypted);
            packets.push_back(f.bytes());
            break;
        }
        case 2:  // block, bypass, no SA, the wrong mode
            packets.push_back(udp_packet(4, host(1, 200 + i / 9 % 4).c_str(),
                                         host(2, 200 + i / 9 % 4).c_str(), 40));
            break;
        case 3:  // plaintext a fwd policy says must come protected
            packets.push_back(udp_packet(4, host(2, t).c_str(), host(1, t).c_str(), 40));
            break;
        case 4:  // no policy at all
            packets.push_back(udp_packet(4, "10.9.0.1", "10.9.0.2", 40));
            break;
        case 5: {  // ESP for an SPI nobody has
            Frame f(udp_packet(4, host(2, t).c_str(), host(1, t).c_str(), 60));
            REQUIRE(run(*b, f) == Verdict::Encrypted);
            std::vector<uint8_t> esp = f.bytes();
            put32(esp.data() + kIpv4Len, 0xdead0000 + uint32_t(i));
            packets.push_back(esp);
            break;
        }
        case 6:  // IPv6 plaintext: no policy of its family
            packets.push_back(udp_packet(6, "fd00::1", "fd00::2", 40));
            break;
        case 8: {  // ESP from B that A decrypts and its inbound policies refuse
            size_t k = i / 9 % 3;
            Frame f(udp_packet(4, host(2, 210 + k).c_str(), host(1, 210 + k).c_str(), 30 + i));
            REQUIRE(run(*b, f) == Verdict::Encrypted);
            packets.push_back(f.bytes());
            refused.back() = k == 0   ? Drop::InNoPolicy
                             : k == 1 ? Drop::InPolBlock
                                      : Drop::InTmplMismatch;
            break;
        }
        default:  // another protected packet, of the tunnel before
            t = ((i - 7) * 11) % kTunnels;
            aead.back() = tunnel_sa(t, true).xf.is_aead();
            packets.push_back(udp_packet(4, host(1, t).c_str(), host(2, t).c_str(), 70 + i));
        }
    }
    std::vector<Frame> burst, single;
    for (const auto &p : packets) {
        burst.emplace_back(p);
        single.emplace_back(p);
    }
    auto a_burst = make_engine(c), a_single = make_engine(c);
    auto pb = pointers(burst);
    a_burst->process(pb.data(), pb.size());
    for (Frame &f : single)
        run(*a_single, f);
    std::set<Verdict> verdicts;
    std::set<Drop> drops;
    for (size_t i = 0; i < packets.size(); i++) {
        INFO("packet " << i);
        REQUIRE(burst[i].pkt.verdict == single[i].pkt.verdict);
        verdicts.insert(burst[i].pkt.verdict);
        if (burst[i].pkt.verdict == Verdict::Drop) {
            REQUIRE(burst[i].pkt.drop == single[i].pkt.drop);
            drops.insert(burst[i].pkt.drop);
        }
        if (refused[i]) {
            CHECK(burst[i].pkt.verdict == Verdict::Drop);
            CHECK(burst[i].pkt.drop == *refused[i]);
        }
        if (burst[i].pkt.verdict != Verdict::Encrypted || aead[i])
            CHECK(burst[i].bytes() == single[i].bytes());
    }
    // Every outcome was there.
    CHECK(verdicts ==
          std::set<Verdict>{Verdict::Encrypted, Verdict::Decrypted, Verdict::Pass, Verdict::Drop});
    CHECK(drops == std::set<Drop>{Drop::OutPolBlock, Drop::OutNoStates, Drop::InUnprotected,
                                  Drop::InNoPolicy, Drop::InPolBlock, Drop::InTmplMismatch});
    CHECK(a_burst->stats().esp_unknown_spi == a_single->stats().esp_unknown_spi);
    CHECK(a_burst->stats().esp_unknown_spi > 0);
}
