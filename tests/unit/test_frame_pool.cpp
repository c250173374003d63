// FramePool: frames taken and given back by address, all or none when a caller needs a set.
#include <catch2/catch.hpp>

#include "af_xdp/umem.h"

using namespace xesp;

TEST_CASE("frame pool: alloc_all takes every frame asked for, or none", "[frames]")
{
    FramePool pool(8);
    const uint64_t frames[4] = {0, kFrameSize, 2 * kFrameSize, 3 * kFrameSize};
    pool.free(frames, 4);
    REQUIRE(pool.count() == 4);

    uint64_t got[8] = {};
    CHECK_FALSE(pool.alloc_all(got, 5));  // one short: nothing is taken
    CHECK(pool.count() == 4);
    REQUIRE(pool.alloc_all(got, 3));
    CHECK(pool.count() == 1);
    for (int i = 0; i < 3; i++)
        CHECK(got[i] % kFrameSize == 0);
    CHECK_FALSE(pool.alloc_all(got + 3, 2));
    CHECK(pool.count() == 1);
    pool.free(got, 3);
    CHECK(pool.count() == 4);
    CHECK(pool.overflows() == 0);
    // alloc() gives what there is: the caller must give back a partial set itself.
    CHECK(pool.alloc(got, 6) == 4);
    CHECK(pool.count() == 0);
}
