// ICMP time exceeded as the gateway sends it for a packet whose TTL / hop limit ran out, what it
// must never answer, and the rate limit on every ICMP error it sends.
#include <catch2/catch.hpp>

#include "esp_fixture.h"
#include "userspace/esp/icmp.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

// RFC 1071 one's complement sum over 16-bit words, written out here rather than taken from
// the code under test.
uint16_t rfc1071(const uint8_t *d, size_t n, uint32_t sum = 0)
{
    for (size_t i = 0; i + 1 < n; i += 2)
        sum += uint32_t(d[i]) << 8 | d[i + 1];
    if (n & 1)
        sum += uint32_t(d[n - 1]) << 8;
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return uint16_t(sum);
}

}  // namespace

TEST_CASE("time exceeded for IPv4 and IPv6, checksums by RFC 1071", "[icmp]")
{
    SECTION("IPv4: type 11 code 0 from the gateway, 576 bytes at most")
    {
        auto orig = udp_packet(4, "10.1.0.2", "10.2.0.2", 1000);
        Frame f(orig);
        REQUIRE(icmp_time_exceeded(f.pkt, addr("10.1.0.1")));
        CHECK(f.pkt.verdict == Verdict::TimeExceeded);
        auto out = f.bytes();
        REQUIRE(out.size() == 576);
        CHECK(get16(&out[2]) == 576);
        CHECK(out[9] == kProtoIcmp);
        CHECK(IpAddr::v4(&out[12]) == addr("10.1.0.1"));
        CHECK(IpAddr::v4(&out[16]) == addr("10.1.0.2"));
        CHECK(rfc1071(out.data(), 20) == 0xffff);
        CHECK(out[20] == 11);
        CHECK(out[21] == 0);
        CHECK(get32(&out[24]) == 0);  // unused
        CHECK(rfc1071(&out[20], out.size() - 20) == 0xffff);
        CHECK(std::equal(out.begin() + 28, out.end(), orig.begin()));
    }
    SECTION("IPv6: type 3 code 0, 1280 bytes at most, pseudo-header in the checksum")
    {
        auto orig = udp_packet(6, "fd01::2", "fd02::2", 1400);
        Frame f(orig);
        REQUIRE(icmp_time_exceeded(f.pkt, addr("fd01::1")));
        auto out = f.bytes();
        REQUIRE(out.size() == 1280);
        CHECK(out[6] == kProtoIcmpv6);
        CHECK(IpAddr::v6(&out[8]) == addr("fd01::1"));
        CHECK(IpAddr::v6(&out[24]) == addr("fd01::2"));
        CHECK(out[40] == 3);
        CHECK(out[41] == 0);
        CHECK(get32(&out[44]) == 0);
        uint8_t pseudo[40] = {};
        std::memcpy(pseudo, &out[8], 32);
        put32(pseudo + 32, uint32_t(out.size() - 40));
        pseudo[39] = kProtoIcmpv6;
        uint32_t partial = rfc1071(pseudo, sizeof pseudo);
        CHECK(rfc1071(&out[40], out.size() - 40, partial) == 0xffff);
        CHECK(std::equal(out.begin() + 48, out.end(), orig.begin()));
    }
    SECTION("a short packet is quoted whole")
    {
        auto orig = udp_packet(4, "10.1.0.2", "10.2.0.2", 4);
        Frame f(orig);
        REQUIRE(icmp_time_exceeded(f.pkt, addr("10.1.0.1")));
        CHECK(f.pkt.len == 28 + orig.size());
    }
}

