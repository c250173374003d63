#include "userspace/esp/spd.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace xesp {

namespace {

// The first `len` bits of 16 bytes, as two words in memory order.
void prefix_mask(uint8_t len, uint64_t out[2])
{
    std::array<uint8_t, 16> m{};
    unsigned full = len / 8, rest = len % 8;
    std::memset(m.data(), 0xff, full);
    if (rest)
        m[full] = uint8_t(0xff << (8 - rest));
    std::memcpy(out, m.data(), 16);
}

bool has_ports(const Selector &s)
{
    return s.sport_set || s.dport_set;
}

}  // namespace

size_t Spd::KeyHash::operator()(const Key &k) const
{
    uint64_t w[4];
    std::memcpy(w, k.src.data(), 16);
    std::memcpy(w + 2, k.dst.data(), 16);
    uint64_t h = mix64(uint64_t(k.sport) << 24 | uint64_t(k.dport) << 8 | k.proto);
    for (uint64_t x : w)
        h = mix64(h ^ x);
    return size_t(h);
}

Spd::Mask Spd::mask_of(const Shape &s)
{
    Mask m{};
    prefix_mask(s.src_len, m.src);
    prefix_mask(s.dst_len, m.dst);
    m.sport = s.sport ? 0xffff : 0;
    m.dport = s.dport ? 0xffff : 0;
    m.proto = s.proto ? 0xff : 0;
    return m;
}

Spd::Key Spd::portless_key(Shape s, const IpAddr &src, const IpAddr &dst, uint8_t proto)
{
    s.sport = s.dport = false;
    return key_of(s, src, dst, proto, 0, 0);
}

void Spd::cell_add(Cells &cells, const Key &k, Ranked r)
{
    auto [at, fresh] = cells.try_emplace(k);
    Cell &c = *at;
    if (fresh) {
        c.best = r;
        return;
    }
    if (r.rank < c.best.rank)
        std::swap(r, c.best);
    c.more.push_back(r);
}

void Spd::cell_remove(Cells &cells, const Key &k, Rank r)
{
    Cell *at = cells.find(k);
    if (!at)
        return;
    Cell &c = *at;
    if (c.best.rank != r) {
        std::erase_if(c.more, [&](const Ranked &m) { return m.rank == r; });
        return;
    }
    if (c.more.empty()) {
        cells.erase(k);
        return;
    }
    auto next = std::min_element(c.more.begin(), c.more.end(),
                                 [](const Ranked &x, const Ranked &y) { return x.rank < y.rank; });
    c.best = *next;
    c.more.erase(next);
}

void Spd::sort_bins(Dir dir)
{
    auto &bins = bins_[size_t(dir)];
    std::stable_sort(bins.begin(), bins.end(),
                     [](const Bin &a, const Bin &b) { return a.best < b.best; });
}

void Spd::index(const PolicyConfig &p, Rank rank, const OutFlow *link)
{
    by_dir_[size_t(p.dir)].emplace(rank, &p);
    const Selector &s = p.sel;
    if (s.src.addr.family != s.dst.addr.family)
        return;  // matches no packet: nothing to index
    Shape shape{s.src.addr.family, s.src.len, s.dst.len, s.proto != 0, s.sport_set, s.dport_set};
    auto &bins = bins_[size_t(p.dir)];
    auto bin =
        std::find_if(bins.begin(), bins.end(), [&](const Bin &b) { return b.shape == shape; });
    if (bin == bins.end())
        bin = bins.insert(bins.end(), Bin{shape, mask_of(shape), kNone, {}, {}, {}});
    cell_add(bin->exact, key_of(shape, s.src.addr, s.dst.addr, s.proto, s.sport, s.dport),
             Ranked{rank, &p, link});
    if (has_ports(s) && (p.tmpl || p.action == Action::Block))  // only for `unsure`: no link
        cell_add(bin->portless, portless_key(shape, s.src.addr, s.dst.addr, s.proto),
                 Ranked{rank, &p});
    bin->ranks.insert(rank);
    if (rank < bin->best) {  // a new bin, or a better best
        bin->best = rank;
        sort_bins(p.dir);
    }
}

void Spd::unindex(const PolicyConfig &p, Rank rank)
{
    by_dir_[size_t(p.dir)].erase(rank);
    const Selector &s = p.sel;
    if (s.src.addr.family != s.dst.addr.family)
        return;
    Shape shape{s.src.addr.family, s.src.len, s.dst.len, s.proto != 0, s.sport_set, s.dport_set};
    auto &bins = bins_[size_t(p.dir)];
    auto bin =
        std::find_if(bins.begin(), bins.end(), [&](const Bin &b) { return b.shape == shape; });
    if (bin == bins.end())
        return;
    cell_remove(bin->exact, key_of(shape, s.src.addr, s.dst.addr, s.proto, s.sport, s.dport), rank);
    if (has_ports(s) && (p.tmpl || p.action == Action::Block))
        cell_remove(bin->portless, portless_key(shape, s.src.addr, s.dst.addr, s.proto), rank);
    bin->ranks.erase(rank);
    if (bin->ranks.empty()) {
        bins.erase(bin);
    } else if (bin->best == rank) {
        bin->best = *bin->ranks.begin();
        sort_bins(p.dir);
    }
}

