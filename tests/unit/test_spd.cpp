// The SPD's tuple-space lookup (userspace/esp/spd.h) against the walk in priority order that
// defines it: hand-picked cases, then random policies and packets from a small address space,
// so that prefixes overlap, priorities tie and port policies shadow fragments.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "esp_fixture.h"
#include "userspace/esp/spd.h"

using namespace xesp;
using namespace xesp::test;

namespace {

// A policy that protects (has a template), any protocol and port.
PolicyConfig policy(Dir dir, const char *src, const char *dst, uint32_t priority)
{
    PolicyConfig p;
    p.dir = dir;
    p.sel.src = pfx(src);
    p.sel.dst = pfx(dst);
    p.priority = priority;
    p.tmpl = PolicyTmpl{};
    return p;
}

// The same for one protocol and destination port; `protect` false: it allows, no template.
PolicyConfig port_policy(PolicyConfig p, uint8_t proto, uint16_t dport, bool protect)
{
    p.sel.proto = proto;
    p.sel.dport_set = true;
    p.sel.dport = dport;
    if (!protect)
        p.tmpl.reset();
    return p;
}

FlowKey flow(const char *src, const char *dst, uint8_t proto, uint16_t dport, bool fragment = false)
{
    FlowKey f;
    f.src = addr(src);
    f.dst = addr(dst);
    f.proto = proto;
    f.sport = fragment ? 0 : 1000;
    f.dport = fragment ? 0 : dport;
    f.fragment = fragment;
    return f;
}

}  // namespace

TEST_CASE("SPD lookup: priority, then the order added; longer prefixes do not win by length",
          "[spd]")
{
    Spd spd;
    uint32_t wide = spd.add(policy(Dir::Out, "10.0.0.0/8", "0.0.0.0/0", 10));
    spd.add(policy(Dir::Out, "10.1.0.0/16", "10.2.0.0/16", 20));  // narrower, lower priority
    spd.add(policy(Dir::Out, "10.1.0.0/16", "10.2.0.0/16", 10));  // same priority, added later
    uint32_t web =
        spd.add(port_policy(policy(Dir::Out, "10.1.0.0/16", "10.2.0.0/16", 5), 6, 80, false));
    uint32_t v6 = spd.add(policy(Dir::Out, "fd01::/48", "fd02::/48", 1));
    spd.add(policy(Dir::In, "0.0.0.0/0", "0.0.0.0/0", 0));

    CHECK(spd.lookup(Dir::Out, flow("10.1.0.2", "10.2.0.2", 17, 53)) == spd.by_id(wide));
    CHECK(spd.lookup(Dir::Out, flow("10.1.0.2", "10.2.0.2", 6, 80)) == spd.by_id(web));
    CHECK(spd.lookup(Dir::Out, flow("10.1.0.2", "192.0.2.1", 6, 80)) == spd.by_id(wide));
    CHECK(spd.lookup(Dir::Out, flow("fd01::2", "fd02::2", 6, 80)) == spd.by_id(v6));
    CHECK(spd.lookup(Dir::Out, flow("192.0.2.1", "10.2.0.2", 6, 80)) == nullptr);
    CHECK(spd.lookup(Dir::Fwd, flow("10.1.0.2", "10.2.0.2", 6, 80)) == nullptr);

    // A fragment cannot match the port policy; a blocking or protecting port policy that
    // would have come first makes it unsure.
    bool unsure = false;
    CHECK(spd.lookup(Dir::Out, flow("10.1.0.2", "10.2.0.2", 6, 0, true), &unsure) ==
          spd.by_id(wide));
    CHECK_FALSE(unsure);  // the web policy allows: no doubt
    Spd strict;
    strict.add(port_policy(policy(Dir::Out, "10.1.0.0/16", "10.2.0.0/16", 5), 6, 443, true));
    uint32_t rest = strict.add(policy(Dir::Out, "10.0.0.0/8", "10.0.0.0/8", 10));
    unsure = false;
    CHECK(strict.lookup(Dir::Out, flow("10.1.0.2", "10.2.0.2", 6, 0, true), &unsure) ==
          strict.by_id(rest));
    CHECK(unsure);
    unsure = false;
    CHECK(strict.lookup(Dir::Out, flow("10.1.0.2", "10.2.0.2", 17, 0, true), &unsure) ==
          strict.by_id(rest));
    CHECK_FALSE(unsure);  // other protocol: the port policy is no shadow
    CHECK(strict.shapes(Dir::Out) == 2);
}

