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
#include <unordered_map>
#include <vector>

#include "userspace/esp/esp.h"
#include "userspace/esp/sa_config.h"

namespace xesp {

// A policy's id is the order it was added in (0, 1, ...), whatever its direction; pointers to
// policies stay valid until the next add().
class Spd {
public:
    uint32_t add(const PolicyConfig &p);  // returns the policy's id

    // The first policy that matches. A fragment carries no ports, so policies with port
    // selectors cannot match it; if one of those that protects or blocks would have come
    // first, *unsure is set (RFC 4301 7: such a fragment cannot be classified safely).
    const PolicyConfig *lookup(Dir dir, const FlowKey &flow, bool *unsure = nullptr) const;
    // The same by walking the policies in order: the definition lookup() must agree with, for
    // tests.
    const PolicyConfig *lookup_linear(Dir dir, const FlowKey &flow, bool *unsure = nullptr) const;

    const PolicyConfig *by_id(uint32_t id) const { return id < all_.size() ? &all_[id] : nullptr; }
    size_t size() const { return all_.size(); }
    size_t shapes(Dir dir) const { return bins_[size_t(dir)].size(); }

private:
    struct Shape {
        uint8_t family, src_len, dst_len;
        bool proto, sport, dport;
        bool operator==(const Shape &) const = default;
    };
    // A selector with its prefixes masked, or a packet's addresses masked to a shape; what a
    // shape does not look at is zero.
    struct Key {
        std::array<uint8_t, 16> src, dst;
        uint16_t sport, dport;
        uint8_t proto;
        bool operator==(const Key &) const = default;
    };
    struct KeyHash {
        size_t operator()(const Key &k) const;
    };
    // Rank: priority, then id. The lowest wins.
    using Rank = uint64_t;
    static constexpr Rank kNone = UINT64_MAX;
    struct Bin {
        Shape shape;
        Rank best = kNone;  // of every policy in `exact`
        std::unordered_map<Key, Rank, KeyHash> exact;
        // Shapes with ports: the policies that protect or block, by their selector without
        // ports, for fragments (the `unsure` of lookup()).
        std::unordered_map<Key, Rank, KeyHash> portless;
    };

    static Key key_of(const Shape &s, const IpAddr &src, const IpAddr &dst, uint8_t proto,
                      uint16_t sport, uint16_t dport);
    // The key of a shape with ports, the ports left out: where `portless` is searched.
    static Key portless_key(Shape s, const IpAddr &src, const IpAddr &dst, uint8_t proto);

    std::vector<PolicyConfig> all_;    // by id
    std::vector<uint32_t> by_dir_[4];  // ids, in lookup order
    std::vector<Bin> bins_[4];         // per direction, by best rank
};

}  // namespace xesp
