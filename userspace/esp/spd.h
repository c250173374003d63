// The security policy database (RFC 4301 4.4.1) as the engine consults it: after decryption
// (does what came out of an SA match an inbound policy that expects it?), for plaintext the
// public side receives, and for `xesp pcap`. The gateway's XDP classifier finds out-policies
// with its own maps; this is the userspace side of the same rules.
//
// Policies of a direction are ordered by priority (lower first), then by the order they were
// added. A lookup is a tuple-space search, as the classifier's: policies are grouped by the
// shape of their selector (family, prefix lengths, which of protocol and ports are set), each
// shape a hash of the masked selector to the best policy with it. A lookup probes the shapes of
// a direction, best first, and stops at one that cannot beat what it has found: its cost
// follows the number of shapes (a handful), not the number of policies (RFC 4301 4.4.1.1
// leaves the data structure open).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "userspace/base/flat_map.h"
#include "userspace/esp/esp.h"
#include "userspace/esp/sa_config.h"

namespace xesp {

struct OutFlow;  // engine.h

// Policies by id. The engine gives ids and orders (put()); add() is put() with the next id,
// for a table of its own. Each policy is held by a shared_ptr, so that two tables may hold
// the same one (engine.h keeps two copies of its tables, rcu.h says why).
class Spd {
public:
    using Policy = std::shared_ptr<const PolicyConfig>;

    // Adds p under `id`, or replaces the policy with that id. Among equal priorities the
    // lower `order` comes first (the order policies were added in; an update keeps its
    // place). Ids and orders are distinct; the low 24 bits of an id are its index.
    // `link`: the SAs of the flow an out policy's template names, for by_id() and lookup()
    // to give with it (engine.h's OutFlow); the caller's, to let go of after remove() or
    // another put().
    void put(uint32_t id, uint32_t order, Policy p, const OutFlow *link = nullptr);
    void remove(uint32_t id);
    uint32_t add(const PolicyConfig &p);  // id and order: the number of put()s so far

    // The first policy that matches. A fragment carries no ports, so policies with port
    // selectors cannot match it; if one of those that protects or blocks would have come
    // first, *unsure is set (RFC 4301 7: such a fragment cannot be classified safely).
    const PolicyConfig *lookup(Dir dir, const FlowKey &flow, bool *unsure = nullptr) const;
    // Asks for what lookup() of a whole packet (not a fragment) will read, without waiting
    // for it: for a burst, so that each packet's cache misses overlap the others'. The hashes
    // it computes on the way, kept in a Probe, spare lookup() computing them again.
    static constexpr size_t kProbeBins = 4;
    struct Probe {
        const void *bins = nullptr;  // of the direction and table prefetch() looked at
        uint8_t n = 0;               // hashes of the first n of those bins
        uint64_t hash[kProbeBins];
    };
    void prefetch(Dir dir, const FlowKey &flow, Probe *probe = nullptr) const;
    // With the probe; *link: the policy's (put()).
    const PolicyConfig *lookup(Dir dir, const FlowKey &flow, bool *unsure, const Probe &probe,
                               const OutFlow **link = nullptr) const;
    void prefetch_id(uint32_t id) const
    {
        size_t i = id & kIndexMask;
        if (i < by_index_.size())
            __builtin_prefetch(&by_index_[i]);
    }
    // The same by walking the policies in order: the definition lookup() must agree with, for
    // tests.
    const PolicyConfig *lookup_linear(Dir dir, const FlowKey &flow, bool *unsure = nullptr) const;

    const PolicyConfig *by_id(uint32_t id) const
    {
        const OutFlow *link;
        return by_id(id, &link);
    }
    const PolicyConfig *by_id(uint32_t id, const OutFlow **link) const
    {
        size_t i = id & kIndexMask;
        if (i >= by_index_.size() || by_index_[i].id != id) {
            *link = nullptr;
            return nullptr;
        }
        *link = by_index_[i].link;
        return by_index_[i].policy.get();
    }
    const OutFlow *link_of(uint32_t id) const
    {
        const OutFlow *link;
        by_id(id, &link);
        return link;
    }
    Policy ref(uint32_t id) const
    {
        return by_id(id) ? by_index_[id & kIndexMask].policy : nullptr;
    }
    uint32_t order_of(uint32_t id) const
    {
        return by_id(id) ? by_index_[id & kIndexMask].order : 0;
    }
    size_t size() const { return count_; }
    size_t shapes(Dir dir) const { return bins_[size_t(dir)].size(); }