TEST_CASE("SPD lookup agrees with the walk in priority order on random policies", "[spd]")
{
    std::mt19937 rng(4301);
    auto pick = [&](uint32_t n) { return uint32_t(rng() % n); };
    // A small universe, so that prefixes nest and collide: 10.a.b.c with a, b, c < 4.
    auto v4 = [&] {
        return "10." + std::to_string(pick(4)) + "." + std::to_string(pick(4)) + "." +
               std::to_string(pick(4));
    };
    const uint8_t lens[] = {0, 8, 16, 24, 32};
    const uint8_t protos[] = {0, 6, 17};
    for (int round = 0; round < 20; round++) {
        Spd spd;
        size_t n = 1 + pick(300);
        for (size_t i = 0; i < n; i++) {
            PolicyConfig p;
            p.dir = Dir(1 + pick(3));
            p.sel.src = *Prefix::parse(v4() + "/" + std::to_string(lens[pick(5)]));
            p.sel.dst = *Prefix::parse(v4() + "/" + std::to_string(lens[pick(5)]));
            p.sel.proto = protos[pick(3)];
            if (p.sel.proto && pick(2)) {
                p.sel.dport_set = true;
                p.sel.dport = uint16_t(1 + pick(3));
            }
            if (p.sel.proto && !pick(4)) {
                p.sel.sport_set = true;
                p.sel.sport = uint16_t(1000 + pick(2));
            }
            p.priority = pick(4) * 100;
            if (pick(3) == 0)
                p.action = Action::Block;
            else if (pick(2))
                p.tmpl = PolicyTmpl{};
            spd.add(p);
        }
        for (int k = 0; k < 2000; k++) {
            FlowKey f;
            f.src = addr(v4().c_str());
            f.dst = addr(v4().c_str());
            f.proto = protos[pick(3)];
            f.fragment = pick(5) == 0;
            f.sport = f.fragment ? 0 : uint16_t(1000 + pick(2));
            f.dport = f.fragment ? 0 : uint16_t(1 + pick(3));
            for (Dir d : {Dir::In, Dir::Out, Dir::Fwd}) {
                bool unsure = false, unsure_linear = false;
                const PolicyConfig *got = spd.lookup(d, f, &unsure);
                const PolicyConfig *want = spd.lookup_linear(d, f, &unsure_linear);
                INFO("round " << round << " flow " << f.src.str() << " -> " << f.dst.str()
                              << " proto " << int(f.proto) << " ports " << f.sport << "/" << f.dport
                              << (f.fragment ? " fragment" : ""));
                REQUIRE(got == want);
                REQUIRE(unsure == unsure_linear);
                // With the hashes of a prefetch (more shapes than it keeps, often), and with
                // those of another direction's, which must not be used.
                Spd::Probe probe, other;
                spd.prefetch(d, f, &probe);
                spd.prefetch(d == Dir::Out ? Dir::In : Dir::Out, f, &other);
                bool unsure_probe = false, unsure_other = false;
                REQUIRE(spd.lookup(d, f, &unsure_probe, probe) == want);
                REQUIRE(unsure_probe == unsure_linear);
                REQUIRE(spd.lookup(d, f, &unsure_other, other) == want);
                REQUIRE(unsure_other == unsure_linear);
            }
        }
    }
}