void Spd::put(uint32_t id, uint32_t order, Policy p, const OutFlow *link)
{
    size_t i = id & kIndexMask;
    if (i >= by_index_.size())
        by_index_.resize(i + 1);
    Slot &slot = by_index_[i];
    // An id in place of another with the same index would leave that one's link held.
    assert(!slot.policy || slot.id == id);
    if (slot.policy)
        unindex(*slot.policy, rank_of(*slot.policy, slot.order));
    else
        count_++;
    slot = Slot{id, order, std::move(p), link};
    index(*slot.policy, rank_of(*slot.policy, order), link);
}

void Spd::remove(uint32_t id)
{
    size_t i = id & kIndexMask;
    if (i >= by_index_.size() || by_index_[i].id != id || !by_index_[i].policy)
        return;
    Slot &slot = by_index_[i];
    unindex(*slot.policy, rank_of(*slot.policy, slot.order));
    slot = Slot{};
    count_--;
}

uint32_t Spd::add(const PolicyConfig &p)
{
    uint32_t id = added_++;
    put(id, id, std::make_shared<const PolicyConfig>(p));
    return id;
}

const PolicyConfig *Spd::lookup(Dir dir, const FlowKey &f, bool *unsure) const
{
    return lookup(dir, f, unsure, nullptr).policy;
}

const PolicyConfig *Spd::lookup(Dir dir, const FlowKey &f, bool *unsure, const Probe &probe,
                                const OutFlow **link) const
{
    Ranked r = lookup(dir, f, unsure, &probe);
    if (link)
        *link = r.link;
    return r.policy;
}

Spd::Ranked Spd::lookup(Dir dir, const FlowKey &f, bool *unsure, const Probe *probe) const
{
    Ranked found, shadow;
    const auto &bins = bins_[size_t(dir)];
    if (probe && probe->bins != &bins)
        probe = nullptr;  // another direction's, or another table's: of no use here
    for (size_t i = 0; i < bins.size(); i++) {
        const Bin &b = bins[i];
        const Shape &s = b.shape;
        if (s.family != f.src.family || s.family != f.dst.family)
            continue;
        if (!f.fragment) {
            if (b.best >= found.rank)
                break;  // bins are in order of their best rank
            Key k = key_of(b.mask, f.src, f.dst, f.proto, f.sport, f.dport);
            const Cell *c =
                probe && i < probe->n ? b.exact.find(k, probe->hash[i]) : b.exact.find(k);
            if (c && c->best.rank < found.rank)
                found = c->best;
            continue;
        }
        // A fragment: no ports, so shapes with ports can only make it unsure; nor, when its
        // protocol is not known, shapes with a protocol, whatever their policies' addresses
        // (as the XDP classifier judges it, by a tuple's best rank).
        if (f.proto_unknown && s.proto) {
            if (b.best < shadow.rank)
                shadow.rank = b.best;
        } else if (!s.sport && !s.dport) {
            const Cell *c = b.exact.find(key_of(b.mask, f.src, f.dst, f.proto, 0, 0));
            if (c && c->best.rank < found.rank)
                found = c->best;
        } else if (!b.portless.empty()) {
            // The shape's key without its ports (portless_key()), from its mask.
            const Cell *c = b.portless.find(key_of(b.mask, f.src, f.dst, f.proto, 0, 0));
            if (c && c->best.rank < shadow.rank)
                shadow = c->best;
        }
    }
    if (unsure && shadow.rank < found.rank)
        *unsure = true;
    return found;
}

void Spd::prefetch(Dir dir, const FlowKey &f, Probe *probe) const
{
    const auto &bins = bins_[size_t(dir)];
    size_t n = std::min(bins.size(), kProbeBins);
    for (size_t i = 0; i < bins.size(); i++) {
        const Bin &b = bins[i];
        const Shape &s = b.shape;
        uint64_t h = 0;
        if (s.family == f.src.family && s.family == f.dst.family) {
            h = b.exact.hash(key_of(b.mask, f.src, f.dst, f.proto, f.sport, f.dport));
            b.exact.prefetch(h);
        }
        if (probe && i < n)
            probe->hash[i] = h;  // a bin of the other family is skipped by lookup()
    }
    if (probe) {
        probe->bins = &bins;
        probe->n = uint8_t(n);
    }
}

const PolicyConfig *Spd::lookup_linear(Dir dir, const FlowKey &f, bool *unsure) const
{
    for (const auto &[rank, policy] : by_dir_[size_t(dir)]) {
        const PolicyConfig &p = *policy;
        const Selector &s = p.sel;
        if (!f.fragment) {
            if (s.matches(f.src, f.dst, f.proto, f.sport, f.dport))
                return &p;
            continue;
        }
        if (f.proto_unknown && s.proto) {
            // Any policy that names a protocol may be about it (lookup() above).
            if (unsure && s.src.addr.family == f.src.family && s.dst.addr.family == f.dst.family)
                *unsure = true;
            continue;
        }
        if (!s.src.contains(f.src) || !s.dst.contains(f.dst) || (s.proto && s.proto != f.proto))
            continue;
        if (!has_ports(s))
            return &p;
        if (unsure && (p.tmpl || p.action == Action::Block))
            *unsure = true;
    }
    return nullptr;
}

}  // namespace xesp
