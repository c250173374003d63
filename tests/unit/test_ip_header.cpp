// parse_ip() (userspace/base/ip_header.h): a table of IPv4 and IPv6 headers, good and bad, and
// every field the parse leaves for each.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "userspace/base/ip_header.h"
#include "userspace/esp/esp.h"

using namespace xesp;
using namespace xesp::wire;

namespace {

// An IPv4 packet: ihl 32-bit words of header (options zero), `payload` bytes behind it. The
// total length field says header + payload unless `total` is set; `pad` bytes of link-layer
// padding follow, or the last `cut` bytes are missing.
struct V4 {
    uint8_t ihl = 5;
    int total = -1;
    uint16_t frag = 0;
    uint8_t proto = kProtoUdp;
    uint32_t payload = 8;
    uint32_t pad = 0;
    uint32_t cut = 0;
    uint8_t version = 4;
};

std::vector<uint8_t> v4(const V4 &o)
{
    uint32_t hl = o.ihl * 4u;
    std::vector<uint8_t> v(std::max<uint32_t>(hl, 20) + o.payload + o.pad);
    v[0] = uint8_t(o.version << 4 | o.ihl);
    put16(&v[2], uint16_t(o.total >= 0 ? uint32_t(o.total) : hl + o.payload));
    put16(&v[6], o.frag);
    v[8] = 64;
    v[9] = o.proto;
    const uint8_t src[4] = {192, 0, 2, 1}, dst[4] = {198, 51, 100, 2};
    std::copy(src, src + 4, &v[12]);
    std::copy(dst, dst + 4, &v[16]);
    v.resize(v.size() - o.cut);
    return v;
}

// An IPv6 extension header: type and length in bytes; for a Fragment header (44, 8 bytes)
// the offset/M field.
struct Ext {
    uint8_t type;
    uint32_t len = 8;
    uint16_t frag = 0;
};

// An IPv6 packet with the extension headers exts, then proto and `payload` bytes. The payload
// length field is off by plen_delta from the truth; pad and cut as for v4().
std::vector<uint8_t> v6(const std::vector<Ext> &exts, uint8_t proto, uint32_t payload,
                        int plen_delta = 0, uint32_t pad = 0, uint32_t cut = 0)
{
    std::vector<uint8_t> v(kIpv6Len);
    v[0] = 0x60;
    v[6] = exts.empty() ? proto : exts[0].type;
    v[7] = 64;
    v[8] = 0x20, v[9] = 0x01, v[10] = 0x0d, v[11] = 0xb8, v[23] = 1;    // 2001:db8::1
    v[24] = 0x20, v[25] = 0x01, v[26] = 0x0d, v[27] = 0xb8, v[39] = 2;  // 2001:db8::2
    for (size_t i = 0; i < exts.size(); i++) {
        size_t at = v.size();
        v.resize(at + exts[i].len);
        v[at] = i + 1 < exts.size() ? exts[i + 1].type : proto;
        if (exts[i].type == kProtoIpv6Frag)
            put16(&v[at + 2], exts[i].frag);
        else
            v[at + 1] = uint8_t(exts[i].len / 8 - 1);
    }
    v.resize(v.size() + payload);
    put16(&v[4], uint16_t(int(v.size() - kIpv6Len) + plen_delta));
    v.resize(v.size() + pad);
    v.resize(v.size() - cut);
    return v;
}

// What parse_ip() returns and leaves in the IpHeader.
struct Want {
    IpParse st;
    uint8_t version, proto;
    uint32_t hdr_len, total, chain_len, nh_off, l4_off;
    bool fragment, mf, df;
    uint16_t frag_offset;
};

struct Case {
    const char *name;
    std::vector<uint8_t> pkt;
    Want want;
};

const char *name(IpParse s)
{
    switch (s) {
    case IpParse::NotIp:
        return "NotIp";
    case IpParse::BadHeader:
        return "BadHeader";
    case IpParse::BadLength:
        return "BadLength";
    case IpParse::BadChain:
        return "BadChain";
    case IpParse::BadFragment:
        return "BadFragment";
    case IpParse::Ok:
        return "Ok";
    }
    return "?";
}

constexpr uint8_t kHop = kProtoIpv6HopByHop, kRoute = kProtoIpv6Route, kOpts = kProtoIpv6Opts,
                  kFrag = kProtoIpv6Frag;
constexpr bool F = false, T = true;
constexpr IpParse kOk = IpParse::Ok;

}  // namespace

