// Super-packets cut before encryption and joined after (offload/gso.h): the pieces are what
// the kernel's TSO and USO would send, with checksums right, and joining them gives back the
// super-packet. And what Tun::read (offload/tun.h) says of a device with nothing to read.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/unit/esp_fixture.h"
#include "userspace/offload/gso.h"
#include "userspace/offload/tun.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

constexpr uint8_t kFin = 0x01, kPsh = 0x08, kAck = 0x10, kCwr = 0x80;
constexpr size_t kMss = 1000;  // GRO's segments

// The pseudo-header's sum (RFC 768, RFC 8200 8.1) of a packet whose proto header follows a
// fixed IP header, over the rest of the packet.
uint32_t pseudo(const std::vector<uint8_t> &p, uint8_t proto)
{
    const bool v4 = ip_version(p.data()) == 4;
    const uint32_t l4len = uint32_t(p.size() - (v4 ? kIpv4Len : kIpv6Len));
    return v4 ? csum_add(0, &p[12], 8) + proto + l4len : csum_add(0, &p[8], 32) + l4len + proto;
}

// A TCP segment from 10.1.0.1:40000 to 10.2.0.1:5201 (IPv6: 2001:db8:1::1 to 2001:db8:2::1)
// with a timestamp option (12 bytes), `payload` bytes from `seq` on, checksums right.
std::vector<uint8_t> tcp_packet(int family, uint32_t seq, size_t payload, uint8_t flags = kAck,
                                uint32_t ack = 777, uint16_t sport = 40000)
{
    const size_t hl = family == 4 ? kIpv4Len : kIpv6Len, th = 32;
    std::vector<uint8_t> p =
        udp_packet(family, family == 4 ? "10.1.0.1" : "2001:db8:1::1",
                   family == 4 ? "10.2.0.1" : "2001:db8:2::1", th + payload - kUdpLen);
    if (family == 4) {
        p[9] = kProtoTcp;
        ipv4_set_checksum(p.data());
    } else {
        p[6] = kProtoTcp;
    }
    uint8_t *t = p.data() + hl;
    std::memset(t, 0, th);
    put16(t, sport);
    put16(t + 2, 5201);
    put32(t + 4, seq);
    put32(t + 8, ack);
    t[12] = uint8_t(th / 4) << 4;
    t[13] = flags;
    put16(t + 14, 502);
    t[20] = 1;  // NOP, NOP, timestamps
    t[21] = 1;
    t[22] = 8;
    t[23] = 10;
    put32(t + 24, 1000);
    put32(t + 28, 2000);
    for (size_t i = 0; i < payload; i++)
        t[th + i] = uint8_t((seq + i) * 7);
    const uint32_t l4len = uint32_t(p.size() - hl);
    put16(t + 16, uint16_t(~csum_fold(csum_add(pseudo(p, kProtoTcp), t, l4len))));
    return p;
}

// The L4 checksum of a whole packet, checked: the sum over the pseudo-header and segment.
bool l4_ok(const std::vector<uint8_t> &p)
{
    const bool v4 = ip_version(p.data()) == 4;
    const size_t hl = v4 ? kIpv4Len : kIpv6Len, l4len = p.size() - hl;
    return csum_fold(csum_add(pseudo(p, v4 ? p[9] : p[6]), &p[hl], l4len)) == 0xffff;
}

bool ipv4_ok(const std::vector<uint8_t> &p)
{
    return csum_fold(csum_add(0, p.data(), kIpv4Len)) == 0xffff;
}

// The vnet header the kernel writes for a TSO super-packet, and its checksum field as it
// leaves it: the pseudo-header's sum.
VnetHdr tso_header(std::vector<uint8_t> &p, uint16_t mss)
{
    const bool v4 = ip_version(p.data()) == 4;
    const uint16_t l4 = v4 ? kIpv4Len : kIpv6Len;
    put16(&p[l4 + 16], csum_fold(pseudo(p, kProtoTcp)));
    VnetHdr h;
    h.flags = VnetHdr::kNeedsCsum;
    h.gso_type = v4 ? VnetHdr::kGsoTcpv4 : VnetHdr::kGsoTcpv6;
    h.hdr_len = uint16_t(l4 + 32);
    h.gso_size = mss;
    h.csum_start = l4;
    h.csum_offset = 16;
    return h;
}

// The vnet header the kernel writes for a USO super-packet whose UDP header is at l4.
VnetHdr uso_header(uint16_t l4, uint16_t gso_size)
{
    VnetHdr h;
    h.flags = VnetHdr::kNeedsCsum;
    h.gso_type = VnetHdr::kGsoUdpL4;
    h.hdr_len = uint16_t(l4 + kUdpLen);
    h.gso_size = gso_size;
    h.csum_start = l4;
    h.csum_offset = 6;
    return h;
}

