// Engine::change(): SAs and policies changed in place, at the cost of the change, while
// readers run packets (rcu.h, engine.h). Checked against an engine built afresh from the same
// configuration, against the linear definition of the SPD, and with reader threads under
// ThreadSanitizer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "tests/unit/esp_fixture.h"

using namespace xesp;
using namespace xesp::test;

namespace {

const TransformCase &gcm()
{
    return all_transforms()[0];
}

// Tunnel i: an out SA (spi 0x10000 + i, or + `gen` << 20 after a rekey) and its out policy
// 10.<i>.0.0/16 -> 10.200.<i>.0/24.
SaConfig tunnel_sa(int i, uint32_t gen = 0)
{
    SaConfig sa = make_sa(gcm(), Mode::Tunnel, 4);
    sa.spi = 0x10000 + uint32_t(i) + (gen << 20);
    sa.reqid = uint32_t(i + 1);
    sa.dir = Dir::Out;
    std::vector<uint8_t> key(sa.xf.enc_key.data(), sa.xf.enc_key.data() + sa.xf.enc_key.size());
    key[0] = uint8_t(i + gen);  // keys of their own
    sa.xf.enc_key = KeyBytes(key.data(), key.size());
    return sa;
}

PolicyConfig tunnel_policy(int i, uint32_t priority = 100)
{
    PolicyConfig p;
    p.sel.src = pfx(("10." + std::to_string(i) + ".0.0/16").c_str());
    p.sel.dst = pfx(("10.200." + std::to_string(i) + ".0/24").c_str());
    p.dir = Dir::Out;
    p.priority = priority;
    p.tmpl = tmpl_for(tunnel_sa(i));
    return p;
}

FlowKey flow_to(int i, int host = 1)
{
    FlowKey f;
    f.src = addr(("10." + std::to_string(i) + ".0.1").c_str());
    f.dst = addr(("10.200." + std::to_string(i) + "." + std::to_string(host)).c_str());
    f.proto = 17;
    f.sport = 1000;
    f.dport = 2000;
    return f;
}

std::unique_ptr<Engine> empty_engine(Qsbr *readers = nullptr)
{
    auto e = Engine::create(Config{}, Backend::Auto, {}, nullptr, readers);
    REQUIRE(e);
    return std::move(*e);
}

// The SPI of an ESP packet behind its outer IPv4 or IPv6 header.
uint32_t outer_spi(const Pkt &p)
{
    return wire::get32(p.ip() + (wire::ip_version(p.ip()) == 4 ? wire::kIpv4Len : wire::kIpv6Len));
}

// The SA an out packet of tunnel i is encrypted with: its SPI, or 0.
uint32_t spi_for(Engine &e, int i)
{
    Frame f(udp_packet(4, ("10." + std::to_string(i) + ".0.1").c_str(),
                       ("10.200." + std::to_string(i) + ".1").c_str(), 32));
    if (run(e, f) != Verdict::Encrypted)
        return 0;
    return outer_spi(f.pkt);
}

// The ESP sequence number of the next packet tunnel 1 sends.
uint32_t next_seq(Engine &e)
{
    Frame f(udp_packet(4, "10.1.0.1", "10.200.1.1", 32));
    REQUIRE(run(e, f) == Verdict::Encrypted);
    return wire::get32(f.pkt.ip() + 24);
}

}  // namespace

