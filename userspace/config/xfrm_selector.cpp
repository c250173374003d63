// Selectors, read and written, and the words SAs and policies share (mode, proto esp, dir).
#include "userspace/config/xfrm_selector.h"

#include <array>

namespace xesp::xfrm {

namespace {

struct ProtoName {
    std::string_view name;
    uint8_t number;
};

constexpr std::array<ProtoName, 18> kProtos{{
    {"icmp", 1},
    {"igmp", 2},
    {"ipencap", 4},
    {"tcp", 6},
    {"udp", 17},
    {"dccp", 33},
    {"ipv6", 41},
    {"rsvp", 46},
    {"gre", 47},
    {"esp", 50},
    {"ah", 51},
    {"ipv6-icmp", 58},
    {"ospf", 89},
    {"pim", 103},
    {"l2tp", 115},
    {"sctp", 132},
    {"mobility-header", 135},
    {"udplite", 136},
}};

bool has_ports(uint8_t proto)
{
    return proto == 6 || proto == 17 || proto == 33 || proto == 132 || proto == 136;
}

std::string proto_text(uint8_t p)
{
    for (const auto &e : kProtos)
        if (e.number == p)
            return std::string(e.name);
    return std::to_string(p);
}

Result<uint8_t> parse_upper_proto(Cursor &c)
{
    auto v = c.value("proto", "a protocol name or number");
    if (!v)
        return v.error();
    for (const auto &e : kProtos)
        if (*v == e.name)
            return e.number;
    auto n = to_number(*v, "proto", 255);
    if (!n)
        return c.fail("proto " + shown(*v) +
                      " is neither a number (0..255) nor a protocol name "
                      "(tcp, udp, icmp, ipv6-icmp, sctp, gre, esp...)");
    return uint8_t(*n);
}

}  // namespace

std::string_view dir_word(Dir d)
{
    switch (d) {
    case Dir::In:
        return "in";
    case Dir::Out:
        return "out";
    case Dir::Fwd:
        return "fwd";
    case Dir::Unspec:
        break;
    }
    return "unspec";
}

Result<bool> selector_word(Cursor &c, SelectorDraft &s, std::string_view w)
{
    if (w == "src" && !s.src) {
        XESP_SET(s.src, c.prefix("src"));
    } else if (w == "dst" && !s.dst) {
        XESP_SET(s.dst, c.prefix("dst"));
    } else if (w == "proto" && !s.proto) {
        XESP_SET(s.proto, parse_upper_proto(c));
        if (s.proto == 0)
            return c.fail("proto 0 means any protocol; leave proto out instead");
    } else if ((w == "sport" && !s.sport) || (w == "dport" && !s.dport)) {
        auto n = c.number(w, 65535);
        if (!n)
            return n.error();
        (w == "sport" ? s.sport : s.dport) = uint16_t(*n);
    } else if (w == "type" || w == "code" || w == "key") {
        return c.fail("selector '" + std::string(w) +
                      "' (ICMP type/code, GRE key) is not supported");
    } else {
        return false;
    }
    return true;
}

Result<Selector> finish_selector(const Cursor &c, const SelectorDraft &d, std::string_view what)
{
    if (!d.src && !d.dst)
        return c.fail(std::string(what) + " needs src PREFIX and dst PREFIX");
    Selector s;
    uint8_t family = d.src ? d.src->addr.family : d.dst->addr.family;
    auto any = [&] {
        Prefix p;
        p.addr.family = family;
        return p;
    };
    s.src = d.src ? *d.src : any();
    s.dst = d.dst ? *d.dst : any();
    if (s.src.addr.family != s.dst.addr.family)
        return c.fail(std::string(what) + " src " + s.src.str() + " and dst " + s.dst.str() +
                      " are of different families");
    s.proto = d.proto;
    if ((d.sport || d.dport) && !has_ports(d.proto))
        return c.fail(std::string(what) +
                      " sport/dport need proto tcp, udp, sctp, dccp or udplite" +
                      (d.proto ? " (not " + proto_text(d.proto) + ")" : std::string()));
    s.sport_set = d.sport.has_value();
    s.dport_set = d.dport.has_value();
    s.sport = d.sport.value_or(0);
    s.dport = d.dport.value_or(0);
    return s;
}

std::string format_selector(const Selector &s)
{
    std::string out = "src " + s.src.str() + " dst " + s.dst.str();
    if (s.proto)
        out += " proto " + proto_text(s.proto);
    if (s.sport_set)
        out += " sport " + std::to_string(s.sport);
    if (s.dport_set)
        out += " dport " + std::to_string(s.dport);
    return out;
}

Result<Mode> parse_mode(Cursor &c)
{
    auto v = c.value("mode", "tunnel or transport");
    if (!v)
        return v.error();
    if (*v == "tunnel")
        return Mode::Tunnel;
    if (*v == "transport")
        return Mode::Transport;
    if (*v == "beet" || *v == "ro" || *v == "in_trigger")
        return c.fail("mode " + std::string(*v) + " is not supported; use tunnel or transport");
    return c.fail("mode " + shown(*v) + " is not one of tunnel, transport");
}

Result<void> parse_xfrm_proto(Cursor &c)
{
    auto v = c.value("proto", "esp");
    if (!v)
        return v.error();
    if (*v == "esp")
        return {};
    if (*v == "ah" || *v == "comp" || *v == "route2" || *v == "hao")
        return c.fail("proto " + std::string(*v) + " is not supported; xesp does proto esp only");
    return c.fail("unknown proto " + shown(*v) + "; use proto esp");
}

}  // namespace xesp::xfrm