struct Frames {
    std::vector<std::vector<uint8_t>> mem;
    std::vector<uint8_t *> at;
    std::vector<uint32_t> len;
    explicit Frames(size_t n, size_t room = 2048) : mem(n, std::vector<uint8_t>(room)), len(n)
    {
        for (auto &m : mem)
            at.push_back(m.data());
    }
    std::vector<uint8_t> piece(size_t i) const { return {mem[i].begin(), mem[i].begin() + len[i]}; }
};

// gso_split() of super into f's frames (2048 bytes each), pieces of at most inner_mtu, which
// must make one piece per seg bytes of its payload: how many.
size_t split(const VnetHdr &h, const std::vector<uint8_t> &super, uint32_t inner_mtu, Frames &f,
             size_t seg, size_t payload)
{
    size_t n = 0;
    REQUIRE(gso_split(h, super.data(), super.size(), inner_mtu, f.at.data(), 2048, f.len.data(),
                      f.at.size(), &n) == GsoError::None);
    REQUIRE(n == (payload + seg - 1) / seg);
    return n;
}

}  // namespace

TEST_CASE("a TCP super-packet is cut as TSO cuts it, to the tunnel's MTU", "[gso]")
{
    for (int family : {4, 6}) {
        INFO("IPv" << family);
        const size_t payload = 20000;
        auto super = tcp_packet(family, 1'000'000, payload, kAck | kPsh | kFin | kCwr);
        VnetHdr h = tso_header(super, 1448);
        const size_t hl = family == 4 ? kIpv4Len : kIpv6Len, hdrs = hl + 32;
        Frames f(32);
        // The tunnel's inner MTU is below what the host's MSS makes: pieces of 1400 bytes.
        const size_t seg = 1400 - hdrs, n = split(h, super, 1400, f, seg, payload);
        std::vector<uint8_t> joined;
        for (size_t i = 0; i < n; i++) {
            INFO("piece " << i);
            auto p = f.piece(i);
            const uint8_t *t = &p[hl];
            CHECK(p.size() <= 1400);
            CHECK(p.size() == hdrs + std::min(seg, payload - i * seg));
            if (family == 4) {
                CHECK(get16(&p[2]) == p.size());
                CHECK(get16(&p[4]) == uint16_t(0x1234 + i));
                CHECK(ipv4_ok(p));
            } else {
                CHECK(get16(&p[4]) == p.size() - kIpv6Len);
            }
            CHECK(l4_ok(p));
            CHECK(get32(t + 4) == 1'000'000 + i * seg);
            const bool first = i == 0, last = i + 1 == n;
            CHECK(t[13] == (kAck | (first ? kCwr : 0) | (last ? kPsh | kFin : 0)));
            // Everything else of the headers is the super-packet's.
            CHECK(std::memcmp(t + 20, &super[hl + 20], 12) == 0);
            CHECK(std::memcmp(t, &super[hl], 4) == 0);
            joined.insert(joined.end(), p.begin() + long(hdrs), p.end());
        }
        CHECK(std::equal(joined.begin(), joined.end(), super.begin() + long(hdrs)));
        CHECK(joined.size() == payload);
    }
}

TEST_CASE("IPv4 without DF is cut as the host planned: its next packet's ids stay its own", "[gso]")
{
    const size_t payload = 20000, hdrs = kIpv4Len + 32;
    auto super = tcp_packet(4, 1'000'000, payload);
    put16(&super[6], 0);  // DF clear
    ipv4_set_checksum(super.data());
    VnetHdr h = tso_header(super, 1448);
    Frames f(32);
    // A tunnel that takes 1400 bytes: pieces of the host's 1448 bytes of payload all the same,
    // the ids id to id + 13 that the host gave them, for the engine to fragment.
    const size_t n = split(h, super, 1400, f, 1448, payload);
    CHECK(n == 14);
    for (size_t i = 0; i < n; i++) {
        INFO("piece " << i);
        auto p = f.piece(i);
        CHECK(p.size() == hdrs + std::min<size_t>(1448, payload - i * 1448));
        CHECK(get16(&p[4]) == uint16_t(0x1234 + i));
        CHECK(get16(&p[6]) == 0);
        CHECK(ipv4_ok(p));
        CHECK(l4_ok(p));
    }
    // A size no frame holds is cut to what one does, whatever the ids.
    h.gso_size = 4000;
    split(h, super, 1400, f, 1400 - hdrs, payload);
}