TEST_CASE("changes in place agree with an engine built afresh", "[engine][change]")
{
    std::mt19937 rng(7);
    auto e = empty_engine();
    std::map<int, SaConfig> sas;           // by tunnel
    std::map<int, PolicyConfig> policies;  // by tunnel
    for (int round = 0; round < 300; round++) {
        EngineChange ch;
        std::map<int, bool> touched;
        int n = 1 + int(rng() % 4);
        for (int k = 0; k < n; k++) {
            int i = int(rng() % 40);
            if (touched[i])
                continue;
            touched[i] = true;
            switch (rng() % 4) {
            case 0:  // add or rekey in place
                ch.put_sas.push_back(tunnel_sa(i, rng() % 3));
                if (sas.count(i) && sas[i].spi != ch.put_sas.back().spi)
                    ch.del_sas.push_back(SaKey{sas[i].dst, sas[i].spi});
                sas[i] = ch.put_sas.back();
                break;
            case 1:
                if (sas.count(i)) {
                    ch.del_sas.push_back(SaKey{sas[i].dst, sas[i].spi});
                    sas.erase(i);
                }
                break;
            case 2:
                ch.put_policies.push_back(tunnel_policy(i, 100 + rng() % 3));
                policies[i] = ch.put_policies.back();
                break;
            case 3:
                if (policies.count(i)) {
                    ch.del_policies.push_back(PolicyKey{policies[i].sel, policies[i].dir});
                    policies.erase(i);
                }
                break;
            }
        }
        REQUIRE(e->change(ch, Backend::Auto));
        if (round % 30 != 29)
            continue;
        Config c;
        for (auto &[i, sa] : sas)
            c.sas.push_back(sa);
        for (auto &[i, p] : policies)
            c.policies.push_back(p);
        auto fresh = make_engine(c);
        REQUIRE(e->sas().size() == sas.size());
        REQUIRE(e->policy_count() == policies.size());
        for (int i = 0; i < 40; i++) {
            FlowKey f = flow_to(i);
            CAPTURE(round, i);
            CHECK(e->spd().lookup(Dir::Out, f) == e->spd().lookup_linear(Dir::Out, f));
            const PolicyConfig *a = e->spd().lookup(Dir::Out, f);
            const PolicyConfig *b = fresh->spd().lookup(Dir::Out, f);
            REQUIRE((a == nullptr) == (b == nullptr));
            if (a)
                CHECK(same_policy(*a, *b));
            uint32_t want = sas.count(i) && policies.count(i) ? sas[i].spi : 0;
            CHECK(spi_for(*e, i) == want);
        }
    }
}

TEST_CASE("make-before-break: the new SA carries a flow from the moment it is added",
          "[engine][change]")
{
    auto e = empty_engine();
    EngineChange first;
    first.put_sas.push_back(tunnel_sa(1));
    first.put_policies.push_back(tunnel_policy(1));
    REQUIRE(e->change(first, Backend::Auto));
    CHECK(spi_for(*e, 1) == tunnel_sa(1).spi);

    EngineChange add_new;  // same flow and reqid, another SPI and key
    add_new.put_sas.push_back(tunnel_sa(1, 1));
    REQUIRE(e->change(add_new, Backend::Auto));
    CHECK(spi_for(*e, 1) == tunnel_sa(1, 1).spi);

    EngineChange del_old;
    del_old.del_sas.push_back(SaKey{tunnel_sa(1).dst, tunnel_sa(1).spi});
    REQUIRE(e->change(del_old, Backend::Auto));
    CHECK(spi_for(*e, 1) == tunnel_sa(1, 1).spi);
    CHECK(e->sas().size() == 1);

    SECTION("deleting the newest brings back none, not a stale one")
    {
        EngineChange del_new;
        del_new.del_sas.push_back(SaKey{tunnel_sa(1, 1).dst, tunnel_sa(1, 1).spi});
        REQUIRE(e->change(del_new, Backend::Auto));
        CHECK(spi_for(*e, 1) == 0);
    }
    SECTION("an unknown SA to delete is an error and changes nothing")
    {
        EngineChange bad;
        bad.put_sas.push_back(tunnel_sa(2));
        bad.del_sas.push_back(SaKey{tunnel_sa(9).dst, tunnel_sa(9).spi});
        CHECK_FALSE(e->change(bad, Backend::Auto));
        CHECK(e->sas().size() == 1);
        CHECK(e->sas().find_in(tunnel_sa(2).dst, tunnel_sa(2).spi) == nullptr);
    }
}