TEST_CASE("parse_ip: a table of IPv4 and IPv6 headers")
{
    const Want none{IpParse::NotIp, 0, 0, 0, 0, 0, 0, 0, F, F, F, 0};
    // clang-format off
    const std::vector<Case> cases = {
        // name                                   packet
        //   status, version, proto, hdr_len, total, chain_len, nh_off, l4_off, fragment, MF, DF, offset
        {"v4 UDP",                                 v4({}),
            {kOk, 4, kProtoUdp, 20, 28, 20, 9, 20, F, F, F, 0}},
        {"v4 with options",                        v4({.ihl = 6}),
            {kOk, 4, kProtoUdp, 24, 32, 24, 9, 24, F, F, F, 0}},
        {"v4 DF",                                  v4({.frag = kIpv4Df, .proto = kProtoEsp}),
            {kOk, 4, kProtoEsp, 20, 28, 20, 9, 20, F, F, T, 0}},
        {"v4 first fragment",                      v4({.frag = kIpv4Mf}),
            {kOk, 4, kProtoUdp, 20, 28, 20, 9, 20, T, T, F, 0}},
        {"v4 last fragment",                       v4({.frag = 185}),
            {kOk, 4, kProtoUdp, 20, 28, 20, 9, 20, T, F, F, 1480}},
        {"v4 with link-layer padding",             v4({.pad = 6}),
            {kOk, 4, kProtoUdp, 20, 28, 20, 9, 20, F, F, F, 0}},
        {"v4 header only",                         v4({.proto = kProtoNone, .payload = 0}),
            {kOk, 4, kProtoNone, 20, 20, 20, 9, 20, F, F, F, 0}},
        {"v4 IHL below 5",                         v4({.ihl = 4}),
            {IpParse::BadHeader, 4, kProtoUdp, 16, 24, 16, 9, 16, F, F, F, 0}},
        {"v4 options past the buffer",             v4({.ihl = 15, .payload = 0, .cut = 20}),
            {IpParse::BadHeader, 4, kProtoUdp, 60, 60, 60, 9, 60, F, F, F, 0}},
        {"v4 total length past the buffer",        v4({.cut = 1}),
            {IpParse::BadLength, 4, kProtoUdp, 20, 28, 20, 9, 20, F, F, F, 0}},
        {"v4 total length below the header",       v4({.total = 19}),
            {IpParse::BadLength, 4, kProtoUdp, 20, 19, 20, 9, 20, F, F, F, 0}},
        {"v4 shorter than its fixed header",       v4({.payload = 0, .cut = 1}),        none},
        {"version 5",                              v4({.version = 5}),                  none},
        {"empty",                                  {},                                  none},
        {"v6 UDP",                                 v6({}, kProtoUdp, 8),
            {kOk, 6, kProtoUdp, 40, 48, 40, 6, 40, F, F, T, 0}},
        {"v6 with link-layer padding",             v6({}, kProtoUdp, 8, 0, 10),
            {kOk, 6, kProtoUdp, 40, 48, 40, 6, 40, F, F, T, 0}},
        {"v6 hop-by-hop and fragment header",      v6({{kHop}, {kFrag, 8, 185 << 3 | 1}}, kProtoUdp, 8),
            {kOk, 6, kProtoUdp, 40, 64, 48, 40, 56, T, T, T, 1480}},
        {"v6 routing and destination options",     v6({{kRoute, 16}, {kOpts}}, kProtoTcp, 20),
            {kOk, 6, kProtoTcp, 40, 84, 64, 56, 64, F, F, T, 0}},
        {"v6 atomic fragment",                     v6({{kFrag}}, kProtoEsp, 8),
            {kOk, 6, kProtoEsp, 40, 56, 40, 6, 48, T, F, T, 0}},
        {"v6 last fragment behind options",        v6({{kOpts}, {kFrag, 8, 8}}, kProtoUdp, 0),
            {kOk, 6, kProtoUdp, 40, 56, 48, 40, 56, T, F, T, 8}},
        {"v6 extension header cut short",          v6({{kHop, 24}}, kProtoNone, 0, -8),
            {IpParse::BadChain, 6, kHop, 40, 56, 40, 6, 40, F, F, T, 0}},
        {"v6 extension header past the datagram, not the buffer",
                                                   v6({{kHop, 16}}, kProtoNone, 0, -8, 8),
            {IpParse::BadChain, 6, kHop, 40, 48, 40, 6, 40, F, F, T, 0}},
        {"v6 second extension header cut short",   v6({{kHop}, {kOpts}}, kProtoNone, 0, -4),
            {IpParse::BadChain, 6, kHop, 40, 52, 40, 6, 40, F, F, T, 0}},
        {"v6 fragment header cut short",           v6({{kFrag}}, kProtoUdp, 0, -4),
            {IpParse::BadFragment, 6, kFrag, 40, 44, 40, 6, 40, T, F, T, 0}},
        {"v6 payload length past the buffer",      v6({{kHop}}, kProtoUdp, 8, 0, 0, 1),
            {IpParse::BadLength, 6, kHop, 40, 56, 40, 6, 40, F, F, T, 0}},
        {"v6 shorter than its fixed header",       v6({}, kProtoNone, 0, 0, 0, 1),     none},
    };
    // clang-format on
    for (const Case &c : cases) {
        INFO(c.name);
        IpHeader h;
        IpParse st = parse_ip(c.pkt.data(), uint32_t(c.pkt.size()), &h);
        const Want &w = c.want;
        CHECK(std::string(name(st)) == name(w.st));
        CHECK(h.ip == c.pkt.data());
        CHECK(int(h.version) == w.version);
        CHECK(int(h.proto) == w.proto);
        CHECK(h.hdr_len == w.hdr_len);
        CHECK(h.total == w.total);
        CHECK(h.chain_len == w.chain_len);
        CHECK(h.nh_off == w.nh_off);
        CHECK(h.l4_off == w.l4_off);
        CHECK(h.fragment == w.fragment);
        CHECK(h.more_fragments == w.mf);
        CHECK(h.dont_fragment == w.df);
        CHECK(h.frag_offset == w.frag_offset);
        CHECK(header_ok(st) == (st != IpParse::NotIp && st != IpParse::BadHeader));
        CHECK(lengths_ok(st) ==
              (st == IpParse::Ok || st == IpParse::BadChain || st == IpParse::BadFragment));
        CHECK(chain_ok(st) == (st == IpParse::Ok || st == IpParse::BadFragment));
        if (h.version) {
            CHECK(h.src().str() == (h.version == 4 ? "192.0.2.1" : "2001:db8::1"));
            CHECK(h.dst().str() == (h.version == 4 ? "198.51.100.2" : "2001:db8::2"));
        }
    }
}

