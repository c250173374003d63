// Key material is wiped when it dies (sa_config.h): the keys and the AEAD salt of a transform,
// alone or inside an SA's configuration. Each object is built in a buffer of the test's own,
// destroyed in place, and the buffer searched for what it held.
#include <catch2/catch.hpp>

#include <algorithm>
#include <new>

#include "userspace/esp/sa_config.h"

using namespace xesp;

namespace {

const uint8_t kKey[16] = {0x5e, 0xc7, 0xe7, 0x01, 0x02, 0x03, 0x04, 0x05,
                          0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d};
const uint8_t kSalt[4] = {0xa1, 0xb2, 0xc3, 0xd4};

template <class T, size_t N> bool holds(const T &buf, const uint8_t (&what)[N])
{
    return std::search(std::begin(buf), std::end(buf), what, what + N) != std::end(buf);
}

// Builds a T in place, lets fill() set its secrets, checks the salt is there, destroys it and
// returns whether the key / the salt are still in the storage.
template <class T, class Fill> std::pair<bool, bool> left_after_death(Fill fill)
{
    alignas(T) uint8_t buf[sizeof(T)];
    T *t = new (buf) T();
    fill(*t);
    REQUIRE(holds(buf, kSalt));
    t->~T();
    return {holds(buf, kKey), holds(buf, kSalt)};
}

void fill_transform(Transform &x)
{
    x.aead = AeadAlg::AesGcm;
    x.enc_key.assign(kKey, sizeof kKey);
    x.auth_key.assign(kKey, sizeof kKey);
    x.salt = {kSalt[0], kSalt[1], kSalt[2], kSalt[3]};
}

}  // namespace

TEST_CASE("a transform wipes its keys and its salt when it dies", "[wipe]")
{
    auto [key, salt] = left_after_death<Transform>(fill_transform);
    CHECK_FALSE(key);
    CHECK_FALSE(salt);
}

TEST_CASE("an SA's configuration wipes its keys and salt when it dies", "[wipe]")
{
    auto [key, salt] = left_after_death<SaConfig>([](SaConfig &c) { fill_transform(c.xf); });
    CHECK_FALSE(key);
    CHECK_FALSE(salt);
}

TEST_CASE("a copied transform carries the salt and wipes its own copy", "[wipe]")
{
    Transform a;
    fill_transform(a);
    auto [key, salt] = left_after_death<Transform>([&](Transform &b) {
        b = a;  // copies, as Config and the engine make
        CHECK(b.salt == a.salt);
        CHECK(b.salt == std::array<uint8_t, 4>{kSalt[0], kSalt[1], kSalt[2], kSalt[3]});
    });
    CHECK_FALSE(key);
    CHECK_FALSE(salt);
}
