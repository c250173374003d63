// From a classifier slot to an engine id, for the live slots only.
//
// Slots are never reused (classifier_sync.h says why), so they only grow: every SA ever
// installed, each rekey included, takes a new one. A table indexed by slot would grow with
// that history; this one holds what is live, in an open-addressing table (linear probing,
// at most half full) built afresh at each configuration change. A lookup is one multiply and
// usually one cache line, as cheap as indexing the big table was.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace xesp {

class SlotTable {
public:
    static constexpr uint32_t kMissing = UINT32_MAX;  // no such slot; also the empty key

    // The table holds exactly `entries` (slot, id) from now on. Slots must be distinct and
    // not kMissing.
    void rebuild(const std::vector<std::pair<uint32_t, uint32_t>> &entries)
    {
        size_t cap = 8;
        while (cap < entries.size() * 2)
            cap *= 2;
        cells_.assign(cap, Cell{kMissing, kMissing});
        shift_ = 32;
        for (size_t c = cap; c > 1; c /= 2)
            shift_--;
        for (const auto &[slot, id] : entries) {
            size_t i = home(slot);
            while (cells_[i].slot != kMissing)
                i = (i + 1) & (cells_.size() - 1);
            cells_[i] = Cell{slot, id};
        }
        size_ = entries.size();
    }

    uint32_t find(uint32_t slot) const
    {
        if (cells_.empty() || slot == kMissing)
            return kMissing;
        for (size_t i = home(slot);; i = (i + 1) & (cells_.size() - 1)) {
            if (cells_[i].slot == slot)
                return cells_[i].id;
            if (cells_[i].slot == kMissing)
                return kMissing;
        }
    }

    size_t size() const { return size_; }
    size_t capacity() const { return cells_.size(); }

private:
    struct Cell {
        uint32_t slot;
        uint32_t id;
    };
    // Fibonacci hashing: consecutive slots land far apart.
    size_t home(uint32_t slot) const { return size_t(uint32_t(slot * 2654435769u) >> shift_); }

    std::vector<Cell> cells_;
    uint32_t shift_ = 32;
    size_t size_ = 0;
};

}  // namespace xesp