TEST_CASE("SPD: a policy's flow link comes with it, by id and by lookup, as its cell changes",
          "[spd]")
{
    // Selectors that differ only in host bits beyond their prefix share one cell: the best
    // policy inline, the others beside it. Spd only keeps the links; it never reads them.
    int flow_a = 0, flow_b = 0, flow_c = 0;
    const auto *a = reinterpret_cast<const OutFlow *>(&flow_a);
    const auto *b = reinterpret_cast<const OutFlow *>(&flow_b);
    const auto *c = reinterpret_cast<const OutFlow *>(&flow_c);
    auto put = [](Spd &spd, uint32_t id, const char *src_host, uint32_t priority,
                  const OutFlow *link) {
        PolicyConfig p = policy(Dir::Out, "10.1.0.0/16", "10.2.0.0/16", priority);
        p.sel.src = Prefix{addr(src_host), 16};
        spd.put(id, id, std::make_shared<const PolicyConfig>(p), link);
    };
    const FlowKey f = flow("10.1.7.7", "10.2.7.7", 17, 53);
    auto linked = [&](const Spd &spd) {
        const OutFlow *link = nullptr;
        Spd::Probe probe;
        spd.prefetch(Dir::Out, f, &probe);
        bool unsure = false;
        const PolicyConfig *pol = spd.lookup(Dir::Out, f, &unsure, probe, &link);
        REQUIRE(pol);
        return std::pair{pol->priority, link};
    };
    Spd spd;
    put(spd, 1, "10.1.0.1", 200, a);
    put(spd, 2, "10.1.0.2", 100, b);  // better: takes the inline place, `a` goes beside it
    put(spd, 3, "10.1.0.3", 300, c);
    CHECK(linked(spd) == std::pair{100u, b});
    CHECK(spd.link_of(1) == a);
    CHECK(spd.link_of(2) == b);

    spd.remove(2);  // the best of those beside it comes up with its own link
    CHECK(linked(spd) == std::pair{200u, a});
    spd.remove(1);
    CHECK(linked(spd) == std::pair{300u, c});

    put(spd, 3, "10.1.0.3", 300, nullptr);  // the same policy put again without a link
    CHECK(linked(spd) == std::pair{300u, static_cast<const OutFlow *>(nullptr)});
    CHECK(spd.link_of(3) == nullptr);
}

TEST_CASE("SPD: a fragment whose protocol is not known is unsure where a policy that names one "
          "ranks first",
          "[spd]")
{
    Spd spd;
    PolicyConfig icmp = policy(Dir::Out, "fd00:1::/48", "::/0", 150);
    icmp.sel.proto = 58;
    icmp.tmpl.reset();
    icmp.action = Action::Block;
    spd.add(icmp);
    const PolicyConfig *site =
        spd.by_id(spd.add(policy(Dir::Out, "fd00:1::/48", "fd00:2::/48", 100)));
    spd.add(port_policy(policy(Dir::Out, "::/0", "::/0", 200), 17, 53, false));
    auto check = [&](FlowKey f, const PolicyConfig *want, bool want_unsure) {
        bool unsure = false, unsure_linear = false;
        CHECK(spd.lookup(Dir::Out, f, &unsure) == want);
        CHECK(spd.lookup_linear(Dir::Out, f, &unsure_linear) == want);
        CHECK(unsure == want_unsure);
        CHECK(unsure_linear == want_unsure);
    };
    FlowKey f = flow("fd00:1::5", "fd00:2::7", 60, 0, true);
    f.proto_unknown = true;
    check(f, site, false);  // a policy of any protocol ranks before every one that names one
    f.dst = addr("fd00:9::7");
    check(f, nullptr, true);  // the ICMPv6 block may be about it
    f.proto_unknown = false;
    check(f, nullptr, false);  // protocol 60 is known: nothing is about it
    FlowKey v4 = flow("10.1.0.5", "10.9.0.7", 60, 0, true);
    v4.proto_unknown = true;
    check(v4, nullptr, false);  // the policies that name a protocol are all IPv6
}