namespace {

// The SA a packet of tunnel i is encrypted with when the classifier names its out policy
// `id` (the gateway's path, through the policy's link): its SPI, or 0 and the drop.
uint32_t spi_classified(Engine &e, uint32_t id, int i, Drop *drop = nullptr)
{
    Frame f(udp_packet(4, ("10." + std::to_string(i) + ".0.1").c_str(),
                       ("10.200." + std::to_string(i) + ".1").c_str(), 32));
    Pkt *p = &f.pkt;
    Classified c{Classified::Encap, id, wire::kIpv4Len, false};
    e.process_classified(&p, &c, 1);
    if (drop)
        *drop = f.pkt.verdict == Verdict::Drop ? f.pkt.drop : Drop{};
    return f.pkt.verdict == Verdict::Encrypted ? outer_spi(f.pkt) : 0;
}

// The SPI of the SA the template of tunnel i's policy finds by hash (SaTable::find_out, the
// path of templates that leave an address to the packet), or 0.
uint32_t spi_by_hash(Engine &e, int i)
{
    const Sa *sa = e.sas().find_out(*tunnel_policy(i).tmpl, FlowKey{});
    return sa ? sa->config().spi : 0;
}

uint32_t put_policy(Engine &e, const PolicyConfig &p)
{
    EngineChange ch;
    ch.put_policies.push_back(p);
    auto prepared = e.prepare(ch, Backend::Auto);
    REQUIRE(prepared);
    REQUIRE(prepared->policy_puts.size() == 1);
    uint32_t id = prepared->policy_puts[0].id;
    e.commit(std::move(*prepared));
    return id;
}

void change(Engine &e, std::vector<SaConfig> put, std::vector<SaConfig> del = {})
{
    EngineChange ch;
    ch.put_sas = std::move(put);
    for (const SaConfig &sa : del)
        ch.del_sas.push_back(SaKey{sa.dst, sa.spi});
    REQUIRE(e.change(ch, Backend::Auto));
}

}  // namespace

TEST_CASE("a classified packet goes from its policy to its flow's newest SA through rekeys",
          "[engine][change]")
{
    auto e = empty_engine();
    Drop drop{};

    // The policy first: linked to a flow with no SA yet, it fails closed.
    const uint32_t id = put_policy(*e, tunnel_policy(1));
    CHECK(spi_classified(*e, id, 1, &drop) == 0);
    CHECK(drop == Drop::OutNoStates);
    CHECK(e->sas().flows() == 1);

    change(*e, {tunnel_sa(1)});
    CHECK(spi_classified(*e, id, 1) == tunnel_sa(1).spi);
    CHECK(spi_for(*e, 1) == tunnel_sa(1).spi);  // the SPD's lookup, linked too
    CHECK(spi_by_hash(*e, 1) == tunnel_sa(1).spi);

    change(*e, {tunnel_sa(1, 1)});  // make
    CHECK(spi_classified(*e, id, 1) == tunnel_sa(1, 1).spi);
    CHECK(spi_by_hash(*e, 1) == tunnel_sa(1, 1).spi);
    change(*e, {}, {tunnel_sa(1)});  // break
    CHECK(spi_classified(*e, id, 1) == tunnel_sa(1, 1).spi);
    CHECK(spi_for(*e, 1) == tunnel_sa(1, 1).spi);
    CHECK(spi_by_hash(*e, 1) == tunnel_sa(1, 1).spi);

    SECTION("the last SA gone, the link fails closed and no SA comes back")
    {
        change(*e, {}, {tunnel_sa(1, 1)});
        CHECK(spi_classified(*e, id, 1, &drop) == 0);
        CHECK(drop == Drop::OutNoStates);
        CHECK(e->sas().flows() == 1);  // kept for the policy
        change(*e, {tunnel_sa(1, 2)});
        CHECK(spi_classified(*e, id, 1) == tunnel_sa(1, 2).spi);
    }
    SECTION("a policy updated to another template follows the new flow")
    {
        change(*e, {tunnel_sa(3)});
        PolicyConfig p = tunnel_policy(1);
        p.tmpl = tmpl_for(tunnel_sa(3));
        CHECK(put_policy(*e, p) == id);  // same selector: in place
        CHECK(spi_classified(*e, id, 1) == tunnel_sa(3).spi);
        CHECK(spi_for(*e, 1) == tunnel_sa(3).spi);
        change(*e, {}, {tunnel_sa(1, 1)});
        CHECK(spi_classified(*e, id, 1) == tunnel_sa(3).spi);
        // Tunnel 3's flow and the one of any reqid between the same gateways; tunnel 1's,
        // without SA or link, is gone.
        CHECK(e->sas().flows() == 2);
    }
    SECTION("two policies linked to one flow: it stays until both are gone")
    {
        PolicyConfig other = tunnel_policy(1);
        other.sel.dst = pfx("10.201.1.0/24");
        const uint32_t id2 = put_policy(*e, other);
        CHECK(spi_classified(*e, id2, 1) == tunnel_sa(1, 1).spi);
        EngineChange ch;
        ch.del_policies.push_back(PolicyKey{tunnel_policy(1).sel, Dir::Out});
        ch.del_sas.push_back(SaKey{tunnel_sa(1, 1).dst, tunnel_sa(1, 1).spi});
        REQUIRE(e->change(ch, Backend::Auto));
        CHECK(e->sas().flows() == 1);  // the other policy's
        CHECK(spi_classified(*e, id2, 1, &drop) == 0);
        CHECK(drop == Drop::OutNoStates);
        change(*e, {tunnel_sa(1, 2)});
        CHECK(spi_classified(*e, id2, 1) == tunnel_sa(1, 2).spi);
        EngineChange last;
        last.del_policies.push_back(PolicyKey{other.sel, Dir::Out});
        last.del_sas.push_back(SaKey{tunnel_sa(1, 2).dst, tunnel_sa(1, 2).spi});
        REQUIRE(e->change(last, Backend::Auto));
        CHECK(e->sas().flows() == 0);
    }
    SECTION("a policy turned to block in place lets go of its flow and blocks")
    {
        PolicyConfig block = tunnel_policy(1);
        block.action = Action::Block;
        block.tmpl.reset();
        CHECK(put_policy(*e, block) == id);
        CHECK(spi_classified(*e, id, 1, &drop) == 0);
        CHECK(drop == Drop::OutPolBlock);
        change(*e, {}, {tunnel_sa(1, 1)});
        CHECK(e->sas().flows() == 0);
    }
    SECTION("with the policy and its SAs gone, no flow is left")
    {
        EngineChange ch;
        ch.del_policies.push_back(PolicyKey{tunnel_policy(1).sel, Dir::Out});
        ch.del_sas.push_back(SaKey{tunnel_sa(1, 1).dst, tunnel_sa(1, 1).spi});
        REQUIRE(e->change(ch, Backend::Auto));
        CHECK(e->sas().flows() == 0);
        CHECK(e->policy_by_id(id) == nullptr);
    }
}