TEST_CASE("an IPv6 super-packet with an options header is cut, each piece keeping it", "[gso]")
{
    // A destination options header (PadN) between the fixed header and TCP, as a socket
    // with IPV6_DSTOPTS sends; TSO leaves the pseudo-header's sum in the checksum field.
    const size_t payload = 6000, l4 = kIpv6Len + 8, hdrs = l4 + 32;
    const uint8_t opts[8] = {kProtoTcp, 0, 1, 4, 0, 0, 0, 0};
    auto plain = tcp_packet(6, 5000, payload);
    std::vector<uint8_t> super(plain.begin(), plain.begin() + long(kIpv6Len));
    super.insert(super.end(), opts, opts + 8);
    super.insert(super.end(), plain.begin() + long(kIpv6Len), plain.end());
    super[6] = kProtoIpv6Opts;
    put16(&super[4], uint16_t(super.size() - kIpv6Len));
    auto pseudo6 = [](const std::vector<uint8_t> &p) {
        return csum_add(0, &p[8], 32) + uint32_t(p.size() - l4) + kProtoTcp;
    };
    put16(&super[l4 + 16], csum_fold(pseudo6(super)));
    VnetHdr h;
    h.flags = VnetHdr::kNeedsCsum;
    h.gso_type = VnetHdr::kGsoTcpv6;
    h.hdr_len = uint16_t(hdrs);
    h.gso_size = 1400;
    h.csum_start = uint16_t(l4);
    h.csum_offset = 16;
    Frames f(32);
    const size_t seg = 1400 - hdrs, n = split(h, super, 1400, f, seg, payload);
    std::vector<uint8_t> joined;
    for (size_t i = 0; i < n; i++) {
        INFO("piece " << i);
        auto p = f.piece(i);
        CHECK(p[6] == kProtoIpv6Opts);
        CHECK(std::memcmp(&p[kIpv6Len], opts, 8) == 0);
        CHECK(get16(&p[4]) == p.size() - kIpv6Len);
        CHECK(csum_fold(csum_add(pseudo6(p), &p[l4], uint32_t(p.size() - l4))) == 0xffff);
        CHECK(get32(&p[l4 + 4]) == 5000 + i * seg);
        joined.insert(joined.end(), p.begin() + long(hdrs), p.end());
    }
    CHECK(std::equal(joined.begin(), joined.end(), super.begin() + long(hdrs)));

    // A routing header instead: the pseudo-header would name its last address; not cut.
    super[6] = kProtoIpv6Route;
    size_t none = 0;
    CHECK(gso_split(h, super.data(), super.size(), 1400, f.at.data(), 2048, f.len.data(),
                    f.at.size(), &none) == GsoError::BadPacket);
}

TEST_CASE("a UDP super-packet is cut into datagrams (USO); one packet gets its checksum done",
          "[gso]")
{
    for (int family : {4, 6}) {
        INFO("IPv" << family);
        auto super = udp_packet(family, family == 4 ? "10.1.0.1" : "2001:db8:1::1",
                                family == 4 ? "10.2.0.1" : "2001:db8:2::1", 5000);
        const uint16_t l4 = family == 4 ? kIpv4Len : kIpv6Len;
        VnetHdr h = uso_header(l4, 1200);
        Frames f(8);
        size_t n = 0;
        REQUIRE(gso_split(h, super.data(), super.size(), 1500, f.at.data(), 2048, f.len.data(),
                          f.at.size(), &n) == GsoError::None);
        REQUIRE(n == 5);
        for (size_t i = 0; i < n; i++) {
            auto p = f.piece(i);
            CHECK(get16(&p[l4 + 4]) == p.size() - l4);
            CHECK(get16(&p[l4 + 6]) != 0);
            CHECK(l4_ok(p));
            CHECK(std::memcmp(&p[l4 + 8], &super[l4 + 8 + i * 1200], p.size() - l4 - 8) == 0);
        }

        // Not GSO, the checksum the device's to do: the pseudo-header's sum in its place.
        auto one = udp_packet(family, family == 4 ? "10.1.0.1" : "2001:db8:1::1",
                              family == 4 ? "10.2.0.1" : "2001:db8:2::1", 300);
        put16(&one[l4 + 6], csum_fold(pseudo(one, kProtoUdp)));
        VnetHdr partial;
        partial.flags = VnetHdr::kNeedsCsum;
        partial.csum_start = l4;
        partial.csum_offset = 6;
        REQUIRE(gso_split(partial, one.data(), one.size(), 1500, f.at.data(), 2048, f.len.data(),
                          f.at.size(), &n) == GsoError::None);
        REQUIRE(n == 1);
        CHECK_FALSE(l4_ok(one));
        CHECK(l4_ok(f.piece(0)));

        // Too big for the tunnel: the datagram not to cut is refused, and so are USO's
        // datagrams, each a message of the sender's, rather than cut smaller.
        CHECK(gso_split(partial, one.data(), one.size(), 300, f.at.data(), 2048, f.len.data(),
                        f.at.size(), &n) == GsoError::TooBig);
        CHECK(gso_split(h, super.data(), super.size(), 1200, f.at.data(), 2048, f.len.data(),
                        f.at.size(), &n) == GsoError::TooBig);
        CHECK(n == 0);
    }
}