TEST_CASE("parse_ip: behind a first fragment's Fragment header the chain goes on; where it cannot "
          "be read, the protocol is not known")
{
    struct Row {
        const char *name;
        std::vector<uint8_t> pkt;
        uint8_t proto;
        uint32_t chain_len, l4_off;
        bool unknown;
    };
    // clang-format off
    const std::vector<Row> rows = {
        {"first fragment, destination options, TCP", v6({{kFrag, 8, 1}, {kOpts}}, kProtoTcp, 20),
            kProtoTcp, 40, 56, F},
        {"options, first fragment, options and routing, ICMPv6",
            v6({{kHop}, {kFrag, 8, 1}, {kOpts}, {kRoute, 16}}, kProtoIcmpv6, 8),
            kProtoIcmpv6, 48, 80, F},
        {"later fragment naming destination options",
            v6({{kFrag, 8, 185 << 3 | 1}, {kOpts}}, kProtoTcp, 20), kOpts, 40, 48, T},
        {"later fragment naming UDP",                 v6({{kFrag, 8, 185 << 3 | 1}}, kProtoUdp, 8),
            kProtoUdp, 40, 48, F},
        {"first fragment, options past the datagram",
            v6({{kFrag, 8, 1}, {kOpts, 32}}, kProtoTcp, 0, -24), kOpts, 40, 48, T},
        {"first fragment, options header cut short",  v6({{kFrag, 8, 1}}, kOpts, 4),
            kOpts, 40, 48, T},
        {"first fragment, a second Fragment header",
            v6({{kFrag, 8, 1}, {kFrag, 8, 0}}, kProtoUdp, 8), kFrag, 40, 48, T},
        {"atomic fragment, UDP",                      v6({{kFrag}}, kProtoUdp, 8),
            kProtoUdp, 40, 48, F},
    };
    // clang-format on
    for (const Row &r : rows) {
        INFO(r.name);
        IpHeader h;
        REQUIRE(std::string(name(parse_ip(r.pkt.data(), uint32_t(r.pkt.size()), &h))) == "Ok");
        CHECK(h.fragment);
        CHECK(int(h.proto) == r.proto);
        CHECK(h.chain_len == r.chain_len);
        CHECK(h.l4_off == r.l4_off);
        CHECK(h.proto_unknown == r.unknown);
        FlowKey f;
        flow_from_header(h, &f);
        CHECK(f.proto_unknown == r.unknown);
        CHECK(f.fragment);
        CHECK(f.sport == 0);
    }
}

