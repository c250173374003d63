// The userspace half of the XDP classifier's tuple-space search (the design is described in
// xesp_xdp_abi.h): turns policies into hash map entries, keeps the tuples and their best
// ranks, and says which map writes an add or a remove needs, in a safe order. No BPF here:
// XdpProgram applies the changes to the maps.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "bpf/abi_check.h"
#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"

namespace xesp {

// What an add or remove needs written. Applied in this order: the tuple table (if
// table_changed) before the entries on add, after them on remove, so that a packet never
// sees an entry whose tuple is missing or a tuple whose best rank is too high.
struct TupleChange {
    std::vector<std::pair<xesp_policy_key, xesp_policy_val>> put;
    std::vector<xesp_policy_key> erase;
    bool table_changed = false;
};

class TupleSpace {
public:
    // Among policies of equal priority the one added first wins; `order` instead puts the
    // policy where an earlier one was (order_of() it before removing it), as an update in
    // place keeps its position.
    Result<TupleChange> add(uint32_t policy_id, const PolicyConfig &p,
                            std::optional<uint32_t> order = std::nullopt);
    Result<TupleChange> remove(uint32_t policy_id);
    std::optional<uint32_t> order_of(uint32_t policy_id) const;

    // The table to publish: the active tuples by best rank, lowest first.
    xesp_tuple_table table() const;
    size_t tuples() const { return tuples_.size(); }
    size_t policies() const { return by_id_.size(); }

private:
    struct Shape {
        uint8_t family, dir, src_len, dst_len, fields;
        auto operator<=>(const Shape &) const = default;
    };
    struct Tuple {
        uint8_t id;
        std::multiset<uint64_t> ranks;
    };
    using KeyBytes = std::array<uint8_t, sizeof(xesp_policy_key)>;
    struct Entry {
        Shape shape;
        xesp_policy_key key;
        uint64_t rank;
        bool shadowed;  // protects or blocks and matches on ports
    };

    static KeyBytes bytes(const xesp_policy_key &k);
    static xesp_policy_key shadow_key(const xesp_policy_key &k);
    uint8_t free_tuple_id() const;

    std::map<Shape, Tuple> tuples_;
    std::unordered_map<uint32_t, Entry> by_id_;
    std::map<KeyBytes, uint32_t> exact_;  // duplicate selectors
    std::map<KeyBytes, std::multiset<uint64_t>> shadows_;
    uint32_t seq_ = 0;
};

}  // namespace xesp