TEST_CASE("a vnet header that does not fit its packet cuts nothing", "[gso]")
{
    auto super = tcp_packet(4, 1, 6000);
    Frames f(4);
    size_t n = 7;
    VnetHdr h = tso_header(super, 1448);
    auto split = [&](const VnetHdr &v, uint32_t mtu = 1500) {
        return gso_split(v, super.data(), super.size(), mtu, f.at.data(), 2048, f.len.data(),
                         f.at.size(), &n);
    };
    VnetHdr bad = h;
    bad.csum_start = uint16_t(super.size());
    CHECK(split(bad) == GsoError::BadHeader);
    bad = h;
    bad.gso_type = VnetHdr::kGsoTcpv6;  // an IPv4 packet
    CHECK(split(bad) == GsoError::BadPacket);
    bad = h;
    bad.gso_size = 0;
    CHECK(split(bad) == GsoError::BadHeader);
    bad = h;
    bad.gso_type = VnetHdr::kGsoUdp;  // UFO: not offered
    CHECK(split(bad) == GsoError::BadHeader);
    bad = h;
    bad.flags = 0;
    CHECK(split(bad) == GsoError::BadHeader);
    CHECK(split(h, 52) == GsoError::TooBig);     // no room for a byte of payload
    CHECK(split(h, 1000) == GsoError::TooMany);  // 7 pieces for 4 frames
    put16(&super[2], uint16_t(super.size() - 1));
    CHECK(split(h) == GsoError::BadPacket);  // the IP length
    CHECK(n == 0);
}

namespace {

struct Burst {
    std::vector<std::vector<uint8_t>> pkts;
    std::vector<const uint8_t *> at;
    std::vector<uint32_t> len;
    std::vector<uint16_t> run_of;
    void add(std::vector<uint8_t> p) { pkts.push_back(std::move(p)); }
    void plan(bool udp = false)
    {
        at.clear();
        len.clear();
        for (auto &p : pkts) {
            at.push_back(p.data());
            len.push_back(uint32_t(p.size()));
        }
        run_of.assign(pkts.size(), 0);
        Gro::plan(at.data(), len.data(), pkts.size(), udp, run_of.data());
    }
    std::vector<uint8_t> write(size_t first, VnetHdr *h)
    {
        std::vector<uint8_t> out(Gro::kMaxLen);
        uint32_t n =
            Gro::write(at.data(), len.data(), pkts.size(), run_of.data(), first, out.data(), h);
        out.resize(n);
        // The same run as gather() gives it for writev(): a joined run's headers in the
        // caller's buffer, then every payload where it is, in its own packet; a packet alone
        // is itself. Nothing is copied but the headers.
        uint8_t hdr[Gro::kMaxHdrs];
        iovec iov[Gro::kMaxRun + 1];
        size_t niov = 0;
        VnetHdr gh;
        Gro::gather(at.data(), len.data(), pkts.size(), run_of.data(), first, hdr, iov, &niov, &gh);
        size_t segs = 0;
        for (size_t i = first; i < pkts.size(); i++)
            segs += run_of[i] == first;
        const bool alone = segs < 2;
        REQUIRE(niov == (alone ? 1 : segs + 1));
        CHECK(iov[0].iov_base == (alone ? static_cast<const void *>(at[first]) : hdr));
        for (size_t i = first, piece = 1; !alone && i < pkts.size(); i++)
            if (run_of[i] == first) {
                const uint8_t *p = at[i] + iov[0].iov_len;  // past the headers
                CHECK(iov[piece].iov_base == p);
                CHECK(iov[piece].iov_len == len[i] - iov[0].iov_len);
                piece++;
            }
        return out;
    }
};

}  // namespace