TEST_CASE("time exceeded is never sent where the rules forbid it", "[icmp]")
{
    auto refused = [](std::vector<uint8_t> p, const char *from) {
        Frame f(p);
        Pkt before = f.pkt;
        bool answered = icmp_time_exceeded(f.pkt, addr(from));
        return !answered && f.pkt.l3 == before.l3 && f.pkt.len == before.len && f.bytes() == p;
    };
    SECTION("an ICMP error")
    {
        auto p = udp_packet(4, "10.1.0.2", "10.2.0.2", 40);
        Frame f(p);
        REQUIRE(icmp_time_exceeded(f.pkt, addr("10.1.0.1")));
        CHECK(refused(f.bytes(), "10.1.0.1"));
    }
    SECTION("a fragment other than the first")
    {
        auto p = udp_packet(4, "10.1.0.2", "10.2.0.2", 40);
        put16(&p[6], 0x2000 | 185);
        ipv4_set_checksum(p.data());
        CHECK(refused(p, "10.1.0.1"));
    }
    SECTION("multicast and broadcast destinations, sources that name no host")
    {
        CHECK(refused(udp_packet(4, "10.1.0.2", "224.0.0.5", 40), "10.1.0.1"));
        CHECK(refused(udp_packet(4, "10.1.0.2", "255.255.255.255", 40), "10.1.0.1"));
        CHECK(refused(udp_packet(4, "0.0.0.0", "10.2.0.2", 40), "10.1.0.1"));
        CHECK(refused(udp_packet(4, "127.0.0.1", "10.2.0.2", 40), "10.1.0.1"));
        CHECK(refused(udp_packet(6, "fd01::2", "ff02::1", 40), "fd01::1"));
        CHECK(refused(udp_packet(6, "::", "fd02::2", 40), "fd01::1"));
    }
    SECTION("an ICMPv6 error behind a destination options header")
    {
        auto p = udp_packet(6, "fd01::2", "fd02::2", 40);
        p[6] = 60;  // destination options: 8 bytes, a PadN option, then ICMPv6
        const uint8_t opts[8] = {kProtoIcmpv6, 0, 1, 4, 0, 0, 0, 0};
        p.insert(p.begin() + 40, opts, opts + 8);
        put16(&p[4], uint16_t(p.size() - 40));
        p[48] = 1;  // destination unreachable
        p[49] = 4;
        CHECK(refused(p, "fd01::1"));
        Frame f(p);
        CHECK_FALSE(icmp_too_big(f.pkt, addr("fd01::1"), 1280));
        p[48] = 128;  // an echo request is answered
        CHECK_FALSE(refused(p, "fd01::1"));
    }
    SECTION("an ICMPv6 error behind AH, or in a first fragment; a later fragment is answered")
    {
        auto base = udp_packet(6, "fd01::2", "fd02::2", 40);
        auto with = [&](uint8_t first, std::vector<uint8_t> hdr, uint8_t type) {
            auto p = base;
            p[6] = first;
            p.insert(p.begin() + 40, hdr.begin(), hdr.end());
            put16(&p[4], uint16_t(p.size() - 40));
            p[40 + hdr.size()] = type;
            return p;
        };
        // AH of 24 bytes (its length field: 24 / 4 - 2), then ICMPv6.
        std::vector<uint8_t> ah(24);
        ah[0] = kProtoIcmpv6;
        ah[1] = 4;
        CHECK(refused(with(51, ah, 1), "fd01::1"));
        CHECK_FALSE(refused(with(51, ah, 128), "fd01::1"));
        std::vector<uint8_t> frag = {kProtoIcmpv6, 0, 0, 1, 0, 0, 0, 7};  // offset 0, M
        CHECK(refused(with(44, frag, 3), "fd01::1"));
        frag[2] = 0x01;  // offset 256 bytes: no ICMPv6 header here
        CHECK_FALSE(refused(with(44, frag, 3), "fd01::1"));
    }
    SECTION("ICMP whose type is not there, or not one the kernel knows")
    {
        auto p6 = udp_packet(6, "fd01::2", "fd02::2", 40);
        p6[6] = kProtoIcmpv6;
        p6.resize(40);
        put16(&p6[4], 0);
        CHECK(refused(p6, "fd01::1"));
        auto p4 = udp_packet(4, "10.1.0.2", "10.2.0.2", 40);
        p4[9] = kProtoIcmp;
        p4[20] = 40;  // above NR_ICMP_TYPES
        ipv4_set_checksum(p4.data());
        CHECK(refused(p4, "10.1.0.1"));
        p4[20] = 8;  // echo request
        CHECK_FALSE(refused(p4, "10.1.0.1"));
        p4.resize(20);
        put16(&p4[2], 20);
        ipv4_set_checksum(p4.data());
        CHECK(refused(p4, "10.1.0.1"));
    }
    SECTION("no address of the packet's family to answer from")
    {
        CHECK(refused(udp_packet(6, "fd01::2", "fd02::2", 40), "10.1.0.1"));
    }
    SECTION("the first fragment is answered")
    {
        auto p = udp_packet(4, "10.1.0.2", "10.2.0.2", 40);
        put16(&p[6], 0x2000);
        ipv4_set_checksum(p.data());
        CHECK_FALSE(refused(p, "10.1.0.1"));
    }
}

TEST_CASE("ICMP errors are rate limited by a token bucket", "[icmp]")
{
    constexpr uint64_t ms = 1000000;
    IcmpLimiter l(1000, 50);
    uint64_t t = 5000 * ms;
    int sent = 0;
    for (int i = 0; i < 200; i++)
        sent += l.allow(t);
    CHECK(sent == 50);                 // the burst, then nothing
    CHECK_FALSE(l.allow(t + ms / 2));  // half a token is none
    CHECK(l.allow(t + ms));            // one per millisecond
    CHECK_FALSE(l.allow(t + ms));
    // A steady 0.4 ms spacing earns a token every 2.5 calls: the partial token is kept.
    sent = 0;
    for (int i = 1; i <= 1000; i++)
        sent += l.allow(t + ms + uint64_t(i) * 400000);
    CHECK(sent >= 399);
    CHECK(sent <= 401);
    // A long quiet spell refills the bucket to its burst, no further.
    sent = 0;
    for (int i = 0; i < 200; i++)
        sent += l.allow(t + 3600000 * ms);
    CHECK(sent == 50);
}

