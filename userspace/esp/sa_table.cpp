#include "userspace/esp/sa_table.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

namespace xesp {

size_t SaKeyHash::operator()(const SaKey &k) const
{
    uint64_t a, b;
    std::memcpy(&a, k.dst.b.data(), 8);
    std::memcpy(&b, k.dst.b.data() + 8, 8);
    return mix64(a ^ mix64(b ^ (uint64_t(k.spi) << 8 | k.dst.family)));
}

namespace {
inline uint64_t rotl_meta(uint64_t m)
{
    return (m << 29 | m >> 35) * 0xff51afd7ed558ccdull;
}
}  // namespace

size_t SaKeyHash::flow(const IpAddr &src, const IpAddr &dst, uint32_t reqid)
{
    // Looked up for every packet to encrypt: the words are spread by independent multiplies
    // (odd constants, run side by side) and mixed once, not one mix after another.
    uint64_t w[4];
    std::memcpy(w, src.b.data(), 16);
    std::memcpy(w + 2, dst.b.data(), 16);
    uint64_t meta = uint64_t(reqid) << 16 | src.family << 8 | dst.family;
    return mix64((w[0] * 0x9e3779b97f4a7c15ull) ^ (w[1] * 0xc2b2ae3d27d4eb4full) ^
                 (w[2] * 0x165667b19e3779f9ull) ^ (w[3] * 0xd6e8feb86659fd93ull) ^ rotl_meta(meta));
}

uint32_t IdPool::take()
{
    if (free_.size() > kReuseAfter) {
        uint32_t id = free_.front();
        free_.pop_front();
        return id;
    }
    return next_++;
}

void IdPool::give_back(uint32_t id)
{
    uint32_t index = id & SaTable::kIndexMask;
    uint32_t gen = (id >> 24) + 1;
    uint32_t next = (gen & 0xff) << 24 | index;
    if (next == SaTable::kNoId)  // kNoId is never an id
        next = index;
    free_.push_back(next);
}

SaTable::FlowSlot &SaTable::flow_slot(const FlowSaKey &k)
{
    FlowSlot &slot = by_flow_[k];
    if (!slot.flow)
        slot.flow = std::make_unique<OutFlow>(OutFlow{.key = k});
    return slot;
}

void SaTable::flow_add(const FlowSaKey &k, uint64_t order, Sa *sa)
{
    FlowSlot &slot = flow_slot(k);
    OutFlow &f = *slot.flow;
    auto at = std::upper_bound(f.all.begin(), f.all.end(), order,
                               [](uint64_t o, const auto &e) { return o < e.first; });
    f.all.insert(at, {order, sa});
    f.newest = slot.newest = f.all.back().second;
}

void SaTable::flow_remove(const FlowSaKey &k, Sa *sa)
{
    FlowSlot *slot = by_flow_.find(k);
    if (!slot)
        return;
    OutFlow &f = *slot->flow;
    std::erase_if(f.all, [&](const auto &e) { return e.second == sa; });
    f.newest = slot->newest = f.all.empty() ? nullptr : f.all.back().second;
    if (f.all.empty() && !f.links)
        by_flow_.erase(k);
}

const OutFlow *SaTable::link(const FlowSaKey &k)
{
    OutFlow &f = *flow_slot(k).flow;
    f.links++;
    return &f;
}

void SaTable::unlink(const OutFlow *linked)
{
    const FlowSaKey k = linked->key;  // erase() frees what `linked` points to
    FlowSlot *slot = by_flow_.find(k);
    assert(slot && slot->flow.get() == linked && linked->links > 0);
    if (--slot->flow->links == 0 && slot->flow->all.empty())
        by_flow_.erase(k);
}

void SaTable::index(Slot &s)
{
    const SaConfig &c = s.sa->config();
    by_spi_[SaKey{c.dst, c.spi}] = Found{s.sa.get(), s.id & kIndexMask};
    if (c.dir != Dir::In) {
        flow_add(FlowSaKey{c.src, c.dst, c.reqid}, s.order, s.sa.get());
        if (c.reqid)
            flow_add(FlowSaKey{c.src, c.dst, 0}, s.order, s.sa.get());
    }
    if (c.lifetime.has_time()) {
        s.timed_at = uint32_t(timed_.size());
        timed_.push_back(s.sa.get());
        timed_slot_.push_back(s.id & kIndexMask);
    }
}

void SaTable::unindex(Slot &s)
{
    const SaConfig &c = s.sa->config();
    SaKey k{c.dst, c.spi};
    if (const Found *f = by_spi_.find(k); f && f->sa == s.sa.get())
        by_spi_.erase(k);
    if (c.dir != Dir::In) {
        flow_remove(FlowSaKey{c.src, c.dst, c.reqid}, s.sa.get());
        if (c.reqid)
            flow_remove(FlowSaKey{c.src, c.dst, 0}, s.sa.get());
    }
    if (s.timed_at != kNotTimed) {
        // The last one into its place: a delete costs the same whatever the number of SAs.
        const uint32_t at = s.timed_at, last = uint32_t(timed_.size() - 1);
        timed_[at] = timed_[last];
        timed_slot_[at] = timed_slot_[last];
        slots_[timed_slot_[at]].timed_at = at;
        timed_.pop_back();
        timed_slot_.pop_back();
        s.timed_at = kNotTimed;
    }
}

void SaTable::put(uint32_t id, uint64_t order, std::shared_ptr<Sa> sa)
{
    size_t i = id & kIndexMask;
    if (i >= slots_.size()) {
        slots_.resize(i + 1);
        all_.resize(i + 1);
    }
    Slot &s = slots_[i];
    if (s.sa) {
        unindex(s);
        if (s.id == id)
            order = s.order;  // in place: its place among the SAs of its flow stays
    } else {
        count_++;
    }
    s = Slot{id, kNotTimed, order, std::move(sa)};
    all_[i] = s.sa;
    index(s);
}

void SaTable::remove(uint32_t id)
{
    size_t i = id & kIndexMask;
    if (i >= slots_.size() || slots_[i].id != id || !slots_[i].sa)
        return;
    unindex(slots_[i]);
    slots_[i] = Slot{};
    all_[i].reset();
    count_--;
}

uint32_t SaTable::add(std::shared_ptr<Sa> sa)
{
    uint32_t id = added_++;
    put(id, id, std::move(sa));
    return id;
}

uint32_t SaTable::id_of(const Sa &sa) const
{
    const SaConfig &c = sa.config();
    const Found *f = by_spi_.find(SaKey{c.dst, c.spi});
    return f && f->sa == &sa ? slots_[f->index].id : kNoId;
}

const std::shared_ptr<Sa> &SaTable::ref(uint32_t id) const
{
    static const std::shared_ptr<Sa> none;
    size_t i = id & kIndexMask;
    return i < slots_.size() && slots_[i].id == id ? slots_[i].sa : none;
}

std::shared_ptr<Sa> SaTable::share(const SaConfig &cfg) const
{
    const Found *f = by_spi_.find(SaKey{cfg.dst, cfg.spi});
    if (!f || !same_sa(f->sa->config(), cfg))
        return nullptr;
    return slots_[f->index].sa;
}

Sa *SaTable::find_in(const IpAddr &dst, uint32_t spi) const
{
    const Found *f = std::as_const(by_spi_).find(SaKey{dst, spi});
    return f ? f->sa : nullptr;
}

SaTable::OutKey SaTable::out_key(const PolicyTmpl &tmpl, const FlowKey &flow) const
{
    // Transport templates may leave the addresses out: they are the packet's own.
    const IpAddr &src = tmpl.src.family ? tmpl.src : flow.src;
    const IpAddr &dst = tmpl.dst.family ? tmpl.dst : flow.dst;
    OutKey k{FlowSaKey{src, dst, tmpl.reqid}, 0, tmpl.spi, tmpl.mode};
    if (k.spi) {
        k.hash = by_spi_.hash(SaKey{dst, k.spi});
        by_spi_.prefetch(k.hash);
    } else {
        k.hash = SaKeyHash::flow(src, dst, tmpl.reqid);  // = by_flow_.hash(k.flow)
        by_flow_.prefetch(k.hash);
    }
    return k;
}

Sa *SaTable::out_candidate(OutKey &k) const
{
    Sa *sa;
    if (k.spi) {
        const Found *f = by_spi_.find(SaKey{k.flow.dst, k.spi}, k.hash);
        sa = f ? f->sa : nullptr;
    } else {
        const FlowSlot *f = by_flow_.find(k.flow, k.hash);
        k.found = f ? f->flow.get() : nullptr;  // read by out_check() only for a held SA
        sa = f ? f->newest : nullptr;
    }
    if (sa)
        sa->prefetch_state();
    return sa;
}

Sa *SaTable::out_check(Sa *sa, const OutKey &k) const
{
    if (!sa)
        return nullptr;
    if (!k.spi) {
        // Make before break: a new SA still held (its sequence numbers not yet on disk)
        // leaves the flow to the one before it until it may send.
        if (sa->held()) [[unlikely]] {
            const auto &all = k.found->all;
            for (size_t i = all.size() - 1; i-- > 0;)
                if (!all[i].second->held()) {
                    sa = all[i].second;
                    break;
                }
        }
        // The flow's key is the SA's source, and it holds no `dir in` SA.
        return sa->tunnel() == (k.mode == Mode::Tunnel) ? sa : nullptr;
    }
    const SaConfig &c = sa->config();
    return c.src == k.flow.src && c.mode == k.mode && c.dir != Dir::In ? sa : nullptr;
}

Sa *SaTable::find_out(const PolicyTmpl &tmpl, const FlowKey &flow) const
{
    OutKey k = out_key(tmpl, flow);
    return out_check(out_candidate(k), k);
}

}  // namespace xesp