TEST_CASE("segments cut by TSO are joined back into the super-packet", "[gso]")
{
    for (int family : {4, 6}) {
        INFO("IPv" << family);
        auto super = tcp_packet(family, 5000, 30000, kAck | kPsh);
        VnetHdr h = tso_header(super, 1400);
        Frames f(32);
        size_t n = 0;
        REQUIRE(gso_split(h, super.data(), super.size(), 1500, f.at.data(), 2048, f.len.data(),
                          f.at.size(), &n) == GsoError::None);
        Burst b;
        for (size_t i = 0; i < n; i++)
            b.add(f.piece(i));
        b.plan();
        for (size_t i = 0; i < n; i++)
            CHECK(b.run_of[i] == 0);
        VnetHdr out;
        auto joined = b.write(0, &out);
        CHECK(out.flags == VnetHdr::kNeedsCsum);
        CHECK(out.gso_type == (family == 4 ? VnetHdr::kGsoTcpv4 : VnetHdr::kGsoTcpv6));
        CHECK(out.gso_size == 1400);
        CHECK(out.csum_start == (family == 4 ? kIpv4Len : kIpv6Len));
        CHECK(out.csum_offset == 16);
        CHECK(out.hdr_len == out.csum_start + 32);
        // The kernel's TSO input again, byte for byte (its checksum field the pseudo-header's
        // sum, as the sender's kernel left it).
        CHECK(joined == super);
    }
}

TEST_CASE("GRO joins only what follows on in one flow, and nothing passes its connection", "[gso]")
{
    auto seg = [&](uint32_t k, uint8_t flags = kAck, uint32_t ack = 777, uint16_t port = 40000,
                   size_t len = kMss) { return tcp_packet(4, k * kMss, len, flags, ack, port); };

    SECTION("two flows interleaved: each its own run, in its order")
    {
        Burst b;
        b.add(seg(0));
        b.add(seg(0, kAck, 777, 40001));
        b.add(seg(1));
        b.add(seg(1, kAck, 777, 40001));
        b.add(udp_packet(4, "10.1.0.9", "10.2.0.9", 100));
        b.add(seg(2, kAck | kPsh));
        b.plan();
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 0, 1, 4, 0});
        VnetHdr h;
        auto a = b.write(0, &h);
        CHECK(a.size() == kIpv4Len + 32 + 3 * kMss);
        CHECK((a[kIpv4Len + 13] & kPsh) != 0);  // the last one's
        CHECK(h.gso_size == kMss);
        auto alone = b.write(4, &h);
        CHECK(alone == b.pkts[4]);
        CHECK(h.gso_type == VnetHdr::kGsoNone);
        CHECK(h.flags == 0);
    }
    SECTION("a packet that does not join ends every run between its addresses")
    {
        Burst b;
        b.add(seg(0));
        b.add(seg(0, kAck, 777, 40001));
        b.add(seg(1, kAck, 777, 40001, 0));  // B's pure ACK: B1 may not pass it
        b.add(seg(1, kAck, 777, 40001));
        b.add(seg(1));
        b.plan();
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 2, 3, 4});
    }
    SECTION("what ends a run")
    {
        Burst b;
        uint32_t seq = 0;
        // The next segment of the flow: len bytes from where the last one ended (+ skip).
        auto next = [&](size_t len = kMss, uint8_t flags = kAck, uint32_t ack = 777,
                        uint32_t skip = 0) {
            seq += skip;
            b.add(tcp_packet(4, seq, len, flags, ack));
            seq += uint32_t(len);
        };
        next();                        // 0
        next(kMss, kAck, 777, 1);      // 1: a gap
        next(kMss, kAck, 778);         // 2: another acknowledgement
        next(kMss, kAck, 778);         //    joins 2
        next(kMss, kAck | kPsh, 778);  //    joins 2, and ends it
        next(kMss, kAck, 778);         // 5
        next(500, kAck, 778);          //    joins 5: smaller, the last
        next(kMss, kAck, 778);         // 7: after a smaller one
        next(kMss, kAck | kFin, 778);  // 8: a FIN, alone, and the end of 7's run
        next(kMss, kAck, 778);         // 9
        next(0, kAck, 778);            // 10: a pure ACK: alone, and the end of 9's run
        next(kMss, kAck, 778);         // 11
        next(kMss, kAck, 778);         // 12: a bad checksum: alone, and the end of 11's run
        b.pkts.back().back() ^= 1;
        next(kMss, kAck, 778);  // 13
        next(kMss, kAck, 778);  //    joins 13
        b.plan();
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 2, 2, 2, 5, 5, 7, 8, 9, 10, 11, 12, 13, 13});
    }
    SECTION("a first segment with a bad checksum is left alone")
    {
        Burst b;
        auto bad = seg(0);
        bad.back() ^= 1;
        b.add(bad);
        b.add(seg(1));
        b.add(seg(2));
        b.plan();
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 1});
    }
    SECTION("at most 64 KB")
    {
        Burst b;
        for (uint32_t k = 0; k < 50; k++)
            b.add(tcp_packet(4, k * 1400, 1400));
        b.plan();
        // 52 bytes of headers and 46 payloads of 1400: 64,452 bytes; one more is too many.
        CHECK(b.run_of[45] == 0);
        CHECK(b.run_of[46] == 46);
        CHECK(b.run_of[49] == 46);
    }
}

