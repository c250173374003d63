// ICMP reports of a smaller path MTU for our ESP packets (userspace/kernel/pmtu.h): what is read
// from them, what is refused, and which quoted sequence numbers are believed. The integration test
// (tests/topo/test_gateway.sh) sends scapy's versions of these messages to a running gateway.
#include <catch2/catch.hpp>

#include <vector>

#include "esp_fixture.h"
#include "userspace/kernel/pmtu.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

void put_addr(std::vector<uint8_t> &v, size_t at, const char *a)
{
    IpAddr ip = addr(a);
    std::copy(ip.b.begin(), ip.b.begin() + ip.size(), v.begin() + at);
}

// What a router sends back for our IPv4 ESP packet of quoted_len bytes: its IP header, ICMP
// type/code/MTU, then our header and the first `l4` bytes behind it (ESP, or UDP + ESP).
std::vector<uint8_t> report4(uint8_t type, uint8_t code, uint16_t mtu, uint16_t quoted_len,
                             uint8_t proto, const std::vector<uint8_t> &l4)
{
    std::vector<uint8_t> v(20 + 8 + 20);
    v[0] = 0x45;
    v[9] = kProtoIcmp;
    put_addr(v, 12, "198.51.100.7");
    put_addr(v, 16, "192.0.2.1");
    v[20] = type;
    v[21] = code;
    put16(&v[26], mtu);
    uint8_t *q = &v[28];
    q[0] = 0x45;
    put16(q + 2, quoted_len);
    put16(q + 6, kIpv4Df);
    q[8] = 64;
    q[9] = proto;
    put_addr(v, 28 + 12, "192.0.2.1");
    put_addr(v, 28 + 16, "192.0.2.2");
    v.insert(v.end(), l4.begin(), l4.end());
    put16(&v[2], uint16_t(v.size()));
    return v;
}

std::vector<uint8_t> esp_hdr(uint32_t spi, uint32_t seq)
{
    std::vector<uint8_t> e(8);
    put32(&e[0], spi);
    put32(&e[4], seq);
    return e;
}

std::vector<uint8_t> udp_esp(uint32_t spi, uint32_t seq)
{
    std::vector<uint8_t> u(8);
    put16(&u[0], 4500);
    put16(&u[2], 4500);
    auto e = esp_hdr(spi, seq);
    u.insert(u.end(), e.begin(), e.end());
    return u;
}

// ICMPv6 packet too big as an IPv6 raw socket delivers it (no IP header).
std::vector<uint8_t> report6(uint8_t type, uint32_t mtu, uint16_t quoted_plen, uint8_t nh,
                             const std::vector<uint8_t> &l4)
{
    std::vector<uint8_t> v(8 + 40);
    v[0] = type;
    put32(&v[4], mtu);
    uint8_t *q = &v[8];
    q[0] = 0x60;
    put16(q + 4, quoted_plen);
    q[6] = nh;
    q[7] = 64;
    put_addr(v, 8 + 8, "2001:db8::1");
    put_addr(v, 8 + 24, "2001:db8::2");
    v.insert(v.end(), l4.begin(), l4.end());
    return v;
}

}  // namespace

