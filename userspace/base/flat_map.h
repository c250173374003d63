// A hash table for the data path's lookups: open addressing with linear probing, keys and
// values inline in one array of slots, so that a lookup is one slot (or its neighbour) and
// nothing behind a pointer; and the slot can be asked for before it is needed (prefetch()),
// which is what lets a burst of packets spread over thousands of tunnels overlap its cache
// misses instead of taking them one after another (VPP's bihash is used the same way).
//
// The table stays at most 5/8 full; it doubles when it would not, and never shrinks. Erasing
// moves the slots after the erased one back (backward-shift deletion), so there are no
// tombstones and a miss ends at the first empty slot. A change may move any entry: pointers
// into the table last until the next change.
//
// Hash must give a well-mixed 64-bit value: the low bits pick the slot, the high 32 a tag
// compared before the key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace xesp {

// Mixes a 64-bit value into a hash whose every bit depends on every input bit (the finaliser
// of MurmurHash3, fmix64).
inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

template <typename Key, typename Value, typename Hash> class FlatMap {
public:
    FlatMap() = default;

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

    static uint64_t hash(const Key &k) { return Hash{}(k); }

    // Brings the slot of a key with hash h into cache, without waiting for it: both lines
    // when a slot straddles two.
    void prefetch(uint64_t h) const
    {
        if (slots_.empty())
            return;
        const char *s = reinterpret_cast<const char *>(&slots_[h & mask_]);
        __builtin_prefetch(s);
        if (sizeof(Slot) > 64 || (reinterpret_cast<uintptr_t>(s) & 63) + sizeof(Slot) > 64)
            __builtin_prefetch(s + sizeof(Slot) - 1);
    }

    const Value *find(const Key &k, uint64_t h) const
    {
        if (slots_.empty())
            return nullptr;
        uint32_t t = tag_of(h);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            const Slot &s = slots_[i];
            if (!s.tag)
                return nullptr;
            if (s.tag == t && s.key == k)
                return &s.value;
        }
    }
    const Value *find(const Key &k) const { return find(k, hash(k)); }
    Value *find(const Key &k) { return const_cast<Value *>(std::as_const(*this).find(k)); }

    // The value of k, made with Value{} if there was none; second: whether it was made.
    std::pair<Value *, bool> try_emplace(const Key &k)
    {
        if ((size_ + 1) * 8 > slots_.size() * 5)
            grow();
        uint64_t h = hash(k);
        uint32_t t = tag_of(h);
        for (size_t i = h & mask_;; i = (i + 1) & mask_) {
            Slot &s = slots_[i];
            if (!s.tag) {
                s.tag = t;
                s.home = uint32_t(h);
                s.key = k;
                s.value = Value{};
                size_++;
                return {&s.value, true};
            }
            if (s.tag == t && s.key == k)
                return {&s.value, false};
        }
    }
    Value &operator[](const Key &k) { return *try_emplace(k).first; }

    bool erase(const Key &k)
    {
        if (slots_.empty())
            return false;
        uint64_t h = hash(k);
        uint32_t t = tag_of(h);
        size_t i = h & mask_;
        for (;; i = (i + 1) & mask_) {
            if (!slots_[i].tag)
                return false;
            if (slots_[i].tag == t && slots_[i].key == k)
                break;
        }
        // Backward shift: each following entry that may move to the hole does, until an
        // empty slot or an entry already at its home.
        for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
            Slot &s = slots_[j];
            if (!s.tag)
                break;
            size_t home = s.home & mask_;
            // s may fill the hole at i if its home is not in (i, j] (cyclically).
            bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
            if (stays)
                continue;
            slots_[i] = std::move(s);
            i = j;
        }
        slots_[i] = Slot{};
        size_--;
        return true;
    }

    template <typename F> void for_each(F &&f) const
    {
        for (const Slot &s : slots_)
            if (s.tag)
                f(s.key, s.value);
    }

private:
    struct Slot {
        uint32_t tag = 0;   // 0: empty
        uint32_t home = 0;  // the low bits of the hash: where the key would be without others
        Key key{};
        Value value{};
    };
    static uint32_t tag_of(uint64_t h) { return uint32_t(h >> 32) | 1; }

    void grow()
    {
        std::vector<Slot> old = std::move(slots_);
        size_t cap = old.empty() ? 16 : old.size() * 2;
        slots_ = std::vector<Slot>(cap);
        mask_ = cap - 1;
        for (Slot &s : old) {
            if (!s.tag)
                continue;
            size_t i = s.home & mask_;
            while (slots_[i].tag)
                i = (i + 1) & mask_;
            slots_[i] = std::move(s);
        }
    }

    std::vector<Slot> slots_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

}  // namespace xesp