TEST_CASE("parse_flow: the ports of TCP, UDP, SCTP, UDP-Lite and DCCP, and of no other protocol")
{
    for (uint8_t proto :
         {kProtoTcp, kProtoUdp, kProtoSctp, kProtoUdpLite, kProtoDccp, kProtoEsp, uint8_t(47)}) {
        INFO(int(proto));
        auto pkt = v4({.proto = proto, .payload = 16});
        put16(&pkt[20], 40000);
        put16(&pkt[22], 5000);
        FlowKey f;
        REQUIRE(parse_flow(pkt.data(), uint32_t(pkt.size()), &f));
        const bool ports = proto != kProtoEsp && proto != 47;
        CHECK(f.sport == (ports ? 40000 : 0));
        CHECK(f.dport == (ports ? 5000 : 0));
        CHECK_FALSE(f.proto_unknown);
    }
}

TEST_CASE("parse_ip: every prefix of a packet parses or fails, reading nothing past its end")
{
    // Under AddressSanitizer a read past the copy is caught.
    const auto packets = {v4({.ihl = 7}), v6({{kHop}, {kRoute, 24}, {kFrag, 8, 1}}, kProtoUdp, 8)};
    for (const auto &pkt : packets) {
        for (size_t n = 0; n <= pkt.size(); n++) {
            std::vector<uint8_t> cut(pkt.begin(), pkt.begin() + n);
            IpHeader h;
            IpParse st = parse_ip(cut.data(), uint32_t(n), &h);
            INFO(n << " of " << pkt.size() << " bytes: " << name(st));
            CHECK((st == IpParse::Ok) == (n == pkt.size()));
            if (lengths_ok(st))
                CHECK(h.total <= n);
        }
    }
}