TEST_CASE("GRO joins IPv4 segments whose ids go up by one, or stay the same with DF", "[gso]")
{
    // inet_gro_flush (include/net/gro.h): the second segment decides whether the run's ids
    // are fixed (the same id, DF set) or incrementing (the first's plus the index); a segment
    // that does neither ends the run and starts the next.
    struct Case {
        const char *name;
        bool df;
        std::vector<uint16_t> ids;
        std::vector<uint16_t> run_of;
    };
    const Case cases[] = {
        {"incrementing, DF", true, {7, 8, 9, 10}, {0, 0, 0, 0}},
        {"incrementing, no DF", false, {7, 8, 9, 10}, {0, 0, 0, 0}},
        {"incrementing across 0xffff", false, {0xfffe, 0xffff, 0, 1}, {0, 0, 0, 0}},
        {"fixed, DF", true, {7, 7, 7, 7}, {0, 0, 0, 0}},
        {"fixed, no DF: nothing joins", false, {7, 7, 7, 7}, {0, 1, 2, 3}},
        {"a gap ends the run", true, {7, 8, 10, 11}, {0, 0, 2, 2}},
        {"going down ends the run", false, {9, 8, 7, 6}, {0, 1, 2, 3}},
        {"fixed, then one up: the end of the run", true, {7, 7, 8, 9}, {0, 0, 2, 2}},
        {"incrementing, then the same again: the end of the run", true, {7, 8, 8, 8}, {0, 0, 2, 2}},
    };
    for (const Case &c : cases) {
        INFO(c.name);
        Burst b;
        for (size_t k = 0; k < c.ids.size(); k++) {
            auto p = tcp_packet(4, uint32_t(k * kMss), kMss);
            put16(&p[4], c.ids[k]);
            p[6] = c.df ? 0x40 : 0;
            ipv4_set_checksum(p.data());
            b.add(std::move(p));
        }
        b.plan();
        CHECK(b.run_of == c.run_of);
    }
}

namespace {

// A datagram of `payload` bytes between the ports with its UDP checksum done, IPv4 id `id`.
std::vector<uint8_t> udp_datagram(int family, size_t payload, uint16_t id = 0x1234,
                                  uint16_t sport = 1000, uint16_t dport = 2000)
{
    auto p = udp_packet(family, family == 4 ? "10.1.0.1" : "2001:db8:1::1",
                        family == 4 ? "10.2.0.1" : "2001:db8:2::1", payload, 0, sport, dport);
    const size_t l4 = family == 4 ? kIpv4Len : kIpv6Len;
    if (family == 4) {
        put16(&p[4], id);
        ipv4_set_checksum(p.data());
    }
    const uint32_t l4len = uint32_t(p.size() - l4);
    uint16_t c = uint16_t(~csum_fold(csum_add(pseudo(p, kProtoUdp), &p[l4], l4len)));
    put16(&p[l4 + 6], c ? c : 0xffff);
    return p;
}

}  // namespace

TEST_CASE("datagrams cut by USO are joined back where the device takes USO", "[gso]")
{
    for (int family : {4, 6}) {
        INFO("IPv" << family);
        const uint16_t l4 = family == 4 ? kIpv4Len : kIpv6Len;
        auto super = udp_packet(family, family == 4 ? "10.1.0.1" : "2001:db8:1::1",
                                family == 4 ? "10.2.0.1" : "2001:db8:2::1", 5300);
        put16(&super[l4 + 6], csum_fold(pseudo(super, kProtoUdp)));  // as the sender's kernel
        VnetHdr uso = uso_header(l4, 1000);
        Frames f(8);
        size_t n = 0;
        REQUIRE(gso_split(uso, super.data(), super.size(), 1500, f.at.data(), 2048, f.len.data(),
                          f.at.size(), &n) == GsoError::None);
        REQUIRE(n == 6);
        Burst b;
        for (size_t i = 0; i < n; i++)
            b.add(f.piece(i));

        b.plan(false);  // a device without USO: each datagram alone
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 2, 3, 4, 5});

        b.plan(true);
        CHECK(b.run_of == std::vector<uint16_t>{0, 0, 0, 0, 0, 0});
        VnetHdr h;
        auto joined = b.write(0, &h);
        CHECK(h.flags == VnetHdr::kNeedsCsum);
        CHECK(h.gso_type == VnetHdr::kGsoUdpL4);
        CHECK(h.gso_size == 1000);
        CHECK(h.hdr_len == l4 + kUdpLen);
        CHECK(h.csum_start == l4);
        CHECK(h.csum_offset == 6);
        // The sender's USO super-packet again, byte for byte: the UDP length the whole run's,
        // the checksum field the pseudo-header's sum.
        CHECK(joined == super);
    }
}

