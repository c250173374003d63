// What is written with keys shown leaves no key in freed memory: the temporaries of building a
// line and the storage a growing string leaves behind are wiped before they are freed, and the
// result is the caller's to wipe. This program replaces operator new and delete, so that while
// a check is armed every block freed is searched for the key's text; it is a program of its
// own so that no other test runs with them. Reading keys (a request's JSON, a state file)
// goes through buffers of other libraries; the `xesp` process wipes every block it frees for
// them (tools/xesp/wipe_on_free.cpp), which tests/cli/test_key_memory.sh checks in the daemon.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "userspace/config/config.h"
#include "userspace/config/xfrm_grammar.h"
#include "userspace/control/control.h"
#include "userspace/control/control_text.h"
#include "userspace/gateway/state.h"

namespace {

// The key's text as `sa list --show-keys` writes it, less its 0x: long enough that no other text
// holds it, short enough that a partly built copy does.
constexpr char kKeyHex[] = "5ec7e70102030405";
std::atomic<bool> armed{false};
std::atomic<size_t> found{0};

// Every block is cleared after the search, armed or not: what an unarmed step left in a
// block must not be found when the block comes back from malloc and is freed again armed.
void search_freed(void *p)
{
    if (!p)
        return;
    size_t n = malloc_usable_size(p);
    if (armed.load(std::memory_order_relaxed) && memmem(p, n, kKeyHex, sizeof kKeyHex - 1))
        found.fetch_add(1, std::memory_order_relaxed);
    explicit_bzero(p, n);
}

void *allocate(size_t n)
{
    if (void *p = std::malloc(n ? n : 1))
        return p;
    throw std::bad_alloc();
}

}  // namespace

void *operator new(size_t n)
{
    return allocate(n);
}
void *operator new[](size_t n)
{
    return allocate(n);
}
void operator delete(void *p) noexcept
{
    search_freed(p);
    std::free(p);
}
void operator delete[](void *p) noexcept
{
    search_freed(p);
    std::free(p);
}
void operator delete(void *p, size_t) noexcept
{
    search_freed(p);
    std::free(p);
}
void operator delete[](void *p, size_t) noexcept
{
    search_freed(p);
    std::free(p);
}

using namespace xesp;

namespace {

const char kSa[] =
    "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1001 reqid 1 mode tunnel "
    "aead rfc4106(gcm(aes)) 0x5ec7e70102030405060708090a0b0c0da1b2c3d4 128 "
    "replay-window 64 sel src 10.1.0.0/16 dst 10.2.0.0/16 "
    "limit time-soft 3000 limit time-hard 3600 limit byte-soft 1000000000 dir out\n"
    "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1002 reqid 2 mode tunnel "
    "enc cbc(aes) 0x5ec7e70102030405060708090a0b0c0d "
    "auth-trunc hmac(sha256) 0x5ec7e701020304050607080910111213141516171819202122232425262728 128\n"
    "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out "
    "tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode tunnel\n";

Config config()
{
    auto cfg = load_batch(kSa, "test");
    REQUIRE(cfg);
    REQUIRE(cfg->sas.size() == 2);
    return std::move(*cfg);
}

bool holds_key(const std::string &s)
{
    return s.find(kKeyHex) != std::string::npos;
}

// Runs make() armed; what it returns must hold the key, and is wiped before it is freed.
// Returns how many freed blocks held the key.
template <class Make> size_t freed_with_key(Make make)
{
    found = 0;
    armed = true;
    {
        std::string out = make();
        bool has = holds_key(out);
        control_text::wipe(out);
        armed = false;
        REQUIRE(has);
    }
    armed = false;
    return found;
}

}  // namespace

TEST_CASE("the scanner sees a key left in freed memory", "[freed]")
{
    // The check itself: a string holding the key freed without a wipe is found.
    found = 0;
    armed = true;
    {
        std::string s = std::string("aead 0x") + kKeyHex + " 128 and more than fits inline";
    }
    armed = false;
    CHECK(found > 0);
}

TEST_CASE("an SA line with keys leaves none in freed memory", "[freed]")
{
    Config cfg = config();
    for (const SaConfig &sa : cfg.sas) {
        INFO("spi " << sa.spi);
        CHECK(freed_with_key([&] { return format_sa(sa, true); }) == 0);
    }
}

TEST_CASE("a batch with keys leaves none in freed memory", "[freed]")
{
    Config cfg = config();
    CHECK(freed_with_key([&] { return to_batch(cfg, true); }) == 0);
}

TEST_CASE("a listing with keys leaves none in freed memory", "[freed]")
{
    Config cfg = config();
    Command list;
    list.verb = Command::Verb::List;
    list.object = Command::Object::Sa;
    CHECK(freed_with_key([&] { return command_output(list, cfg, true); }) == 0);
    Command get;
    get.verb = Command::Verb::Get;
    get.object = Command::Object::Sa;
    const SaConfig &first = *cfg.sas.begin();
    get.sa.dst = first.dst;
    get.sa.spi = first.spi;
    CHECK(freed_with_key([&] { return command_output(get, cfg, true); }) == 0);
}

TEST_CASE("the state file and its journal leave no key in freed memory", "[freed]")
{
    GatewayState st;
    st.config = config();
    CHECK(freed_with_key([&] { return format_state(st); }) == 0);
    JournalEntry e;
    e.generation = 3;
    e.change.put_sas.assign(st.config.sas.begin(), st.config.sas.end());
    CHECK(freed_with_key([&] { return format_journal_entry(e); }) == 0);
}