TEST_CASE("links: IPv6 gateways, a template of any reqid, one whose mode its flow's SAs lack",
          "[engine][change]")
{
    auto e = empty_engine();
    Drop drop{};

    SECTION("IPv6 gateways: linked as IPv4 ones are, through a rekey")
    {
        auto v6_sa = [](uint32_t gen) {
            SaConfig sa = tunnel_sa(1, gen);
            SaConfig six = make_sa(gcm(), Mode::Tunnel, 6);
            sa.src = six.src;
            sa.dst = six.dst;
            return sa;
        };
        PolicyConfig p = tunnel_policy(1);
        p.tmpl = tmpl_for(v6_sa(0));
        const uint32_t id = put_policy(*e, p);
        CHECK(spi_classified(*e, id, 1, &drop) == 0);
        CHECK(drop == Drop::OutNoStates);
        change(*e, {v6_sa(0)});
        CHECK(spi_classified(*e, id, 1) == v6_sa(0).spi);
        CHECK(spi_for(*e, 1) == v6_sa(0).spi);
        change(*e, {v6_sa(1)});  // make
        CHECK(spi_classified(*e, id, 1) == v6_sa(1).spi);
        change(*e, {}, {v6_sa(0)});  // break
        CHECK(spi_classified(*e, id, 1) == v6_sa(1).spi);
        CHECK(spi_for(*e, 1) == v6_sa(1).spi);
        EngineChange ch;
        ch.del_policies.push_back(PolicyKey{p.sel, Dir::Out});
        ch.del_sas.push_back(SaKey{v6_sa(1).dst, v6_sa(1).spi});
        REQUIRE(e->change(ch, Backend::Auto));
        CHECK(e->sas().flows() == 0);
    }
    SECTION("reqid 0: the newest SA between the gateways, whatever its reqid")
    {
        PolicyConfig p = tunnel_policy(1);
        p.tmpl->reqid = 0;
        const uint32_t id = put_policy(*e, p);
        change(*e, {tunnel_sa(2)});  // another tunnel's reqid, between the same gateways
        CHECK(spi_classified(*e, id, 1) == tunnel_sa(2).spi);
        CHECK(spi_for(*e, 1) == tunnel_sa(2).spi);
        change(*e, {tunnel_sa(1)});  // newer, with the lower SPI and reqid: it takes over
        CHECK(spi_classified(*e, id, 1) == tunnel_sa(1).spi);
        CHECK(spi_for(*e, 1) == tunnel_sa(1).spi);
        const Sa *by_hash = e->sas().find_out(*p.tmpl, FlowKey{});
        REQUIRE(by_hash);
        CHECK(by_hash->config().spi == tunnel_sa(1).spi);
        change(*e, {}, {tunnel_sa(1)});
        CHECK(spi_classified(*e, id, 1) == tunnel_sa(2).spi);
    }
    SECTION("a transport template naming both addresses does not take their tunnel SA")
    {
        PolicyConfig p = tunnel_policy(1);
        p.tmpl->mode = Mode::Transport;  // addresses kept: linked to the tunnel SA's flow
        const uint32_t id = put_policy(*e, p);
        change(*e, {tunnel_sa(1)});
        CHECK(spi_classified(*e, id, 1, &drop) == 0);
        CHECK(drop == Drop::OutNoStates);
        CHECK(spi_for(*e, 1) == 0);
    }
}

