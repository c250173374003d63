#include <catch2/catch.hpp>

#include <random>
#include <unordered_map>

#include "userspace/base/flat_map.h"

using xesp::FlatMap;

namespace {

// Few distinct homes and tags: long clusters that wrap around the end of the table, the
// cases backward-shift deletion has to get right.
struct CrowdedHash {
    uint64_t operator()(uint32_t k) const { return uint64_t(k % 7) << 32 | (k % 13) * 5; }
};
struct GoodHash {
    uint64_t operator()(uint32_t k) const { return xesp::mix64(k); }
};

template <typename Hash> void against_unordered_map(uint32_t keys, size_t steps, uint32_t seed)
{
    FlatMap<uint32_t, uint64_t, Hash> m;
    std::unordered_map<uint32_t, uint64_t> ref;
    std::mt19937 rng(seed);
    for (size_t step = 0; step < steps; step++) {
        uint32_t k = rng() % keys;
        switch (rng() % 3) {
        case 0: {
            auto [v, fresh] = m.try_emplace(k);
            REQUIRE(fresh == !ref.count(k));
            *v = step;
            ref[k] = step;
            break;
        }
        case 1:
            REQUIRE(m.erase(k) == (ref.erase(k) == 1));
            break;
        default: {
            const uint64_t *v = std::as_const(m).find(k);
            auto it = ref.find(k);
            REQUIRE((v != nullptr) == (it != ref.end()));
            if (v)
                REQUIRE(*v == it->second);
        }
        }
        REQUIRE(m.size() == ref.size());
    }
    // Every entry is found, and nothing else is there.
    size_t seen = 0;
    m.for_each([&](uint32_t k, uint64_t v) {
        REQUIRE(ref.count(k));
        REQUIRE(ref[k] == v);
        seen++;
    });
    REQUIRE(seen == ref.size());
    for (uint32_t k = 0; k < keys; k++)
        REQUIRE((std::as_const(m).find(k) != nullptr) == (ref.count(k) == 1));
}

}  // namespace

TEST_CASE("FlatMap agrees with unordered_map through random adds, finds and erases", "[flat_map]")
{
    SECTION("crowded hash: long clusters wrapping around the table")
    {
        against_unordered_map<CrowdedHash>(200, 20000, 1);
    }
    SECTION("mixed hash, many keys, through several growths")
    {
        against_unordered_map<GoodHash>(5000, 60000, 2);
    }
}

TEST_CASE("FlatMap erase keeps every other key of a cluster reachable", "[flat_map]")
{
    FlatMap<uint32_t, uint32_t, CrowdedHash> m;
    for (uint32_t k = 0; k < 9; k++)  // 9 entries: the table grows to 16 slots
        m[k] = k + 100;
    for (uint32_t gone = 0; gone < 9; gone++) {
        auto copy = m;
        REQUIRE(copy.erase(gone));
        REQUIRE_FALSE(copy.erase(gone));
        for (uint32_t k = 0; k < 9; k++) {
            const uint32_t *v = std::as_const(copy).find(k);
            if (k == gone) {
                REQUIRE(v == nullptr);
            } else {
                REQUIRE(v != nullptr);
                REQUIRE(*v == k + 100);
            }
        }
    }
}