TEST_CASE("GRO joins UDP datagrams of one flow only as the kernel's UDP GRO does", "[gso]")
{
    auto dg = [](size_t payload, uint16_t id, uint16_t sport = 1000, uint16_t dport = 2000) {
        return udp_datagram(4, payload, id, sport, dport);
    };
    SECTION("two flows interleaved, a smaller datagram last")
    {
        Burst b;
        b.add(dg(500, 1));
        b.add(dg(500, 50, 1001));
        b.add(dg(500, 2));
        b.add(dg(500, 51, 1001));
        b.add(dg(200, 3));
        b.plan(true);
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 0, 1, 0});
        VnetHdr h;
        auto a = b.write(0, &h);
        CHECK(a.size() == kIpv4Len + kUdpLen + 1200);
        CHECK(get16(&a[kIpv4Len + 4]) == kUdpLen + 1200);
        CHECK(ipv4_ok(a));
        CHECK(h.gso_size == 500);
    }
    SECTION("what ends a run or stays alone")
    {
        Burst b;
        b.add(dg(500, 1));
        b.add(dg(200, 2));
        b.add(dg(500, 3));  // bigger than the one before: a run of its own
        auto none = dg(500, 4);
        put16(&none[kIpv4Len + 6], 0);  // no checksum: alone (udp_gro_receive_segment)
        b.add(none);
        b.add(dg(500, 5));
        auto bad = dg(500, 6);
        bad.back() ^= 1;  // a wrong checksum: alone, for the kernel to drop
        b.add(bad);
        b.add(dg(500, 7));
        b.add(dg(500, 9));  // an id that skips one
        b.plan(true);
        CHECK(b.run_of == std::vector<uint16_t>{0, 0, 2, 3, 4, 5, 6, 7});
    }
    SECTION("DF and id 0 on every datagram, as a host's unconnected socket sends them")
    {
        Burst b;
        for (int k = 0; k < 3; k++)
            b.add(dg(500, 0));  // udp_packet sets DF
        b.plan(true);
        CHECK(b.run_of == std::vector<uint16_t>{0, 0, 0});
    }
    SECTION("IPv6: the same hop limit and flow label, and UDP right after the fixed header")
    {
        auto v6 = [](uint8_t hop, uint32_t label) {
            auto p = udp_datagram(6, 500);
            p[7] = hop;
            p[1] = uint8_t((p[1] & 0xf0) | ((label >> 16) & 0x0f));
            put16(&p[2], uint16_t(label));
            return p;
        };
        Burst b;
        b.add(v6(64, 0));
        b.add(v6(64, 0));
        b.add(v6(63, 0));  // another hop limit: a run of its own
        b.add(v6(63, 7));  // another flow label: the same
        auto ext = v6(63, 7);
        ext[6] = 60;  // a destination options header where UDP was: not a datagram to join
        b.add(ext);
        b.add(v6(63, 7));
        b.plan(true);
        CHECK(b.run_of == std::vector<uint16_t>{0, 0, 2, 3, 4, 5});
    }
    SECTION("a TCP segment with the same ports ends the run; with others, it does not")
    {
        Burst b;
        b.add(dg(500, 1, 40000, 5201));
        b.add(tcp_packet(4, 0, 500, kAck, 777, 40000));
        b.add(dg(500, 2, 40000, 5201));
        b.add(tcp_packet(4, 0, 500, kAck, 777, 40001));
        b.add(dg(500, 3, 40000, 5201));
        b.plan(true);
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 2, 3, 2});
    }
}

TEST_CASE("GRO leaves alone an IPv4 segment whose header checksum is wrong", "[gso]")
{
    // Its TCP checksum is right (the IP header's is not in it): the kernel drops it only
    // once it has it alone, and a joined packet's IP checksum would be made anew.
    auto seg = [](uint32_t k, bool bad = false) {
        auto p = tcp_packet(4, k * kMss, kMss);
        if (bad)
            p[10] ^= 0x01;
        return p;
    };
    SECTION("in the middle: alone, and the end of the run before it")
    {
        Burst b;
        b.add(seg(0));
        b.add(seg(1, true));
        b.add(seg(2));
        b.add(seg(3));
        b.plan();
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 2, 2});
        VnetHdr h;
        CHECK(b.write(1, &h) == b.pkts[1]);
        CHECK(h.gso_type == VnetHdr::kGsoNone);
    }
    SECTION("the first: alone, the next ones a run of their own")
    {
        Burst b;
        b.add(seg(0, true));
        b.add(seg(1));
        b.add(seg(2));
        b.plan();
        CHECK(b.run_of == std::vector<uint16_t>{0, 1, 1});
    }
}