TEST_CASE("make-before-break: a new SA still held leaves the flow to the one before it",
          "[engine][change]")
{
    EngineOptions o;
    o.hold_new = true;  // as the daemon with a state file
    auto made = Engine::create(Config{}, Backend::Auto, o);
    REQUIRE(made);
    Engine &e = **made;
    change(e, {tunnel_sa(1)});
    const uint32_t id = put_policy(e, tunnel_policy(1));
    CHECK(spi_for(e, 1) == 0);  // held: out-seq-unreserved
    Sa *old = e.sas().find_in(tunnel_sa(1).dst, tunnel_sa(1).spi);
    old->bind_reservation(0);
    old->reserve_to(1000);
    CHECK(spi_for(e, 1) == tunnel_sa(1).spi);

    EngineChange add_new;
    add_new.put_sas.push_back(tunnel_sa(1, 1));
    REQUIRE(e.change(add_new, Backend::Auto));
    CHECK(spi_for(e, 1) == tunnel_sa(1).spi);  // not dropped while the new one is held
    CHECK(spi_classified(e, id, 1) == tunnel_sa(1).spi);
    CHECK(spi_by_hash(e, 1) == tunnel_sa(1).spi);
    Sa *fresh = e.sas().find_in(tunnel_sa(1, 1).dst, tunnel_sa(1, 1).spi);
    fresh->bind_reservation(0);
    fresh->reserve_to(1000);
    CHECK(spi_for(e, 1) == tunnel_sa(1, 1).spi);
    CHECK(spi_classified(e, id, 1) == tunnel_sa(1, 1).spi);
}

