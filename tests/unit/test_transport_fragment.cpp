// Transport mode protects whole datagrams only (RFC 4303 3.3.4): an IP fragment that an
// outbound policy sends into a transport-mode SA is dropped as out-transport-fragment, never
// encrypted as if it were a datagram; tunnel mode carries the same fragments. Through both of
// the engine's entries: process() (it classifies) and process_classified() (the XDP
// classifier did). The gateway does not split plaintext for a transport SA either.
#include <catch2/catch.hpp>

#include "tests/unit/esp_fixture.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

using Bytes = std::vector<uint8_t>;

// An IPv4 UDP packet with the given flags/fragment offset field.
Bytes v4_fragment(const char *src, const char *dst, uint16_t frag)
{
    Bytes p = udp_packet(4, src, dst, 64);
    put16(&p[6], frag);
    ipv4_set_checksum(p.data());
    return p;
}

// An IPv6 UDP packet with a Fragment header (RFC 8200 4.5) behind the fixed header.
Bytes v6_fragment(const char *src, const char *dst, uint16_t offset_flags)
{
    Bytes p = udp_packet(6, src, dst, 64);
    Bytes frag = {kProtoUdp, 0, 0, 0, 0xfe, 0xed, 0xf0, 0x0d};
    put16(&frag[2], offset_flags);
    p.insert(p.begin() + kIpv6Len, frag.begin(), frag.end());
    p[6] = kProtoIpv6Frag;
    put16(&p[4], uint16_t(p.size() - kIpv6Len));
    return p;
}

struct Case {
    const char *what;
    int family;
    uint16_t frag;  // IPv4: flags/offset field; IPv6: Fragment header offset/M field
};

const Case kCases[] = {
    {"IPv4 first fragment (MF)", 4, 0x2000},
    {"IPv4 middle fragment", 4, 0x2000 | 8},
    {"IPv4 last fragment", 4, 8},
    {"IPv6 first fragment (M)", 6, 0x0001},
    {"IPv6 last fragment", 6, 8 << 3},
    {"IPv6 atomic fragment", 6, 0},
};

}  // namespace

TEST_CASE("a fragment is never encrypted in transport mode", "[transport][fragment]")
{
    const auto &gcm = all_transforms()[0];
    for (const Case &c : kCases) {
        for (Mode mode : {Mode::Transport, Mode::Tunnel}) {
            for (bool classified : {false, true}) {
                bool tunnel = mode == Mode::Tunnel;
                INFO(c.what << (tunnel ? ", tunnel" : ", transport")
                            << (classified ? ", process_classified" : ", process"));
                bool v4 = c.family == 4;
                SaConfig sa = make_sa(gcm, mode, c.family);
                const char *src =
                    tunnel ? (v4 ? "10.1.0.1" : "fd01::1") : (v4 ? "192.0.2.1" : "2001:db8::1");
                const char *dst =
                    tunnel ? (v4 ? "10.2.0.1" : "fd02::1") : (v4 ? "192.0.2.2" : "2001:db8::2");
                auto tx =
                    make_engine(sender(sa, v4 ? "0.0.0.0/0" : "::/0", v4 ? "0.0.0.0/0" : "::/0"));
                Bytes plain = v4 ? v4_fragment(src, dst, c.frag) : v6_fragment(src, dst, c.frag);
                Frame f(plain);
                Pkt *p = &f.pkt;
                if (classified) {
                    const Classified cls{Classified::Encap, 0,
                                         uint16_t(v4 ? kIpv4Len : kIpv6Len + 8)};
                    tx->process_classified(&p, &cls, 1);
                } else {
                    tx->process(&p, 1);
                }
                if (tunnel) {
                    CHECK(f.pkt.verdict == Verdict::Encrypted);
                    CHECK(tx->stats().drops[Drop::OutTransportFragment] == 0);
                } else {
                    CHECK(f.pkt.verdict == Verdict::Drop);
                    CHECK(f.pkt.drop == Drop::OutTransportFragment);
                    CHECK(tx->stats().drops[Drop::OutTransportFragment] == 1);
                    CHECK(tx->stats().encrypted == 0);
                    CHECK(f.bytes() == plain);  // nothing was written
                }
            }
        }
    }
}

TEST_CASE("a whole datagram still goes through transport mode", "[transport][fragment]")
{
    const auto &gcm = all_transforms()[0];
    for (int family : {4, 6}) {
        bool v4 = family == 4;
        SaConfig sa = make_sa(gcm, Mode::Transport, family);
        auto tx = make_engine(sender(sa, v4 ? "0.0.0.0/0" : "::/0", v4 ? "0.0.0.0/0" : "::/0"));
        Frame f(udp_packet(family, v4 ? "192.0.2.1" : "2001:db8::1",
                           v4 ? "192.0.2.2" : "2001:db8::2", 64));
        CHECK(run(*tx, f) == Verdict::Encrypted);
    }
}

TEST_CASE("plaintext for a transport NAT-T SA is not split before encryption",
          "[transport][fragment]")
{
    const auto &gcm = all_transforms()[0];
    EngineOptions opt;
    opt.link_mtu = 1400;
    for (Mode mode : {Mode::Transport, Mode::Tunnel}) {
        bool tunnel = mode == Mode::Tunnel;
        INFO((tunnel ? "tunnel" : "transport"));
        SaConfig sa = make_sa(gcm, mode, 4, true);
        auto e = Engine::create(sender(sa, "0.0.0.0/0", "0.0.0.0/0"), Backend::Auto, opt);
        REQUIRE(e);
        Bytes big = udp_packet(4, tunnel ? "10.1.0.1" : "192.0.2.1",
                               tunnel ? "10.2.0.1" : "192.0.2.2", 1400);
        big[6] = 0;  // DF clear: it may be fragmented
        ipv4_set_checksum(big.data());
        Frame f(big);
        const Classified cls{Classified::Encap, 0, kIpv4Len};
        uint32_t mtu = (*e)->natt_inner_mtu(cls, f.pkt);
        if (tunnel)
            CHECK((mtu > 0 && mtu < 1400));
        else
            CHECK(mtu == 0);
    }
}
