#include "userspace/esp/spd.h"

#include <algorithm>
#include <cstring>

namespace xesp {

namespace {

// The first `len` bits of `a`, the rest zero.
std::array<uint8_t, 16> masked(const IpAddr &a, uint8_t len)
{
    std::array<uint8_t, 16> out{};
    unsigned full = len / 8, rest = len % 8;
    std::memcpy(out.data(), a.b.data(), full);
    if (rest)
        out[full] = uint8_t(a.b[full] & (0xff << (8 - rest)));
    return out;
}

bool has_ports(const Selector &s)
{
    return s.sport_set || s.dport_set;
}

}  // namespace

size_t Spd::KeyHash::operator()(const Key &k) const
{
    // FNV-1a over the key's bytes, field by field (no padding read).
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const uint8_t *p, size_t n) {
        for (size_t i = 0; i < n; i++)
            h = (h ^ p[i]) * 1099511628211ull;
    };
    mix(k.src.data(), k.src.size());
    mix(k.dst.data(), k.dst.size());
    uint8_t rest[5] = {uint8_t(k.sport >> 8), uint8_t(k.sport), uint8_t(k.dport >> 8),
                       uint8_t(k.dport), k.proto};
    mix(rest, sizeof(rest));
    return size_t(h);
}

Spd::Key Spd::key_of(const Shape &s, const IpAddr &src, const IpAddr &dst, uint8_t proto,
                     uint16_t sport, uint16_t dport)
{
    return Key{masked(src, s.src_len), masked(dst, s.dst_len), uint16_t(s.sport ? sport : 0),
               uint16_t(s.dport ? dport : 0), uint8_t(s.proto ? proto : 0)};
}

Spd::Key Spd::portless_key(Shape s, const IpAddr &src, const IpAddr &dst, uint8_t proto)
{
    s.sport = s.dport = false;
    return key_of(s, src, dst, proto, 0, 0);
}

uint32_t Spd::add(const PolicyConfig &p)
{
    uint32_t id = uint32_t(all_.size());
    all_.push_back(p);
    // After every policy of the same or a lower priority value: at the end, for a config
    // written in priority order.
    auto &v = by_dir_[size_t(p.dir)];
    auto before = [&](uint32_t prio, uint32_t other) { return prio < all_[other].priority; };
    v.insert(std::upper_bound(v.begin(), v.end(), p.priority, before), id);

    const Selector &s = p.sel;
    if (s.src.addr.family != s.dst.addr.family)
        return id;  // matches no packet: nothing to index
    Shape shape{s.src.addr.family, s.src.len, s.dst.len, s.proto != 0, s.sport_set, s.dport_set};
    auto &bins = bins_[size_t(p.dir)];
    auto same = [&](const Bin &b) { return b.shape == shape; };
    auto bin = std::find_if(bins.begin(), bins.end(), same);
    if (bin == bins.end())
        bin = bins.insert(bins.end(), Bin{shape, kNone, {}, {}});
    Rank rank = Rank(p.priority) << 32 | id;
    Key key = key_of(shape, s.src.addr, s.dst.addr, s.proto, s.sport, s.dport);
    auto [at, fresh] = bin->exact.try_emplace(key, rank);
    if (!fresh)
        at->second = std::min(at->second, rank);
    bool reorder = rank < bin->best;  // a new bin, or a better best
    bin->best = std::min(bin->best, rank);
    if (has_ports(s) && (p.tmpl || p.action == Action::Block)) {
        Key key_portless = portless_key(shape, s.src.addr, s.dst.addr, s.proto);
        auto [pl, pl_fresh] = bin->portless.try_emplace(key_portless, rank);
        if (!pl_fresh)
            pl->second = std::min(pl->second, rank);
    }
    if (reorder)
        std::stable_sort(bins.begin(), bins.end(),
                         [](const Bin &a, const Bin &b) { return a.best < b.best; });
    return id;
}

const PolicyConfig *Spd::lookup(Dir dir, const FlowKey &f, bool *unsure) const
{
    Rank found = kNone, shadow = kNone;
    for (const Bin &b : bins_[size_t(dir)]) {
        const Shape &s = b.shape;
        if (s.family != f.src.family || s.family != f.dst.family)
            continue;
        if (!f.fragment) {
            if (b.best >= found)
                break;  // bins are in order of their best rank
            auto it = b.exact.find(key_of(s, f.src, f.dst, f.proto, f.sport, f.dport));
            if (it != b.exact.end())
                found = std::min(found, it->second);
            continue;
        }
        // A fragment: no ports, so shapes with ports can only make it unsure.
        if (!s.sport && !s.dport) {
            auto it = b.exact.find(key_of(s, f.src, f.dst, f.proto, 0, 0));
            if (it != b.exact.end())
                found = std::min(found, it->second);
        } else if (!b.portless.empty()) {
            auto it = b.portless.find(portless_key(s, f.src, f.dst, f.proto));
            if (it != b.portless.end())
                shadow = std::min(shadow, it->second);
        }
    }
    if (unsure && shadow < found)
        *unsure = true;
    return found == kNone ? nullptr : &all_[uint32_t(found)];
}

const PolicyConfig *Spd::lookup_linear(Dir dir, const FlowKey &f, bool *unsure) const
{
    for (uint32_t id : by_dir_[size_t(dir)]) {
        const PolicyConfig &p = all_[id];
        const Selector &s = p.sel;
        if (!f.fragment) {
            if (s.matches(f.src, f.dst, f.proto, f.sport, f.dport))
                return &p;
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