TEST_CASE("an SA updated under the same keys continues its sequence numbers", "[engine][change]")
{
    auto e = empty_engine();
    EngineChange first;
    first.put_sas.push_back(tunnel_sa(1));
    first.put_policies.push_back(tunnel_policy(1));
    REQUIRE(e->change(first, Backend::Auto));
    uint32_t id = e->sa_id(*e->sas().find_in(tunnel_sa(1).dst, tunnel_sa(1).spi));
    for (int k = 0; k < 5; k++)
        REQUIRE(spi_for(*e, 1) != 0);

    EngineChange update;
    SaConfig limited = tunnel_sa(1);
    limited.lifetime.hard_packets = 1000;
    update.put_sas.push_back(limited);
    REQUIRE(e->change(update, Backend::Auto));
    Sa *now = e->sas().find_in(limited.dst, limited.spi);
    REQUIRE(now);
    CHECK(now->config().lifetime.hard_packets == 1000);
    CHECK(e->sa_id(*now) == id);  // in place: the classifier's id stays
    CHECK(next_seq(*e) == 6);     // not 1: never a nonce twice under one key

    SECTION("updated twice before a packet: the second still continues the first's numbers")
    {
        for (uint64_t hard : {2000u, 3000u}) {
            EngineChange again;
            SaConfig c = tunnel_sa(1);
            c.lifetime.hard_packets = hard;
            again.put_sas.push_back(c);
            REQUIRE(e->change(again, Backend::Auto));
        }
        CHECK(next_seq(*e) == 7);
    }
    SECTION("deleted and added again in one change (a flush and reload): numbers go on")
    {
        EngineChange reload;
        reload.del_sas.push_back(SaKey{limited.dst, limited.spi});
        reload.put_sas.push_back(limited);
        REQUIRE(e->change(reload, Backend::Auto));
        CHECK(next_seq(*e) == 7);
    }
    SECTION("the same SA put again is left running as it is")
    {
        EngineChange same;
        same.put_sas.push_back(limited);
        REQUIRE(e->change(same, Backend::Auto));
        CHECK(e->sas().find_in(limited.dst, limited.spi) == now);
    }
}

// The round of time limits (Engine::check_time_some) goes over SaTable::timed(), from which a
// deleted SA leaves in O(1), the last one taking its place: through adds, rekeys, updates
// that give or take a time limit, and deletes, the tables the data path reads (each copy in
// turn) hold each SA with one exactly once.
TEST_CASE("SAs with time limits stay in the round exactly once through any change",
          "[engine][change][lifetime]")
{
    std::mt19937 rng(11);
    auto e = empty_engine();
    std::map<int, SaConfig> sas;  // by tunnel
    auto limited = [&](SaConfig sa) {
        switch (rng() % 3) {
        case 0:
            sa.lifetime.hard_add_s = 3600;
            break;
        case 1:
            sa.lifetime.soft_use_s = 600;
            break;
        default:
            break;  // none
        }
        return sa;
    };
    for (int round = 0; round < 400; round++) {
        EngineChange ch;
        std::map<int, bool> touched;
        for (int k = 0, n = 1 + int(rng() % 5); k < n; k++) {
            int i = int(rng() % 50);
            if (touched[i])
                continue;
            touched[i] = true;
            switch (rng() % 3) {
            case 0: {  // add, rekey, or the same SA updated with other limits
                SaConfig sa = limited(tunnel_sa(i, rng() % 2));
                if (sas.count(i) && sas[i].spi != sa.spi)
                    ch.del_sas.push_back(SaKey{sas[i].dst, sas[i].spi});
                ch.put_sas.push_back(sa);
                sas[i] = sa;
                break;
            }
            default:
                if (sas.count(i)) {
                    ch.del_sas.push_back(SaKey{sas[i].dst, sas[i].spi});
                    sas.erase(i);
                }
                break;
            }
        }
        REQUIRE(e->change(ch, Backend::Auto));
        std::multiset<const Sa *> want, got;
        for (const auto &sa : e->sas().all())
            if (sa && sa->config().lifetime.has_time())
                want.insert(sa.get());
        for (const Sa *sa : e->sas().timed())
            got.insert(sa);
        REQUIRE(got == want);
        REQUIRE(want.size() == size_t(std::count_if(sas.begin(), sas.end(), [](const auto &kv) {
                    return kv.second.lifetime.has_time();
                })));
    }
}

TEST_CASE("ids: stable while an entry lives, not reused at once, with a new generation",
          "[engine][change]")
{
    IdPool pool;
    std::vector<uint32_t> ids;
    for (int i = 0; i < 3000; i++)
        ids.push_back(pool.take());
    CHECK(ids[2999] == 2999);
    for (int i = 0; i < 2000; i++)
        pool.give_back(ids[size_t(i)]);
    // Fresh indexes first, until more than kReuseAfter wait.
    uint32_t next = pool.take();
    CHECK(next == (1u << 24 | 0));  // index 0 again, generation 1
    for (int i = 0; i < 2000 - int(IdPool::kReuseAfter) - 1; i++)
        pool.take();
    CHECK(pool.take() == 3000);
}

