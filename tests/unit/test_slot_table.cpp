// SlotTable: slot -> engine id for live slots, checked against std::map through many
// configuration changes in which slots only grow, as they do in ClassifierSync.
#include <catch2/catch.hpp>

#include <map>
#include <random>

#include "userspace/gateway/slot_table.h"

using namespace xesp;

TEST_CASE("slot table: empty, and what is not in it", "[slot]")
{
    SlotTable t;
    CHECK(t.find(0) == SlotTable::kMissing);
    t.rebuild({});
    CHECK(t.find(0) == SlotTable::kMissing);
    t.rebuild({{5, 50}, {6, 60}});
    CHECK(t.find(5) == 50);
    CHECK(t.find(6) == 60);
    CHECK(t.find(7) == SlotTable::kMissing);
    CHECK(t.find(SlotTable::kMissing) == SlotTable::kMissing);
    t.rebuild({{6, 61}});  // 5 deleted, 6's engine id moved
    CHECK(t.find(5) == SlotTable::kMissing);
    CHECK(t.find(6) == 61);
}

TEST_CASE("slot table: churn keeps it the size of what is live", "[slot]")
{
    std::mt19937 rng(7);
    std::map<uint32_t, uint32_t> live;  // the reference
    uint32_t next_slot = 0;
    SlotTable t;
    for (int change = 0; change < 300; change++) {
        // Rekeys: some slots go, new ones come; what stays gets new engine ids.
        for (auto it = live.begin(); it != live.end();)
            it = rng() % 4 == 0 ? live.erase(it) : std::next(it);
        uint32_t adds = rng() % 700;
        for (uint32_t i = 0; i < adds; i++)
            live[next_slot++] = 0;
        std::vector<std::pair<uint32_t, uint32_t>> entries;
        uint32_t id = 0;
        for (auto &[slot, v] : live) {
            v = id++;
            entries.emplace_back(slot, v);
        }
        t.rebuild(entries);
        REQUIRE(t.size() == live.size());
        REQUIRE(t.capacity() <= std::max<size_t>(8, live.size() * 4));
        for (uint32_t probe = 0; probe < next_slot + 10; probe += 1 + rng() % 61) {
            auto it = live.find(probe);
            REQUIRE(t.find(probe) == (it == live.end() ? SlotTable::kMissing : it->second));
        }
    }
    CHECK(next_slot > 50000);  // far more slots made than ever live at once
}
