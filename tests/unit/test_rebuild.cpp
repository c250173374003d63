// Engine::create(config, ..., prev): a configuration change must not restart the tunnels it
// leaves alone. SAs configured exactly as before keep their sequence numbers, replay window and
// counters; SAs that changed, or are new, start afresh; prev is not changed when the new
// configuration cannot be built.
#include <catch2/catch.hpp>

#include "tests/unit/esp_fixture.h"

using namespace xesp;
using namespace xesp::test;

namespace {

uint64_t encrypt_n(Engine &e, int n)
{
    uint64_t last = 0;
    for (int i = 0; i < n; i++) {
        Frame f(udp_packet(4, "10.1.0.1", "10.2.0.1", 64));
        REQUIRE(run(e, f) == Verdict::Encrypted);
        last = wire::get32(f.pkt.ip() + 20 + 4);  // the ESP sequence number
    }
    return last;
}

}  // namespace

TEST_CASE("a rebuilt engine keeps the SAs that did not change", "[engine][rebuild]")
{
    const auto &gcm = all_transforms()[0];
    SaConfig sa = make_sa(gcm, Mode::Tunnel, 4);
    Config c = sender(sa, "10.1.0.0/16", "10.2.0.0/16");
    auto e1 = make_engine(c);
    REQUIRE(encrypt_n(*e1, 5) == 5);
    const Sa *kept = e1->sas().all()[0].get();

    SECTION("another SA and policy added: the running SA goes on from where it was")
    {
        Config next = c;
        SaConfig other = make_sa(gcm, Mode::Tunnel, 4);
        other.spi = 0x7777;
        other.reqid = 77;
        other.dst = addr("203.0.113.7");
        next.sas.push_back(other);
        auto e2 = Engine::create(next, Backend::Auto, {}, e1.get());
        REQUIRE(e2);
        CHECK((*e2)->sas().all()[0].get() == kept);
        CHECK((*e2)->sas().all()[0]->counters().packets == 5);
        CHECK(encrypt_n(**e2, 1) == 6);
    }
    SECTION("the SA itself updated (new key): it starts afresh")
    {
        Config next = c;
        next.sas.nth(0).xf.enc_key = KeyBytes(std::vector<uint8_t>(16, 0x42).data(), 16);
        auto e2 = Engine::create(next, Backend::Auto, {}, e1.get());
        REQUIRE(e2);
        CHECK((*e2)->sas().all()[0].get() != kept);
        CHECK(encrypt_n(**e2, 1) == 1);
    }
    SECTION("a configuration that cannot be built leaves prev running")
    {
        Config next = c;
        SaConfig bad = make_sa(gcm, Mode::Tunnel, 4);
        bad.spi = 0x8888;
        bad.xf.enc_key = KeyBytes(std::vector<uint8_t>(7, 1).data(), 7);  // no such AES key
        next.sas.push_back(bad);
        auto e2 = Engine::create(next, Backend::Auto, {}, e1.get());
        REQUIRE_FALSE(e2);
        CHECK(e1->sas().all()[0].get() == kept);
        CHECK(encrypt_n(*e1, 1) == 6);
    }
}
