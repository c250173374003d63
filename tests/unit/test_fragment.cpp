// Fragmenting the outer packet (userspace/esp/fragment.h): a table of IPv4 and IPv6 packets around
// the size boundaries, each cut, checked fragment by fragment (size, offsets, MF, checksum,
// headers) and put back together by a reassembly of the test's own; refusals leave the packet
// as it was; ESP packets from the engine decrypt after fragmentation and reassembly. scapy
// checks the same fragments in tests/interop/test_fragment.sh.
#include <catch2/catch.hpp>

#include "tests/unit/esp_fixture.h"
#include "userspace/esp/fragment.h"

using namespace xesp;
using namespace xesp::test;
using namespace xesp::wire;

namespace {

using Bytes = std::vector<uint8_t>;

constexpr uint16_t kIdent4 = 0xbeef;
constexpr uint32_t kIdent6 = 0xfeedf00d;

struct Ext {
    uint8_t type;
    uint32_t len;
};

// IPv4 from 192.0.2.1 to 192.0.2.2 carrying ESP, with options and the given flags/offset field.
Bytes v4_packet(uint32_t size, uint16_t frag, const Bytes &opts = {})
{
    uint32_t ihl = uint32_t(kIpv4Len + opts.size());
    Bytes p(size);
    p[0] = uint8_t(0x40 | ihl / 4);
    put16(&p[2], uint16_t(size));
    put16(&p[4], kIdent4);
    put16(&p[6], frag);
    p[8] = 64;
    p[9] = kProtoEsp;
    std::memcpy(&p[12], addr("192.0.2.1").b.data(), 4);
    std::memcpy(&p[16], addr("192.0.2.2").b.data(), 4);
    std::copy(opts.begin(), opts.end(), p.begin() + kIpv4Len);
    ipv4_set_checksum(p.data());
    for (uint32_t i = ihl; i < size; i++)
        p[i] = uint8_t(i * 7 + 3);
    return p;
}

// IPv6 from 2001:db8::1 to 2001:db8::2 with these extension headers in front of ESP.
Bytes v6_packet(uint32_t size, const std::vector<Ext> &exts = {})
{
    Bytes p(size);
    p[0] = 0x60;
    put16(&p[4], uint16_t(size - kIpv6Len));
    p[7] = 64;
    std::memcpy(&p[8], addr("2001:db8::1").b.data(), 16);
    std::memcpy(&p[24], addr("2001:db8::2").b.data(), 16);
    uint32_t nh = 6, off = kIpv6Len;
    for (const Ext &e : exts) {
        p[nh] = e.type;
        p[off + 1] = uint8_t(e.len / 8 - 1);  // the rest is Pad1 options / routing type 0
        nh = off;
        off += e.len;
    }
    p[nh] = kProtoEsp;
    for (uint32_t i = off; i < size; i++)
        p[i] = uint8_t(i * 7 + 3);
    return p;
}

// The frames fragment() works on: p's own and n_extra from a "pool".
struct Frames {
    Frame first;
    std::vector<Bytes> bufs;
    std::vector<Pkt> extra;

