#include "bpf/policy_tuples.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace xesp {

namespace {

// The network-order mask of a prefix of `len` bits over `bytes` bytes, as 4 words.
void prefix_mask(uint8_t len, size_t bytes, __be32 out[4])
{
    uint8_t m[16] = {};
    for (size_t i = 0; i < bytes; i++) {
        unsigned bits = len > i * 8 ? len - unsigned(i * 8) : 0;
        m[i] = bits >= 8 ? 0xff : uint8_t(0xff << (8 - bits));
    }
    std::memcpy(out, m, 16);
}

void copy_addr(const IpAddr &a, __be32 out[4])
{
    std::memset(out, 0, 16);
    std::memcpy(out, a.b.data(), a.size());
}

bool protects_or_blocks(const PolicyConfig &p)
{
    return p.action == Action::Block || p.tmpl.has_value();
}

}  // namespace

TupleSpace::KeyBytes TupleSpace::bytes(const xesp_policy_key &k)
{
    KeyBytes b;
    std::memcpy(b.data(), &k, sizeof(k));
    return b;
}

xesp_policy_key TupleSpace::shadow_key(const xesp_policy_key &k)
{
    xesp_policy_key s = k;
    s.dir |= XESP_DIR_F_PORTLESS;
    s.sport = 0;
    s.dport = 0;
    return s;
}

uint8_t TupleSpace::free_tuple_id() const
{
    for (unsigned id = 0;; id++) {
        bool used = std::any_of(tuples_.begin(), tuples_.end(),
                                [&](const auto &t) { return t.second.id == id; });
        if (!used)
            return uint8_t(id);
    }
}

std::optional<uint32_t> TupleSpace::order_of(uint32_t policy_id) const
{
    auto it = by_id_.find(policy_id);
    if (it == by_id_.end())
        return std::nullopt;
    return uint32_t(it->second.rank);
}

Result<TupleChange> TupleSpace::add(uint32_t policy_id, const PolicyConfig &p,
                                    std::optional<uint32_t> order)
{
    const std::string what = "xdp policy " + std::to_string(policy_id);
    const Selector &s = p.sel;
    uint8_t family = s.src.addr.family;
    if ((family != 4 && family != 6) || s.dst.addr.family != family)
        return make_error(what + ": selector needs src and dst of one family (4 or 6)");
    if (p.dir != Dir::In && p.dir != Dir::Out && p.dir != Dir::Fwd)
        return make_error(what + ": direction must be in, out or fwd");
    if (by_id_.count(policy_id))
        return make_error(what + ": id already in use; remove it first");

    Shape shape{family, uint8_t(p.dir), s.src.len, s.dst.len,
                uint8_t((s.proto ? XESP_TUPLE_F_PROTO : 0) |
                        (s.sport_set ? XESP_TUPLE_F_SPORT : 0) |
                        (s.dport_set ? XESP_TUPLE_F_DPORT : 0))};
    auto tuple = tuples_.find(shape);
    if (tuple == tuples_.end() && tuples_.size() >= XESP_MAX_TUPLES)
        return make_error(what + ": more than " + std::to_string(XESP_MAX_TUPLES) +
                          " distinct selector shapes (prefix lengths, proto/port use); "
                          "merge prefixes or raise XESP_MAX_TUPLES");

    xesp_policy_key key{};
    key.family = family;
    key.dir = uint8_t(p.dir);
    key.proto = s.proto;
    key.sport = s.sport_set ? htons(s.sport) : 0;
    key.dport = s.dport_set ? htons(s.dport) : 0;
    copy_addr(s.src.addr, key.src);  // a Prefix keeps its host bits cleared
    copy_addr(s.dst.addr, key.dst);
    if (tuple != tuples_.end()) {
        key.tuple = tuple->second.id;
        auto dup = exact_.find(bytes(key));
        if (dup != exact_.end())
            return make_error(what + ": policy " + std::to_string(dup->second) +
                              " has the same selector and direction");
    }

    TupleChange ch;
    if (tuple == tuples_.end()) {
        tuple = tuples_.emplace(shape, Tuple{free_tuple_id(), {}}).first;
        ch.table_changed = true;
    }
    uint64_t rank = uint64_t(p.priority) << 32 | (order ? *order : seq_++);
    if (tuple->second.ranks.empty() || rank < *tuple->second.ranks.begin())
        ch.table_changed = true;
    tuple->second.ranks.insert(rank);

    key.tuple = tuple->second.id;
    xesp_policy_val val{};
    val.rank = rank;
    val.policy_id = policy_id;
    val.action = p.action == Action::Block ? XESP_ACTION_BLOCK : XESP_ACTION_ALLOW;
    val.flags = p.tmpl ? XESP_POL_F_TMPL : 0;
    ch.put.emplace_back(key, val);

    bool shadowed = (s.sport_set || s.dport_set) && protects_or_blocks(p);
    if (shadowed) {
        xesp_policy_key sk = shadow_key(key);
        auto &ranks = shadows_[bytes(sk)];
        ranks.insert(rank);
        xesp_policy_val sv{};
        sv.rank = *ranks.begin();
        ch.put.emplace_back(sk, sv);
    }
    exact_[bytes(key)] = policy_id;
    by_id_[policy_id] = Entry{shape, key, rank, shadowed};
    return ch;
}

Result<TupleChange> TupleSpace::remove(uint32_t policy_id)
{
    auto it = by_id_.find(policy_id);
    if (it == by_id_.end())
        return make_error("xdp policy " + std::to_string(policy_id) + ": no such policy");
    const Entry &e = it->second;
    TupleChange ch;
    ch.erase.push_back(e.key);
    exact_.erase(bytes(e.key));

    if (e.shadowed) {
        xesp_policy_key sk = shadow_key(e.key);
        auto sh = shadows_.find(bytes(sk));
        sh->second.erase(sh->second.find(e.rank));
        if (sh->second.empty()) {
            shadows_.erase(sh);
            ch.erase.push_back(sk);
        } else {
            xesp_policy_val sv{};
            sv.rank = *sh->second.begin();
            ch.put.emplace_back(sk, sv);
        }
    }

    // The table keeps each tuple's best rank as a lower bound: a removal that leaves the tuple
    // in use needs no new table (the walk merely looks at that tuple a little longer), so
    // deleting many policies does not republish, and wait for readers, once each.
    auto tuple = tuples_.find(e.shape);
    auto &ranks = tuple->second.ranks;
    ranks.erase(ranks.find(e.rank));
    ch.table_changed = ranks.empty();
    if (ranks.empty())
        tuples_.erase(tuple);
    by_id_.erase(it);
    return ch;
}

xesp_tuple_table TupleSpace::table() const
{
    xesp_tuple_table tt{};
    for (const auto &[shape, tuple] : tuples_) {
        xesp_tuple &t = tt.t[tt.count++];
        size_t bytes = shape.family == 6 ? 16 : 4;
        prefix_mask(shape.src_len, bytes, t.src_mask);
        prefix_mask(shape.dst_len, bytes, t.dst_mask);
        t.best_rank = *tuple.ranks.begin();
        t.id = tuple.id;
        t.family = shape.family;
        t.dir = shape.dir;
        t.fields = shape.fields;
        t.src_len = shape.src_len;
        t.dst_len = shape.dst_len;
    }
    std::sort(tt.t, tt.t + tt.count,
              [](const xesp_tuple &a, const xesp_tuple &b) { return a.best_rank < b.best_rank; });
    return tt;
}

}  // namespace xesp