// Readers run packets through tunnels while the writer rekeys them (make-before-break, one
// change adding the new SA and removing the old) and moves policies: a reader must always
// find an SA for a flow that has a policy, and the SA it finds must be whole (its own SPI in
// the packet). ThreadSanitizer checks the rest ([threads] runs under it in ci/test).
TEST_CASE("readers run packets while the tables change", "[engine][change][threads]")
{
    Qsbr readers;
    auto e = empty_engine(&readers);
    constexpr int kTunnels = 16;
    EngineChange init;
    for (int i = 0; i < kTunnels; i++) {
        init.put_sas.push_back(tunnel_sa(i));
        init.put_policies.push_back(tunnel_policy(i));
    }
    auto prepared = e->prepare(init, Backend::Auto);
    REQUIRE(prepared);
    uint32_t ids[kTunnels];  // the policies' (updates keep them)
    for (int i = 0; i < kTunnels; i++)
        ids[i] = prepared->policy_puts[size_t(i)].id;
    e->commit(std::move(*prepared));

    std::atomic<bool> stop{false};
    std::atomic<uint64_t> encrypted{0}, wrong{0};
    std::thread reader([&] {
        Qsbr::Reader me(readers);
        int i = 0;
        bool classified = false;  // by turns: the SPD's lookup, and the policy's link
        while (!stop.load(std::memory_order_relaxed)) {
            Frame f(udp_packet(4, ("10." + std::to_string(i) + ".0.1").c_str(),
                               ("10.200." + std::to_string(i) + ".1").c_str(), 32));
            Verdict v;
            if (classified) {
                Pkt *p = &f.pkt;
                Classified c{Classified::Encap, ids[i], wire::kIpv4Len, false};
                e->process_classified(&p, &c, 1);
                v = f.pkt.verdict;
            } else {
                v = run(*e, f);
            }
            if (v == Verdict::Encrypted) {
                uint32_t spi = wire::get32(f.pkt.ip() + 20);
                encrypted++;
                if ((spi & 0xfffff) != 0x10000 + uint32_t(i))
                    wrong++;
            } else {
                wrong++;  // every tunnel has an SA and a policy at every moment
            }
            me.quiescent();
            i = (i + 1) % kTunnels;
            classified = i == 0 ? !classified : classified;
        }
    });
    uint32_t gen[kTunnels] = {};
    for (int round = 0; round < 400; round++) {
        int i = round % kTunnels;
        EngineChange ch;
        SaConfig old = tunnel_sa(i, gen[i]);
        gen[i] = (gen[i] + 1) % 4;
        ch.put_sas.push_back(tunnel_sa(i, gen[i]));
        ch.del_sas.push_back(SaKey{old.dst, old.spi});
        ch.put_policies.push_back(tunnel_policy(i, 100 + uint32_t(round % 3)));
        REQUIRE(e->change(ch, Backend::Auto));
    }
    while (encrypted.load() < 1000)
        std::this_thread::yield();
    stop = true;
    reader.join();
    CHECK(wrong.load() == 0);
    CHECK(e->sas().size() == size_t(kTunnels));
}

TEST_CASE("Qsbr: synchronize waits for a reader in a burst, not for one offline", "[rcu][threads]")
{
    Qsbr d;
    std::atomic<int> phase{0};
    std::atomic<bool> synced{false}, early{false};
    std::thread reader([&] {
        Qsbr::Reader me(d);
        phase = 1;  // in a burst from here
        while (phase.load() != 2)
            std::this_thread::yield();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        early = synced.load();  // the writer must still be waiting for this burst
        me.quiescent();
        while (phase.load() != 3)
            std::this_thread::yield();
        me.offline();
        phase = 4;
        while (phase.load() != 5)
            std::this_thread::yield();
    });
    while (phase.load() != 1)
        std::this_thread::yield();
    phase = 2;
    d.synchronize();
    synced = true;
    phase = 3;
    while (phase.load() != 4)
        std::this_thread::yield();
    d.synchronize();  // offline: no wait
    phase = 5;
    reader.join();
    CHECK_FALSE(early.load());
    CHECK(d.readers() == 0);
}