    Frames(const Bytes &ip, uint32_t n_extra, uint32_t extra_len = kFrameSize)
            : first(ip), bufs(n_extra, Bytes(kFrameSize, 0xee)), extra(n_extra)
    {
        for (uint32_t i = 0; i < n_extra; i++)
            extra[i] = Pkt{bufs[i].data(), extra_len};
    }
    uint32_t run(uint32_t mtu, uint32_t ident = kIdent6)
    {
        return fragment(first.pkt, mtu, ident, extra.data(), uint32_t(extra.size()));
    }
    std::vector<Bytes> fragments(uint32_t n) const
    {
        std::vector<Bytes> out{first.bytes()};
        for (uint32_t i = 0; i + 1 < n; i++)
            out.emplace_back(extra[i].ip(), extra[i].ip() + extra[i].len);
        return out;
    }
};

// Options the later fragments carry: the copied ones, padded with End of Options.
Bytes copied_options(const Bytes &opts)
{
    Bytes out;
    for (size_t i = 0; i < opts.size() && opts[i] != 0;) {
        if (opts[i] == 1) {
            i++;
            continue;
        }
        if (opts[i] & 0x80)
            out.insert(out.end(), opts.begin() + long(i), opts.begin() + long(i + opts[i + 1]));
        i += opts[i + 1];
    }
    out.resize((out.size() + 3) & ~size_t(3));
    return out;
}

// Checks each IPv4 fragment against the original and returns the reassembled packet.
Bytes reassemble_v4(const Bytes &orig, const std::vector<Bytes> &frags, uint32_t mtu)
{
    uint32_t ihl = uint32_t(orig[0] & 0x0f) * 4;
    uint16_t orig_frag = get16(&orig[6]);
    Bytes later_opts = copied_options(Bytes(orig.begin() + kIpv4Len, orig.begin() + ihl));
    Bytes data;
    for (size_t i = 0; i < frags.size(); i++) {
        INFO("fragment " << i);
        const Bytes &f = frags[i];
        bool last = i + 1 == frags.size();
        uint32_t fihl = uint32_t(f[0] & 0x0f) * 4;
        CHECK(f.size() <= mtu);
        CHECK(get16(&f[2]) == f.size());
        CHECK(csum_fold(csum_add(0, f.data(), fihl)) == 0xffff);
        CHECK(get16(&f[4]) == get16(&orig[4]));
        uint16_t fl = get16(&f[6]);
        CHECK(!(fl & 0x4000));
        CHECK(bool(fl & 0x2000) == (!last || (orig_frag & 0x2000)));
        CHECK((fl & 0x1fff) * 8u == (orig_frag & 0x1fff) * 8u + data.size());
        if (!last)
            CHECK((f.size() - fihl) % 8 == 0);
        // Everything but the length, flags, offset and checksum is the original's.
        CHECK(f[1] == orig[1]);
        CHECK(Bytes(f.begin() + 8, f.begin() + 10) == Bytes(orig.begin() + 8, orig.begin() + 10));
        CHECK(Bytes(f.begin() + 12, f.begin() + 20) == Bytes(orig.begin() + 12, orig.begin() + 20));
        Bytes opts(f.begin() + kIpv4Len, f.begin() + fihl);
        CHECK(opts == (i == 0 ? Bytes(orig.begin() + kIpv4Len, orig.begin() + ihl) : later_opts));
        data.insert(data.end(), f.begin() + fihl, f.end());
    }
    Bytes out(frags[0].begin(), frags[0].begin() + ihl);
    out.insert(out.end(), data.begin(), data.end());
    put16(&out[2], uint16_t(out.size()));
    put16(&out[6], orig_frag);
    ipv4_set_checksum(out.data());
    return out;
}

// Checks each IPv6 fragment (its Fragment header at `front`) and returns the reassembled packet.
Bytes reassemble_v6(const Bytes &orig, const std::vector<Bytes> &frags, uint32_t mtu,
                    uint32_t front)
{
    Bytes data;
    for (size_t i = 0; i < frags.size(); i++) {
        INFO("fragment " << i);
        const Bytes &f = frags[i];
        bool last = i + 1 == frags.size();
        CHECK(f.size() <= mtu);
        CHECK(kIpv6Len + get16(&f[4]) == f.size());
        // The Fragment header is the first header that is not hop-by-hop, routing or
        // destination options.
        uint32_t nh_off = 6, off = kIpv6Len;
        while (f[nh_off] == kProtoIpv6HopByHop || f[nh_off] == kProtoIpv6Route ||
               f[nh_off] == kProtoIpv6Opts) {
            nh_off = off;
            off += (uint32_t(f[off + 1]) + 1) * 8;
        }
        REQUIRE(f[nh_off] == kProtoIpv6Frag);
        REQUIRE(off == front);
        const uint8_t *fh = &f[off];
        CHECK(fh[1] == 0);
        CHECK((get16(fh + 2) & 6) == 0);
        CHECK(bool(get16(fh + 2) & 1) == !last);
        CHECK((get16(fh + 2) & ~7u) == data.size());
        CHECK(get32(fh + 4) == kIdent6);
        uint32_t chunk = uint32_t(f.size()) - off - kIpv6FragHdrLen;
        if (!last)
            CHECK(chunk % 8 == 0);
        Bytes unfrag(f.begin(), f.begin() + off);
        unfrag[nh_off] = fh[0];
        put16(&unfrag[4], get16(&orig[4]));
        CHECK(unfrag == Bytes(orig.begin(), orig.begin() + off));
        data.insert(data.end(), f.begin() + off + kIpv6FragHdrLen, f.end());
    }
    Bytes out(orig.begin(), orig.begin() + front);
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

Bytes reassemble(const Bytes &orig, const std::vector<Bytes> &frags, uint32_t mtu, uint32_t front)
{
    return (orig[0] >> 4) == 4 ? reassemble_v4(orig, frags, mtu)
                               : reassemble_v6(orig, frags, mtu, front);
}

struct Case {
    const char *name;
    int family;
    uint32_t size, mtu;
    uint32_t expect;             // fragments; 0 refused
    uint16_t frag = 0;           // IPv4 flags and offset
    Bytes opts = {};             // IPv4 options
    std::vector<Ext> exts = {};  // IPv6 extension headers, in order
    uint32_t front = kIpv6Len;   // IPv6: where the Fragment header goes
};

constexpr uint16_t kDf = 0x4000, kMf = 0x2000;
const Bytes kRouterAlert = {0x94, 4, 0, 0};  // copied
const Bytes kTimestamp = {0x44, 4, 5, 0};    // not copied

// Sizes: IPv4 at 1500 carries 1480 bytes a fragment, at 576 552, at 1280 1256, at 68 48;
// IPv6 at 1280 1232 (1224 behind an 8-byte hop-by-hop), at 1500 1448.
const Case kCases[] = {
    {.name = "v4 fits 1500", .family = 4, .size = 1500, .mtu = 1500, .expect = 1},
    {.name = "v4 one byte over 1500", .family = 4, .size = 1501, .mtu = 1500, .expect = 2},
    {.name = "v4 two full fragments", .family = 4, .size = 2980, .mtu = 1500, .expect = 2},
    {.name = "v4 one byte over two", .family = 4, .size = 2981, .mtu = 1500, .expect = 3},
    {.name = "v4 1500 at 576", .family = 4, .size = 1500, .mtu = 576, .expect = 3},
    {.name = "v4 577 at 576", .family = 4, .size = 577, .mtu = 576, .expect = 2},
    {.name = "v4 1281 at 1280", .family = 4, .size = 1281, .mtu = 1280, .expect = 2},
    {.name = "v4 3000 at 1280", .family = 4, .size = 3000, .mtu = 1280, .expect = 3},
    {.name = "v4 3700 at 576", .family = 4, .size = 3700, .mtu = 576, .expect = 7},
    {.name = "v4 MTU 68", .family = 4, .size = 200, .mtu = 68, .expect = 4},
    {.name = "v4 MTU 67 refused", .family = 4, .size = 200, .mtu = 67, .expect = 0},
    {.name = "v4 DF refused", .family = 4, .size = 1501, .mtu = 1500, .expect = 0, .frag = kDf},
    {.name = "v4 DF that fits", .family = 4, .size = 1500, .mtu = 1500, .expect = 1, .frag = kDf},
    {.name = "v4 already a fragment",
     .family = 4,
     .size = 1500,
     .mtu = 576,
     .expect = 3,
     .frag = kMf | 100},
    {.name = "v4 last fragment split again",
     .family = 4,
     .size = 1500,
     .mtu = 576,
     .expect = 3,
     .frag = 185},
    {.name = "v4 copied and uncopied options",
     .family = 4,
     .size = 1500,
     .mtu = 576,
     .expect = 3,
     .opts = {0x94, 4, 0, 0, 0x44, 4, 5, 0}},
    {.name = "v4 uncopied option only",
     .family = 4,
     .size = 1500,
     .mtu = 576,
     .expect = 3,
     .opts = kTimestamp},
    {.name = "v4 NOP, copied option, EOL",
     .family = 4,
     .size = 1500,
     .mtu = 576,
     .expect = 3,
     .opts = {1, 0x94, 4, 0, 0, 0, 0, 0}},
    {.name = "v4 40 bytes of options at 68",
     .family = 4,
     .size = 300,
     .mtu = 68,
     .expect = 7,
     .opts = {0x94, 4, 0, 0, 0x44, 36, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
              0,    0, 0, 0, 0,    0,  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
    {.name = "v4 option past the header refused",
     .family = 4,
     .size = 1500,
     .mtu = 576,
     .expect = 0,
     .opts = {0x94, 9, 0, 0}},
    {.name = "v6 fits 1280", .family = 6, .size = 1280, .mtu = 1280, .expect = 1},
    {.name = "v6 one byte over 1280", .family = 6, .size = 1281, .mtu = 1280, .expect = 2},
    {.name = "v6 two full fragments", .family = 6, .size = 2504, .mtu = 1280, .expect = 2},
    {.name = "v6 one byte over two", .family = 6, .size = 2505, .mtu = 1280, .expect = 3},
    {.name = "v6 3000 at 1500", .family = 6, .size = 3000, .mtu = 1500, .expect = 3},
    {.name = "v6 1501 at 1500", .family = 6, .size = 1501, .mtu = 1500, .expect = 2},
    {.name = "v6 MTU 1279 refused", .family = 6, .size = 2000, .mtu = 1279, .expect = 0},
    {.name = "v6 MTU 576 refused", .family = 6, .size = 2000, .mtu = 576, .expect = 0},
    {.name = "v6 hop-by-hop stays in front",
     .family = 6,
     .size = 2000,
     .mtu = 1280,
     .expect = 2,
     .exts = {{kProtoIpv6HopByHop, 8}},
     .front = 48},
    {.name = "v6 destination options travel in the fragments",
     .family = 6,
     .size = 2000,
     .mtu = 1280,
     .expect = 2,
     .exts = {{kProtoIpv6Opts, 8}},
     .front = 40},
    {.name = "v6 hop-by-hop, dest opts, routing, dest opts",
     .family = 6,
     .size = 3000,
     .mtu = 1280,
     .expect = 3,
     .exts = {{kProtoIpv6HopByHop, 8},
              {kProtoIpv6Opts, 16},
              {kProtoIpv6Route, 24},
              {kProtoIpv6Opts, 8}},
     .front = 88},
    {.name = "v6 unfragmentable part leaves 8 bytes",
     .family = 6,
     .size = 1400,
     .mtu = 1280,
     .expect = 17,
     .exts = {{kProtoIpv6HopByHop, 1224}},
     .front = 1264},
    {.name = "v6 unfragmentable part too big refused",
     .family = 6,
     .size = 3000,
     .mtu = 1280,
     .expect = 0,
     .exts = {{kProtoIpv6HopByHop, 1232}}},
    {.name = "v6 already a fragment refused",
     .family = 6,
     .size = 2000,
     .mtu = 1280,
     .expect = 0,
     .exts = {{kProtoIpv6Frag, 8}}},
};

}  // namespace

TEST_CASE("fragment: sizes, offsets, flags, checksums and reassembly", "[fragment]")
{
    for (const Case &c : kCases) {
        INFO(c.name);
        Bytes orig = c.family == 4 ? v4_packet(c.size, c.frag, c.opts) : v6_packet(c.size, c.exts);
        CHECK(fragments_needed(orig.data(), uint32_t(orig.size()), c.mtu) == c.expect);
        Frames fr(orig, 40);
        uint32_t n = fr.run(c.mtu);
        REQUIRE(n == c.expect);
        if (n == 0) {
            CHECK(fr.first.bytes() == orig);
            continue;
        }
        auto frags = fr.fragments(n);
        if (n == 1) {
            CHECK(frags[0] == orig);
            continue;
        }
        CHECK(reassemble(orig, frags, c.mtu, c.front) == orig);
        for (uint32_t i = 0; i + 1 < n; i++) {
            CHECK(fr.extra[i].l3 == kFrameHeadroom);
            CHECK(fr.extra[i].l2_len == 0);
        }
    }
}

TEST_CASE("fragment: the first fragment stays in its frame", "[fragment]")
{
    SECTION("IPv4: header rewritten in place")
    {
        Frames fr(v4_packet(2000, 0), 1);
        fr.first.pkt.l2_len = 14;
        fr.first.pkt.verdict = Verdict::Encrypted;
        REQUIRE(fr.run(1500) == 2);
        CHECK(fr.first.pkt.l3 == kFrameHeadroom);
        CHECK(fr.first.pkt.len == 1500);
        CHECK(fr.first.pkt.l2_len == 14);
        CHECK(fr.extra[0].verdict == Verdict::Encrypted);
    }
    SECTION("IPv6: headers moved 8 bytes into the headroom, payload in place, l4 follows")
    {
        Bytes orig = v6_packet(2000, {{kProtoIpv6HopByHop, 8}});
        Frames fr(orig, 1);
        fr.first.pkt.l4 = 48;  // ESP behind the hop-by-hop header
        fr.first.pkt.l2_len = 14;
        REQUIRE(fr.run(1280) == 2);
        CHECK(fr.first.pkt.l3 == kFrameHeadroom - kIpv6FragHdrLen);
        CHECK(fr.first.pkt.l4 == 56);
        CHECK(fr.first.pkt.l2_len == 0);
        CHECK(std::equal(orig.begin() + 48, orig.begin() + 1272,
                         fr.first.buf.begin() + kFrameHeadroom + 48));
    }
}

TEST_CASE("fragment: refusals leave the packet and the frames as they were", "[fragment]")
{
    Bytes v4 = v4_packet(3000, 0), v6 = v6_packet(3000);
    struct Refusal {
        const char *name;
        const Bytes &pkt;
        uint32_t n_extra, extra_len, l3;
    };
    const Refusal refusals[] = {
        {"v4 one extra frame short", v4, 1, kFrameSize, kFrameHeadroom},
        {"v6 one extra frame short", v6, 1, kFrameSize, kFrameHeadroom},
        {"v4 no extra frames", v4, 0, kFrameSize, kFrameHeadroom},
        {"v4 extra frame too small", v4, 2, kFrameHeadroom + 1000, kFrameHeadroom},
        {"v6 extra frame too small", v6, 2, kFrameHeadroom + 1000, kFrameHeadroom},
        {"v6 no headroom for the Fragment header", v6, 2, kFrameSize, 4},
    };
    for (const Refusal &r : refusals) {
        INFO(r.name);
        Frames fr(r.pkt, r.n_extra, r.extra_len);
        std::memmove(fr.first.buf.data() + r.l3, fr.first.buf.data() + kFrameHeadroom,
                     r.pkt.size());
        fr.first.pkt.l3 = r.l3;
        Pkt before = fr.first.pkt;
        Bytes frame = fr.first.buf;
        CHECK(fr.run(1280) == 0);
        CHECK(fr.first.buf == frame);
        CHECK(fr.first.pkt.l3 == before.l3);
        CHECK(fr.first.pkt.len == before.len);
        for (const Bytes &b : fr.bufs)
            CHECK(std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0xee; }));
    }
}

TEST_CASE("fragment: ESP from the engine decrypts after fragmentation and reassembly",
          "[fragment][esp]")
{
    const TransformCase &t = all_transforms()[0];
    for (int outer : {4, 6}) {
        for (Mode mode : {Mode::Tunnel, Mode::Transport}) {
            for (bool natt : {false, true}) {
                INFO("outer v" << outer << (mode == Mode::Tunnel ? " tunnel" : " transport")
                               << (natt ? " natt" : ""));
                bool tunnel = mode == Mode::Tunnel;
                SaConfig sa = make_sa(t, mode, outer, natt);
                const char *src = tunnel ? "10.1.0.1" : (outer == 4 ? "192.0.2.1" : "2001:db8::1");
                const char *dst = tunnel ? "10.2.0.1" : (outer == 4 ? "192.0.2.2" : "2001:db8::2");
                auto tx = make_engine(
                    sender(sa, tunnel ? "10.1.0.0/16" : src, tunnel ? "10.2.0.0/16" : dst));
                auto rx = make_engine(receiver(sa));
                Bytes plain = udp_packet(tunnel ? 4 : outer, src, dst, 3000);
                if (plain[0] >> 4 == 4) {
                    plain[6] = 0;  // DF clear: may be fragmented
                    ipv4_set_checksum(plain.data());
                }
                Frames fr(plain, 8);
                REQUIRE(run(*tx, fr.first) == Verdict::Encrypted);
                Bytes esp = fr.first.bytes();
                uint32_t n = fr.run(1280);
                REQUIRE(n == 3);
                Bytes whole = reassemble(esp, fr.fragments(n), 1280, kIpv6Len);
                REQUIRE(whole == esp);
                Frame back(whole);
                REQUIRE(run(*rx, back) == Verdict::Decrypted);
                CHECK(back.bytes() == plain);
            }
        }
    }
}