TEST_CASE("IPv4 fragmentation needed for our ESP", "[pmtu]")
{
    PmtuReport r;
    SECTION("ESP: addresses, SPI, sequence number, MTU")
    {
        auto v = report4(3, 4, 1300, 1500, kProtoEsp, esp_hdr(0x1001, 77));
        REQUIRE(parse_pmtu_report4(v.data(), v.size(), &r));
        CHECK(r.router == addr("198.51.100.7"));
        CHECK(r.src == addr("192.0.2.1"));
        CHECK(r.dst == addr("192.0.2.2"));
        CHECK(r.spi == 0x1001);
        CHECK(r.seq == 77);
        CHECK(r.mtu == 1300);
        CHECK_FALSE(r.natt);
    }
    SECTION("ESP in UDP (NAT-T)")
    {
        auto v = report4(3, 4, 1400, 1500, kProtoUdp, udp_esp(0x2001, 5));
        REQUIRE(parse_pmtu_report4(v.data(), v.size(), &r));
        CHECK(r.natt);
        CHECK(r.spi == 0x2001);
        CHECK(r.seq == 5);
    }
    SECTION("an old router's report without an MTU: the plateau below the packet (RFC 1191)")
    {
        auto v = report4(3, 4, 0, 1500, kProtoEsp, esp_hdr(0x1001, 1));
        REQUIRE(parse_pmtu_report4(v.data(), v.size(), &r));
        CHECK(r.mtu == 1492);
    }
    SECTION("an MTU below 576 is read as 576")
    {
        auto v = report4(3, 4, 68, 1500, kProtoEsp, esp_hdr(0x1001, 1));
        REQUIRE(parse_pmtu_report4(v.data(), v.size(), &r));
        CHECK(r.mtu == kPmtuFloor4);
    }
    SECTION("refused: the packet fitted, another message, not ours to read")
    {
        auto fits = report4(3, 4, 1500, 1500, kProtoEsp, esp_hdr(0x1001, 1));
        CHECK_FALSE(parse_pmtu_report4(fits.data(), fits.size(), &r));
        auto port_unreach = report4(3, 3, 1300, 1500, kProtoEsp, esp_hdr(0x1001, 1));
        CHECK_FALSE(parse_pmtu_report4(port_unreach.data(), port_unreach.size(), &r));
        auto tcp = report4(3, 4, 1300, 1500, kProtoTcp, esp_hdr(0x1001, 1));
        CHECK_FALSE(parse_pmtu_report4(tcp.data(), tcp.size(), &r));
        auto ike = report4(3, 4, 1300, 1500, kProtoUdp, udp_esp(0, 1));  // non-ESP marker
        CHECK_FALSE(parse_pmtu_report4(ike.data(), ike.size(), &r));
        auto later = report4(3, 4, 1300, 1500, kProtoEsp, esp_hdr(0x1001, 1));
        put16(&later[28 + 6], 185);  // a later fragment
        CHECK_FALSE(parse_pmtu_report4(later.data(), later.size(), &r));
    }
    SECTION("refused: quotes too short to hold the SPI and sequence number")
    {
        auto esp = report4(3, 4, 1300, 1500, kProtoEsp, {0, 0, 0x10, 0x01});
        CHECK_FALSE(parse_pmtu_report4(esp.data(), esp.size(), &r));
        auto udp = report4(3, 4, 1300, 1500, kProtoUdp, {0x11, 0x94, 0x11, 0x94, 0, 16, 0, 0});
        CHECK_FALSE(parse_pmtu_report4(udp.data(), udp.size(), &r));
        auto full = report4(3, 4, 1300, 1500, kProtoEsp, esp_hdr(0x1001, 1));
        for (size_t n = 0; n < full.size(); n++)
            CHECK_FALSE(parse_pmtu_report4(full.data(), n, &r));
    }
}

TEST_CASE("ICMPv6 packet too big for our ESP", "[pmtu]")
{
    PmtuReport r;
    IpAddr router = addr("2001:db8::fe");
    auto v = report6(2, 1400, 1460, kProtoEsp, esp_hdr(0x1002, 9));
    REQUIRE(parse_pmtu_report6(v.data(), v.size(), router, &r));
    CHECK(r.router == router);
    CHECK(r.src == addr("2001:db8::1"));
    CHECK(r.dst == addr("2001:db8::2"));
    CHECK(r.spi == 0x1002);
    CHECK(r.seq == 9);
    CHECK(r.mtu == 1400);

    auto small = report6(2, 1000, 1460, kProtoEsp, esp_hdr(0x1002, 9));
    REQUIRE(parse_pmtu_report6(small.data(), small.size(), router, &r));
    CHECK(r.mtu == kPmtuFloor6);

    auto udp = report6(2, 1400, 1460, kProtoUdp, udp_esp(0x1002, 9));
    REQUIRE(parse_pmtu_report6(udp.data(), udp.size(), router, &r));
    CHECK(r.natt);

    auto fits = report6(2, 1500, 1460, kProtoEsp, esp_hdr(0x1002, 9));
    CHECK_FALSE(parse_pmtu_report6(fits.data(), fits.size(), router, &r));
    auto unreach = report6(1, 1400, 1460, kProtoEsp, esp_hdr(0x1002, 9));
    CHECK_FALSE(parse_pmtu_report6(unreach.data(), unreach.size(), router, &r));
    auto tcp = report6(2, 1400, 1460, kProtoTcp, esp_hdr(0x1002, 9));
    CHECK_FALSE(parse_pmtu_report6(tcp.data(), tcp.size(), router, &r));
    for (size_t n = 0; n < v.size(); n++)
        CHECK_FALSE(parse_pmtu_report6(v.data(), n, router, &r));
}

TEST_CASE("a report must quote a sequence number the SA sent lately", "[pmtu]")
{
    CHECK(pmtu_seq_recent(100, 100));
    CHECK(pmtu_seq_recent(1, 100));
    CHECK_FALSE(pmtu_seq_recent(101, 100));       // not sent yet
    CHECK_FALSE(pmtu_seq_recent(0, 100));         // never sent without ESN
    CHECK_FALSE(pmtu_seq_recent(1, 0));           // the SA sent nothing
    const uint64_t sent = 5ull * kPmtuSeqWindow;  // the window's edge, both sides
    CHECK(pmtu_seq_recent(uint32_t(sent - kPmtuSeqWindow + 1), sent));
    CHECK_FALSE(pmtu_seq_recent(uint32_t(sent - kPmtuSeqWindow), sent));
    // ESN: only the low 32 bits are quoted; numbers across the 2^32 boundary still count.
    CHECK(pmtu_seq_recent(0xfffffff0u, (1ull << 32) + 5));
    CHECK(pmtu_seq_recent(2, (1ull << 32) + 5));
    CHECK(pmtu_seq_recent(0, (1ull << 32) + 5));
}