TEST_CASE("what may not be answered takes no token of the rate limit", "[icmp]")
{
    constexpr uint64_t ms = 1000000;
    IcmpLimiter l(1000, 50);
    const uint64_t t = 5000 * ms;
    // A flood of packets that may not be answered, all at one instant: none takes a token.
    Frame error(udp_packet(4, "10.1.0.2", "10.2.0.2", 40));
    REQUIRE(icmp_time_exceeded(error.pkt, addr("10.1.0.1")));
    for (int i = 0; i < 200; i++) {
        Frame f(udp_packet(4, "10.1.0.2", "224.0.0.5", 40));
        CHECK(icmp_time_exceeded(f.pkt, addr("10.1.0.1"), l, t) == IcmpAnswer::Refused);
        Frame g(udp_packet(6, "fd01::2", "ff05::1", 40));
        CHECK(icmp_time_exceeded(g.pkt, addr("fd01::1"), l, t) == IcmpAnswer::Refused);
        Frame e(error.bytes());
        CHECK(icmp_time_exceeded(e.pkt, addr("10.1.0.1"), l, t) == IcmpAnswer::Refused);
        Frame v(udp_packet(6, "fd01::2", "fd02::2", 40));  // no address of its family
        CHECK(icmp_time_exceeded(v.pkt, addr("10.1.0.1"), l, t) == IcmpAnswer::Refused);
    }
    // So the burst is whole for those that may be.
    int sent = 0, limited = 0;
    for (int i = 0; i < 60; i++) {
        Frame f(udp_packet(4, "10.1.0.2", "10.2.0.2", 40));
        IcmpAnswer a = icmp_time_exceeded(f.pkt, addr("10.1.0.1"), l, t);
        sent += a == IcmpAnswer::Sent && f.pkt.verdict == Verdict::TimeExceeded;
        limited += a == IcmpAnswer::Limited && f.pkt.verdict != Verdict::TimeExceeded;
    }
    CHECK(sent == 50);
    CHECK(limited == 10);
}

TEST_CASE("packet too big is never sent where the rules forbid it", "[icmp]")
{
    auto answered = [](std::vector<uint8_t> p, const char *from) {
        Frame f(p);
        bool yes = icmp_too_big(f.pkt, addr(from), 1300);
        if (!yes)
            CHECK(f.bytes() == p);
        return yes;
    };
    CHECK(answered(udp_packet(4, "10.1.0.2", "10.2.0.2", 1400), "10.1.0.1"));
    CHECK(answered(udp_packet(6, "fd01::2", "fd02::2", 1400), "fd01::1"));
    SECTION("IPv4: not to a multicast or broadcast destination, nor a source of no host")
    {
        CHECK_FALSE(answered(udp_packet(4, "10.1.0.2", "239.1.1.1", 1400), "10.1.0.1"));
        CHECK_FALSE(answered(udp_packet(4, "10.1.0.2", "255.255.255.255", 1400), "10.1.0.1"));
        CHECK_FALSE(answered(udp_packet(4, "0.0.0.0", "10.2.0.2", 1400), "10.1.0.1"));
        CHECK_FALSE(answered(udp_packet(4, "224.0.0.1", "10.2.0.2", 1400), "10.1.0.1"));
    }
    SECTION("IPv6: to a multicast destination's sender, never to a source of no host")
    {
        CHECK(answered(udp_packet(6, "fd01::2", "ff05::1:3", 1400), "fd01::1"));
        CHECK_FALSE(answered(udp_packet(6, "::", "fd02::2", 1400), "fd01::1"));
        CHECK_FALSE(answered(udp_packet(6, "ff02::1", "fd02::2", 1400), "fd01::1"));
    }
    SECTION("never for an ICMP error")
    {
        Frame f(udp_packet(4, "10.1.0.2", "10.2.0.2", 1400));
        REQUIRE(icmp_too_big(f.pkt, addr("10.1.0.1"), 1300));
        CHECK_FALSE(answered(f.bytes(), "10.1.0.1"));
        Frame g(udp_packet(6, "fd01::2", "fd02::2", 1400));
        REQUIRE(icmp_too_big(g.pkt, addr("fd01::1"), 1300));
        CHECK_FALSE(answered(g.bytes(), "fd01::1"));
    }
    SECTION("icmp_may_answer() says the same before any frame is taken")
    {
        CHECK(icmp_may_answer(udp_packet(6, "fd01::2", "ff05::1:3", 100).data(), 100, true));
        CHECK_FALSE(icmp_may_answer(udp_packet(6, "fd01::2", "ff05::1:3", 100).data(), 100, false));
        CHECK_FALSE(icmp_may_answer(udp_packet(4, "10.1.0.2", "239.1.1.1", 100).data(), 100, true));
        CHECK(icmp_may_answer(udp_packet(4, "10.1.0.2", "10.2.0.2", 100).data(), 100, false));
    }
}