    static constexpr uint32_t kIndexMask = 0xffffff;

private:
    struct Shape {
        uint8_t family, src_len, dst_len;
        bool proto, sport, dport;
        bool operator==(const Shape &) const = default;
    };
    // A selector with its prefixes masked, or a packet's addresses masked to a shape; what a
    // shape does not look at is zero.
    struct Key {
        std::array<uint8_t, 16> src{}, dst{};
        uint16_t sport = 0, dport = 0;
        uint8_t proto = 0;
        bool operator==(const Key &) const = default;
    };
    struct KeyHash {
        size_t operator()(const Key &k) const;
    };
    // What a shape keeps of a packet's fields: key_of() is a few ANDs.
    struct Mask {
        uint64_t src[2], dst[2];
        uint16_t sport, dport;
        uint8_t proto;
    };
    static Mask mask_of(const Shape &s);
    // Rank: priority, then order. The lowest wins.
    using Rank = uint64_t;
    static constexpr Rank kNone = UINT64_MAX;
    struct Ranked {
        Rank rank = kNone;
        const PolicyConfig *policy = nullptr;
        const OutFlow *link = nullptr;  // the slot's (none in `portless`)
    };
    // The policies of one key: the best inline (what a lookup reads), the rest beside it
    // (two selectors that differ only in host bits beyond their prefix).
    struct Cell {
        Ranked best;
        std::vector<Ranked> more;
    };
    using Cells = FlatMap<Key, Cell, KeyHash>;
    struct Bin {
        Shape shape;
        Mask mask;
        Rank best = kNone;  // of every policy in `exact`
        Cells exact;
        // Shapes with ports: the policies that protect or block, by their selector without
        // ports, for fragments (the `unsure` of lookup()).
        Cells portless;
        std::set<Rank> ranks;  // of every policy in the bin: `best` after a removal
    };
    struct Slot {
        uint32_t id = UINT32_MAX;
        uint32_t order = 0;
        Policy policy;
        const OutFlow *link = nullptr;
    };

    static Key key_of(const Shape &s, const IpAddr &src, const IpAddr &dst, uint8_t proto,
                      uint16_t sport, uint16_t dport)
    {
        return key_of(mask_of(s), src, dst, proto, sport, dport);
    }
    static Key key_of(const Mask &m, const IpAddr &src, const IpAddr &dst, uint8_t proto,
                      uint16_t sport, uint16_t dport)
    {
        Key k;
        uint64_t w[4];
        std::memcpy(w, src.b.data(), 16);
        std::memcpy(w + 2, dst.b.data(), 16);
        w[0] &= m.src[0];
        w[1] &= m.src[1];
        w[2] &= m.dst[0];
        w[3] &= m.dst[1];
        std::memcpy(k.src.data(), w, 16);
        std::memcpy(k.dst.data(), w + 2, 16);
        k.sport = sport & m.sport;
        k.dport = dport & m.dport;
        k.proto = proto & m.proto;
        return k;
    }
    Ranked lookup(Dir dir, const FlowKey &flow, bool *unsure, const Probe *probe) const;
    // The key of a shape with ports, the ports left out: where `portless` is searched.
    static Key portless_key(Shape s, const IpAddr &src, const IpAddr &dst, uint8_t proto);
    static Rank rank_of(const PolicyConfig &p, uint32_t order)
    {
        return Rank(p.priority) << 32 | order;
    }
    void index(const PolicyConfig &p, Rank rank, const OutFlow *link);
    void unindex(const PolicyConfig &p, Rank rank);
    static void cell_add(Cells &cells, const Key &k, Ranked r);
    static void cell_remove(Cells &cells, const Key &k, Rank r);
    void sort_bins(Dir dir);

    std::vector<Slot> by_index_;
    size_t count_ = 0;
    uint32_t added_ = 0;                              // add()'s next id and order
    std::map<Rank, const PolicyConfig *> by_dir_[4];  // in lookup order
    std::vector<Bin> bins_[4];                        // per direction, by best rank
};

}  // namespace xesp