namespace {

constexpr const char *kTestTun = "xesptest0";

// Up, with IPv6 off (its router solicitations would come between what a test sends).
void tun_up()
{
    const std::string v6 = std::string("/proc/sys/net/ipv6/conf/") + kTestTun + "/disable_ipv6";
    if (FILE *f = std::fopen(v6.c_str(), "w")) {
        std::fputs("1\n", f);
        std::fclose(f);
    }
    int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, kTestTun);
    ::ioctl(s, SIOCGIFFLAGS, &ifr);
    ifr.ifr_flags = short(ifr.ifr_flags | IFF_UP);
    ::ioctl(s, SIOCSIFFLAGS, &ifr);
    ::close(s);
}

// Each of pkts (IPv4) out of the device, for its reader, through a packet socket. "": all
// sent, or what went wrong.
std::string tun_send(const std::vector<std::vector<uint8_t>> &pkts)
{
    int ps = ::socket(AF_PACKET, SOCK_DGRAM | SOCK_CLOEXEC, htons(ETH_P_IP));
    sockaddr_ll to{};
    to.sll_family = AF_PACKET;
    to.sll_protocol = htons(ETH_P_IP);
    to.sll_ifindex = int(::if_nametoindex(kTestTun));
    std::string why;
    for (const auto &p : pkts)
        if (::sendto(ps, p.data(), p.size(), 0, reinterpret_cast<sockaddr *>(&to), sizeof to) !=
            ssize_t(p.size()))
            why += std::string("sendto: ") + std::strerror(errno) + "; ";
    ::close(ps);
    return why;
}

// What Tun::read gave, on a device of a network namespace of its own.
struct TunReads {
    bool ran = false;  // false: no namespace or no TUN device to be had (not root)
    std::string why;
    ssize_t idle = 0;           // before anything was sent
    std::vector<ssize_t> read;  // after each packet was sent
    std::vector<std::vector<uint8_t>> got;
    std::vector<uint8_t> gso_types;
    ssize_t drained = 0;  // once everything was read
};

// Sends pkts into a TUN device and reads them back. On a thread of its own, in a network
// namespace of its own: the device touches nothing of the host's and is gone with the thread.
TunReads tun_reads(const std::vector<std::vector<uint8_t>> &pkts)
{
    TunReads r;
    std::thread t([&] {
        if (::unshare(CLONE_NEWNET) != 0) {
            r.why = std::string("unshare: ") + std::strerror(errno);
            return;
        }
        auto tun = Tun::create(kTestTun);
        if (!tun) {
            r.why = tun.error().message;
            return;
        }
        r.ran = true;
        std::vector<uint8_t> buf(Gro::kMaxLen + 1);
        VnetHdr h;
        r.idle = (*tun)->read(&h, buf.data(), buf.size());
        tun_up();
        r.why = tun_send(pkts);
        for (size_t i = 0; i < pkts.size(); i++) {
            pollfd pfd{(*tun)->fd(), POLLIN, 0};
            ::poll(&pfd, 1, 1000);
            ssize_t n = (*tun)->read(&h, buf.data(), buf.size());
            r.read.push_back(n);
            r.got.emplace_back(buf.begin(), buf.begin() + (n > 0 ? n : 0));
            r.gso_types.push_back(h.gso_type);
        }
        r.drained = (*tun)->read(&h, buf.data(), buf.size());
    });
    t.join();
    return r;
}

}  // namespace

TEST_CASE("Tun::read: a packet's length, -EAGAIN when there is none", "[gso]")
{
    const auto small = udp_packet(4, "10.1.0.1", "10.2.0.1", 64 - 28),
               big = udp_packet(4, "10.1.0.1", "10.2.0.1", 1400 - 28);
    TunReads r = tun_reads({small, big});
    if (!r.ran) {
        WARN("no TUN device in a network namespace of its own (" << r.why << "): not run");
        return;
    }
    INFO(r.why);
    CHECK(r.idle == -EAGAIN);  // not 0: that would be a packet with nothing in it
    CHECK(r.read == std::vector<ssize_t>{64, 1400});
    REQUIRE(r.got.size() == 2);
    CHECK(r.got[0] == small);
    CHECK(r.got[1] == big);
    CHECK(r.gso_types == std::vector<uint8_t>{VnetHdr::kGsoNone, VnetHdr::kGsoNone});
    CHECK(r.drained == -EAGAIN);
}
