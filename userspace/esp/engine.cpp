#include "userspace/esp/engine.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "bpf/abi_check.h"
#include "userspace/esp/icmp.h"
#include "userspace/base/clock.h"
#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

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

bool tmpl_matches(const PolicyTmpl &t, const SaConfig &sa)
{
    return (!t.spi || t.spi == sa.spi) && (!t.reqid || t.reqid == sa.reqid) && t.mode == sa.mode &&
           (!t.src.family || t.src == sa.src) && (!t.dst.family || t.dst == sa.dst);
}

void Engine::put_policy(Tables &t, uint32_t id, uint32_t order, const Spd::Policy &p)
{
    if (const OutFlow *old = t.spd.link_of(id))
        t.sas.unlink(old);
    // Linked: an out policy whose template names its flow whole. One that leaves an address
    // to the packet, or names its SA by SPI, is looked up per packet (SaTable::out_key()).
    const PolicyTmpl *tmpl = p->tmpl ? &*p->tmpl : nullptr;
    const OutFlow *link = nullptr;
    if (p->dir == Dir::Out && p->action == Action::Allow && tmpl && !tmpl->spi &&
        tmpl->src.family && tmpl->dst.family)
        link = t.sas.link(FlowSaKey{tmpl->src, tmpl->dst, tmpl->reqid});
    t.spd.put(id, order, p, link);
}

void Engine::remove_policy(Tables &t, uint32_t id)
{
    if (const OutFlow *old = t.spd.link_of(id))
        t.sas.unlink(old);
    t.spd.remove(id);
}

Result<std::shared_ptr<Sa>> Engine::make_sa(const SaConfig &c, Backend backend) const
{
    auto made = Sa::create(c, backend);
    if (!made)
        return make_error("sa dst " + c.dst.str() + " spi " + std::to_string(c.spi) + ": " +
                          made.error().message);
    std::shared_ptr<Sa> sa = std::move(*made);
    if (options_.on_expire)
        sa->on_expire(options_.on_expire);
    if (options_.hold_new)
        sa->hold();
    return sa;
}

Result<std::unique_ptr<Engine>> Engine::create(const Config &config, Backend backend,
                                               const EngineOptions &options, const Engine *prev,
                                               Qsbr *readers)
{
    std::unique_ptr<Engine> e(new Engine(readers));
    e->options_ = options;
    // SAs that stay as they were keep running; the others start afresh.
    std::vector<std::shared_ptr<Sa>> sas;
    sas.reserve(config.sas.size());
    for (const SaConfig &c : config.sas) {
        std::shared_ptr<Sa> sa = prev ? prev->sas().share(c) : nullptr;
        if (!sa) {
            auto made = e->make_sa(c, backend);
            if (!made)
                return made.error();
            sa = std::move(*made);
            const Sa *kept = prev ? prev->sas().find_in(c.dst, c.spi) : nullptr;
            if (kept && same_keys(kept->config(), c))
                sa->follow(prev->sas().ref(prev->sas().id_of(*kept)));
        }
        sas.push_back(std::move(sa));
    }
    std::vector<Spd::Policy> policies;
    policies.reserve(config.policies.size());
    for (const PolicyConfig &p : config.policies)
        policies.push_back(std::make_shared<const PolicyConfig>(p));
    for (size_t i = 0; i < sas.size(); i++)
        e->sa_ids_.take();  // ids 0..n-1: the indexes in config.sas
    for (size_t i = 0; i < policies.size(); i++) {
        e->policy_ids_.take();
        e->policy_ids_by_key_[PolicyKey{policies[i]->sel, policies[i]->dir}] = uint32_t(i);
    }
    e->sa_order_ = sas.size();
    e->policy_order_ = uint32_t(policies.size());
    e->tables_.change([&](Tables &t) {
        for (size_t i = 0; i < sas.size(); i++)
            t.sas.put(uint32_t(i), i, sas[i]);
        for (size_t i = 0; i < policies.size(); i++)
            put_policy(t, uint32_t(i), uint32_t(i), policies[i]);
    });
    return e;
}

void Engine::take_over()
{
    for (const auto &sa : sas().all())
        if (sa && sa->following())
            sa->take_over();
}

Result<Engine::Prepared> Engine::prepare(const EngineChange &ch, Backend backend)
{
    const Tables &t = tables_.standby();
    Prepared p;
    auto fail = [&](std::string msg) -> Result<Prepared> {
        abandon(std::move(p));
        return make_error(std::move(msg));
    };
    // A key both deleted and put is put afresh: a new id, the newest of its flow.
    std::unordered_map<SaKey, bool, SaKeyHash> dels, puts;
    for (const SaKey &k : ch.del_sas) {
        Sa *sa = t.sas.find_in(k.dst, k.spi);
        if (!sa || !dels.emplace(k, true).second)
            return fail("no " + describe_sa(k.dst, k.spi) + " to delete");
        p.sa_dels.push_back({t.sas.id_of(*sa), k});
    }
    for (const SaConfig &c : ch.put_sas) {
        SaKey k{c.dst, c.spi};
        if (!puts.emplace(k, true).second)
            return fail(describe_sa(c.dst, c.spi) + " twice in one change");
        Sa *old = dels.count(k) ? nullptr : t.sas.find_in(c.dst, c.spi);
        if (old && same_sa(old->config(), c))
            continue;  // as it is: keeps running
        auto made = make_sa(c, backend);
        if (!made)
            return fail(made.error().message);
        uint32_t id;
        bool fresh = !old;
        if (old) {
            id = t.sas.id_of(*old);
            if (same_keys(old->config(), c))
                (*made)->follow(t.sas.ref(id));
        } else {
            id = sa_ids_.take();
            // Deleted and put again under the same keys (a flush and reload): a new id, the
            // newest of its flow, but the same sequence numbers and replay window go on.
            if (Sa *gone = dels.count(k) ? t.sas.find_in(c.dst, c.spi) : nullptr;
                gone && same_keys(gone->config(), c))
                (*made)->follow(t.sas.ref(t.sas.id_of(*gone)));
        }
        p.sa_puts.push_back(
            {id, fresh ? sa_order_ + p.sa_puts.size() : 0, std::move(*made), fresh});
    }
    std::unordered_map<PolicyKey, bool, ConfigKeyHash> pol_dels, pol_puts;
    for (const PolicyKey &k : ch.del_policies) {
        auto it = policy_ids_by_key_.find(k);
        if (it == policy_ids_by_key_.end() || !pol_dels.emplace(k, true).second)
            return fail("no such policy to delete");
        p.policy_dels.push_back({it->second, t.spd.ref(it->second)});
    }
    for (const PolicyConfig &pc : ch.put_policies) {
        PolicyKey k{pc.sel, pc.dir};
        if (!pol_puts.emplace(k, true).second)
            return fail("one policy twice in one change");
        auto it = pol_dels.count(k) ? policy_ids_by_key_.end() : policy_ids_by_key_.find(k);
        const PolicyConfig *old =
            it == policy_ids_by_key_.end() ? nullptr : t.spd.by_id(it->second);
        if (old && same_policy(*old, pc))
            continue;
        Prepared::PolicyPut put;
        put.policy = std::make_shared<const PolicyConfig>(pc);
        if (old) {
            put.id = it->second;
            put.order = t.spd.order_of(put.id);
            put.old = t.spd.ref(put.id);
        } else {
            put.id = policy_ids_.take();
            put.order = policy_order_ + uint32_t(p.policy_puts.size());
        }
        p.policy_puts.push_back(std::move(put));
    }
    return p;
}

void Engine::abandon(Prepared &&p)
{
    for (const auto &put : p.sa_puts)
        if (put.fresh)
            sa_ids_.give_back(put.id);
    for (const auto &put : p.policy_puts)
        if (!put.old)
            policy_ids_.give_back(put.id);
    p = Prepared{};
}

void Engine::commit(Prepared &&p)
{
    const uint64_t generation = ++generation_;
    tables_.change([&](Tables &t) {
        t.generation = generation;
        for (const auto &del : p.sa_dels)
            t.sas.remove(del.id);
        for (const auto &put : p.sa_puts)
            t.sas.put(put.id, put.order, put.sa);
        for (const auto &del : p.policy_dels)
            remove_policy(t, del.id);
        for (const auto &put : p.policy_puts)
            put_policy(t, put.id, put.order, put.policy);
    });
    // Both copies have changed; no reader holds what left them.
    for (const auto &del : p.sa_dels)
        sa_ids_.give_back(del.id);
    for (const auto &del : p.policy_dels) {
        policy_ids_by_key_.erase(PolicyKey{del.old->sel, del.old->dir});
        policy_ids_.give_back(del.id);
    }
    for (const auto &put : p.policy_puts)
        policy_ids_by_key_[PolicyKey{put.policy->sel, put.policy->dir}] = put.id;
    for (const auto &put : p.sa_puts)
        if (put.fresh)
            sa_order_ = std::max(sa_order_, put.order + 1);
    for (const auto &put : p.policy_puts)
        policy_order_ = std::max(policy_order_, put.order + 1);
}

Result<void> Engine::change(const EngineChange &ch, Backend backend)
{
    auto p = prepare(ch, backend);
    if (!p)
        return p.error();
    commit(std::move(*p));
    return {};
}

void Engine::on_expire(Sa::ExpireFn fn)
{
    for (const auto &sa : sas().all())
        if (sa)
            sa->on_expire(fn);
}

void Engine::check_time(uint64_t now)
{
    for (Sa *sa : sas().timed())
        sa->check_time(now);
}

size_t Engine::check_time_some(uint64_t now)
{
    const std::vector<Sa *> &timed = sas().timed();
    const size_t n = timed.size();
    const uint64_t dt = time_last_ && now > time_last_ ? now - time_last_ : 0;
    time_last_ = now;
    if (!n) {
        time_owed_ = 0;
        return 0;
    }
    size_t k;
    if (dt >= kSecondNs) {
        k = n;  // a second or more since the last call: all of them
        time_owed_ = 0;
    } else {
        time_owed_ += n * dt;  // under 2^24 SAs times under 2^30 ns
        k = std::min<uint64_t>(time_owed_ / kSecondNs, n);
        time_owed_ -= k * kSecondNs;
    }
    // The list changes with the SAs, and the round goes on from an index. An SA comes in at
    // the end (an SA updated in place too, so it may be checked twice in a round); when one
    // the round has passed leaves, the last takes its place and waits for the next round
    // (SaTable::unindex()): late by under a second.
    for (size_t i = 0; i < k; i++) {
        if (time_next_ >= n)
            time_next_ = 0;
        timed[time_next_++]->check_time(now);
    }
    return k;
}

Engine::Dirn Engine::classify_esp(const Tables &t, Pkt &p, const uint8_t *ip, uint32_t esp_off,
                                  bool udp, const IpAddr &dst, Sa **sa)
{
    if (esp_off + kEspHdrLen > p.len) {
        p.set_drop(Drop::InTruncated);
        return Dirn::None;
    }
    *sa = t.sas.find_in(dst, get32(ip + esp_off));
    if (!*sa) {
        stats_.esp_unknown_spi++;  // somebody else's SA: the kernel's business
        return Dirn::None;
    }
    if (!inbound(**sa)) {
        p.set_drop(Drop::InReflected);
        return Dirn::None;
    }
    if ((*sa)->natt() != udp) {
        p.set_drop(Drop::InEncapMismatch);
        return Dirn::None;
    }
    p.l4 = uint16_t(esp_off);
    return Dirn::Decap;
}

bool Engine::inbound(const Sa &sa) const
{
    const SaConfig &c = sa.config();
    if (c.dir != Dir::Unspec)
        return c.dir == Dir::In;
    return !options_.local || std::find(options_.local->begin(), options_.local->end(), c.dst) !=
                                  options_.local->end();
}

// An IP header whose lengths lie. If it claims to carry ESP it is dropped and counted here;
// anything else is left to the kernel, which drops it too.
static Engine::Dirn bad_length(Pkt &p, uint8_t proto)
{
    if (proto == kProtoEsp || proto == kProtoUdp)
        p.set_drop(Drop::InBadLength);
    return Engine::Dirn::None;
}

Engine::Dirn Engine::classify_begin(const Tables &t, Pkt &p, Step &s, Sa **sa, bool plain_only)
{
    *sa = nullptr;
    s.stage = Step::Done;
    uint8_t *ip = p.ip();
    IpHeader h;
    IpParse st = parse_ip(ip, p.len, &h);
    if (plain_only && st != IpParse::Ok) {
        // Sent here because a policy protects it: what cannot be read goes nowhere.
        p.set_drop(Drop::OutBadInner);
        return Dirn::None;
    }
    if (st == IpParse::NotIp)
        return Dirn::None;
    if (!lengths_ok(st))
        return bad_length(p, h.proto);
    p.len = h.total;  // drop link-layer padding
    if (st != IpParse::Ok)
        return Dirn::None;  // IPv6 extension headers cut short: the kernel's
    // ESP fragments are reassembled by the kernel first. All other fragments, UDP ones too
    // (ESP in UDP or not, only the first one has ports), go to the SPD: a protected flow's
    // fragments must not leave in the clear.
    if (h.fragment && h.proto == kProtoEsp && !plain_only)
        return Dirn::None;
    const uint32_t off = h.l4_off;
    if (plain_only) {
        flow_from_header(h, &s.flow);
        t.spd.prefetch(Dir::Out, s.flow, &s.probe);
        s.stage = Step::Policy;
        return Dirn::None;
    }
    if (h.proto == kProtoEsp)
        return classify_esp(t, p, ip, off, false, h.dst(), sa);
    if (!h.fragment && h.proto == kProtoUdp && off + kUdpLen <= p.len &&
        get16(ip + off + 2) == kNatTPort) {
        uint32_t payload = p.len - off - kUdpLen;
        const uint8_t *d = ip + off + kUdpLen;
        if (payload == 1 && d[0] == 0xff) {  // NAT keepalive (RFC 3948 2.3)
            stats_.keepalive++;
            return Dirn::None;
        }
        if (payload >= 4 && get32(d) == 0) {  // non-ESP marker: IKE (RFC 3948 2.2)
            stats_.ike++;
            return Dirn::None;
        }
        if (payload == 0)
            return Dirn::None;
        return classify_esp(t, p, ip, off + kUdpLen, true, h.dst(), sa);
    }

    flow_from_header(h, &s.flow);
    t.spd.prefetch(Dir::Out, s.flow, &s.probe);
    s.stage = Step::Policy;
    return Dirn::None;
}

// A policy linked to its flow (OutFlow), asked for with the policy: the flow's SA is at hand
// for the Check step, with no lookup (OutSa) in between.
void Engine::from_link(Step &s, const PolicyTmpl &tmpl)
{
    s.out.spi = 0;
    s.out.mode = tmpl.mode;
    s.out.found = s.link;
    s.sa = s.link->newest;
    if (s.sa)
        s.sa->prefetch_state();
    s.stage = Step::Check;
}

namespace {

// Every line of a policy: its template ends past the first two wherever it starts in a line.
void prefetch_policy(const PolicyConfig *pol)
{
    if (!pol)
        return;
    const char *at = reinterpret_cast<const char *>(pol);
    for (size_t off = 0; off < sizeof(PolicyConfig); off += 64)
        __builtin_prefetch(at + off);
    __builtin_prefetch(at + sizeof(PolicyConfig) - 1);
}

}  // namespace

// One step of a packet's classification; each asks for what the next one reads. The steps
// after Policy are the same for process() and process_classified(): the policy's template,
// then the SA it names, then whether that SA may carry the packet.
Engine::Dirn Engine::classify_step(const Tables &t, Pkt &p, Step &s, Sa **sa)
{
    switch (s.stage) {
    case Step::Done:
        break;
    case Step::Policy:
        s.unsure = false;
        s.pol = t.spd.lookup(Dir::Out, s.flow, &s.unsure, s.probe, &s.link);
        prefetch_policy(s.pol);
        if (s.link)
            __builtin_prefetch(s.link);
        s.stage = Step::Tmpl;
        break;
    case Step::Tmpl: {
        s.stage = Step::Done;
        const PolicyConfig *pol = s.pol;
        if (s.unsure && !(pol && pol->tmpl)) {
            p.set_drop(Drop::FragmentUnclassifiable);
            return Dirn::None;
        }
        if (!pol)
            return check_unprotected(t, p, s.flow);
        if (pol->action == Action::Block) {
            p.set_drop(Drop::OutPolBlock);
            return Dirn::None;
        }
        if (!pol->tmpl)
            return Dirn::None;
        if (s.link) {
            from_link(s, *pol->tmpl);
            break;
        }
        s.out = t.sas.out_key(*pol->tmpl, s.flow);
        s.stage = Step::OutSa;
        break;
    }
    case Step::OutSa:
        s.sa = t.sas.out_candidate(s.out);
        s.stage = Step::Check;
        break;
    case Step::Check:
        s.stage = Step::Done;
        *sa = t.sas.out_check(s.sa, s.out);
        if (!*sa) {
            // Fail closed: the policy says protect, and there is nothing to protect it with.
            p.set_drop(Drop::OutNoStates);
            return Dirn::None;
        }
        return Dirn::Encap;
    case Step::ById:
        s.pol = t.spd.by_id(s.id, &s.link);
        prefetch_policy(s.pol);
        if (s.link)
            __builtin_prefetch(s.link);
        s.stage = Step::ByIdPolicy;
        break;
    case Step::ByIdPolicy:
        return resolve_encap(t, p, s, sa);
    case Step::DecapId:
        // The SA the classifier found: its runtime part, and the configuration the packet
        // is checked against, are asked for; resolve_decap() reads them.
        s.sa = t.sas.by_id(s.id);
        if (s.sa) {
            s.sa->prefetch_state();
            __builtin_prefetch(&s.sa->config());
            __builtin_prefetch(reinterpret_cast<const char *>(&s.sa->config()) + 64);
            s.stage = Step::DecapCheck;
            break;
        }
        s.stage = Step::Done;
        stats_.reclassified++;
        return classify(t, p, sa);  // an id a change has just removed: looked up again
    case Step::DecapCheck:
        return resolve_decap(p, s, sa);
    }
    return Dirn::None;
}

Engine::Dirn Engine::classify(const Tables &t, Pkt &p, Sa **sa)
{
    Step s;
    Dirn d = classify_begin(t, p, s, sa);
    while (s.stage != Step::Done)
        d = classify_step(t, p, s, sa);
    return d;
}

// Plaintext no outbound policy claims: if an inbound policy says it must arrive protected, it
// did not, and is dropped (RFC 4301 5.2; the kernel counts it as XfrmInTmplMismatch).
Engine::Dirn Engine::check_unprotected(const Tables &t, Pkt &p, const FlowKey &flow)
{
    bool unsure = false;
    const PolicyConfig *pol = t.spd.lookup(Dir::In, flow, &unsure);
    if (!pol)
        pol = t.spd.lookup(Dir::Fwd, flow, &unsure);
    if (pol && pol->action == Action::Block)
        p.set_drop(Drop::InPolBlock);
    else if (pol && pol->tmpl)
        p.set_drop(Drop::InUnprotected);
    else if (unsure)
        p.set_drop(Drop::FragmentUnclassifiable);
    return Dirn::None;
}

// RFC 4301 5.2: what came out of an SA must be what an inbound policy expects from it. A
// packet no in or fwd policy covers is dropped (the kernel's XfrmInNoPols): an SA carries
// only the traffic a policy put in it, whichever peer holds its keys.
void Engine::inbound_policy_check(const Tables &t, Sa &sa, Pkt &p)
{
    FlowKey flow;
    if (!parse_flow(p.ip(), p.len, &flow)) {
        p.set_drop(Drop::InBadInner);
        return;
    }
    const PolicyConfig *pol = t.spd.lookup(Dir::In, flow);
    if (!pol)
        pol = t.spd.lookup(Dir::Fwd, flow);
    if (!pol) {
        p.set_drop(Drop::InNoPolicy);
        return;
    }
    if (pol->action == Action::Block)
        p.set_drop(Drop::InPolBlock);
    else if (pol->tmpl ? !tmpl_matches(*pol->tmpl, sa.config()) : sa.tunnel())
        p.set_drop(Drop::InTmplMismatch);
}

// A packet that would not fit the egress link (or the SA's learnt path MTU) once encrypted,
// and may not be fragmented, is answered with the MTU that fits. One that may be fragmented
// (IPv4 without DF) goes on: its outer header has DF clear too.
bool Engine::too_big(Sa &sa, Pkt &p)
{
    uint32_t mtu = sa.outer_mtu(options_.link_mtu);
    if (!mtu)
        return false;
    uint32_t fits = sa.inner_mtu(mtu);
    if (p.len <= fits || may_fragment(p))
        return false;
    bool v4 = ip_version(p.ip()) == 4;
    IpAddr from = v4 ? options_.icmp_src4 : options_.icmp_src6;
    if (!from.family)
        from = sa.config().src;
    if (!icmp_too_big(p, from, fits))
        p.set_drop(Drop::OutTooBig);  // no address to answer from, or an ICMP error
    return true;
}

void Engine::account(Pkt &p, Sa *sa)
{
    switch (p.verdict) {
    case Verdict::TooBig:
        stats_.too_big++;
        break;
    case Verdict::TimeExceeded:  // the gateway's, never the engine's
        break;
    case Verdict::Pass:
        stats_.passed++;
        break;
    case Verdict::Encrypted:
        stats_.encrypted++;
        break;
    case Verdict::Decrypted:
        stats_.decrypted++;
        break;
    case Verdict::Drop:
        stats_.dropped++;
        stats_.drops.drop(p.drop);
        if (sa)
            sa->counters().drop(p.drop);
        break;
    }
}

// The part of process() and process_classified() after classification: packets that go to an
// SA are grouped by SA and direction (keeping their order within a group); each group's
// packets are prepared for ESP, the crypto runs for all groups at once, then each group is
// finished, decrypted packets go through the inbound policy check, and every packet is
// counted. n <= kMaxBurst.
//
// With traffic spread over many SAs every group may be a single packet whose SA is not in
// cache. So the caller asks for each SA's runtime part as it classifies the packet
// (Sa::prefetch_state()); grouping finds the group through a small hash of the SA's address
// and asks for the cipher's keys as it meets a new SA, which the crypto reads after every
// group is prepared; and the crypto gets one call per direction whatever the number of SAs,
// so that a backend that works on several packets side by side fills its lanes across SAs
// (crypt_burst()).
// A burst's packets grouped by SA and direction, each group through its SA's prepare step.
// With `threads`, the groups whose cipher must stay on this thread (not thread_safe()) come
// first, and their ops, [0, enc_here) and [0, dec_here), are written (write_encap()) and run
// here at once; the rest is crypt()'s, on whatever thread.
void Engine::prepare_burst(Burst &b, bool threads)
{
    constexpr size_t kSlots = 2 * kMaxBurst;  // hash slots: at most half full
    static_assert(kMaxBurst <= UINT8_MAX && (kSlots & (kSlots - 1)) == 0);
    uint8_t slot[kSlots];  // group index + 1; 0 = free
    uint8_t group_of[kMaxBurst];
    std::memset(slot, 0, sizeof slot);
    Burst::Group *groups = b.groups;
    size_t ngroups = 0;
    for (size_t i = 0; i < b.n; i++) {
        Dirn d = b.dirn[i];
        if (d == Dirn::None)
            continue;
        Sa *sa = b.owner[i];
        uint64_t key = uint64_t(reinterpret_cast<uintptr_t>(sa)) | uint64_t(d == Dirn::Decap);
        size_t h = size_t(((key >> 6) ^ key) * 0x9e3779b97f4a7c15ull >> 57) & (kSlots - 1);
        while (slot[h] && !(groups[slot[h] - 1].sa == sa && groups[slot[h] - 1].dirn == d))
            h = (h + 1) & (kSlots - 1);
        if (!slot[h]) {
            // The keys for the cipher here, if it runs here; a worker's crypt_burst() asks
            // for its own (here they would only fill this core's cache, and hold up the
            // serial steps with many SAs).
            if (!threads || !sa->crypt_anywhere())
                sa->prefetch_crypto();
            groups[ngroups] = Burst::Group{sa, d, 0, 0, 0, 0};
            slot[h] = uint8_t(++ngroups);
        }
        group_of[i] = uint8_t(slot[h] - 1);
        groups[slot[h] - 1].n++;
    }
    b.ngroups = ngroups;
    size_t total = 0;
    for (size_t g = 0; g < ngroups; g++) {
        groups[g].first = uint8_t(total);
        total += groups[g].n;
        groups[g].n = 0;
    }
    for (size_t i = 0; i < b.n; i++) {
        if (b.dirn[i] != Dirn::None) {
            Burst::Group &gr = groups[group_of[i]];
            b.sorted[gr.first + gr.n++] = b.pkts[i];
        }
    }

    b.enc.n = b.dec.n = 0;
    auto prepare = [&](Burst::Group &gr) {
        Pkt **gp = b.sorted + gr.first;
        if (gr.sa->following()) [[unlikely]]
            gr.sa->take_over();
        bool out = gr.dirn == Dirn::Encap;
        EspBurst &eb = out ? b.enc : b.dec;
        gr.from = uint8_t(eb.n);
        if (out) {
            size_t k = 0;  // the group without the packets too big for the tunnel
            for (size_t i = 0; i < gr.n; i++)
                if (!too_big(*gr.sa, *gp[i]))
                    gp[k++] = gp[i];
            esp_encap_prepare(*gr.sa, gp, k, eb);
        } else {
            esp_decap_prepare(*gr.sa, gp, gr.n, eb);
        }
        gr.to = uint8_t(eb.n);
    };
    if (threads)
        for (size_t g = 0; g < ngroups; g++)
            if (!groups[g].sa->crypt_anywhere())
                prepare(groups[g]);
    b.enc_here = b.enc.n;
    b.dec_here = b.dec.n;
    write_encap(b, true);
    crypt_burst(b.enc.cipher, b.enc.ops, b.enc_here, true);
    crypt_burst(b.dec.cipher, b.dec.ops, b.dec_here, false);
    for (size_t g = 0; g < ngroups; g++)
        if (!threads || groups[g].sa->crypt_anywhere())
            prepare(groups[g]);
}

// The headers and trailers of the encap groups whose ops are [0, enc_here) (`here`), or those
// after (esp_encap_write()): on the thread that encrypts them next.
void Engine::write_encap(Burst &b, bool here)
{
    auto mine = [&](const Burst::Group &gr) {
        return gr.dirn == Dirn::Encap && gr.from < gr.to && (gr.to <= b.enc_here) == here;
    };
    for (size_t g = 0; g < b.ngroups; g++)  // line 0 of each SA: its outer header, SPI, sizes
        if (mine(b.groups[g]))
            __builtin_prefetch(b.groups[g].sa);
    for (size_t g = 0; g < b.ngroups; g++)
        if (mine(b.groups[g]))
            esp_encap_write(*b.groups[g].sa, b.enc, b.groups[g].from, b.groups[g].to);
}

void Engine::crypt(Burst &b)
{
    write_encap(b, false);
    crypt_burst(b.enc.cipher + b.enc_here, b.enc.ops + b.enc_here, b.enc.n - b.enc_here, true);
    crypt_burst(b.dec.cipher + b.dec_here, b.dec.ops + b.dec_here, b.dec.n - b.dec_here, false);
}

void Engine::finish_burst(const Tables &t, Burst &b)
{
    for (size_t g = 0; g < b.ngroups; g++) {
        Burst::Group &gr = b.groups[g];
        if (gr.dirn == Dirn::Encap) {
            esp_encap_finish(*gr.sa, b.enc, gr.from, gr.to);
            continue;
        }
        esp_decap_finish(*gr.sa, b.dec, gr.from, gr.to);
        Pkt **gp = b.sorted + gr.first;
        for (size_t i = 0; i < gr.n; i++)
            if (gp[i]->verdict == Verdict::Decrypted)
                inbound_policy_check(t, *gr.sa, *gp[i]);
    }
    for (size_t i = 0; i < b.n; i++) {
        Pkt &p = *b.pkts[i];
        // A new packet where the old one was: whatever link-layer header sat in front of it
        // has been overwritten or left behind.
        if (p.verdict == Verdict::Encrypted || p.verdict == Verdict::Decrypted ||
            p.verdict == Verdict::TooBig)
            p.l2_len = 0;
        account(p, b.owner[i]);
    }
}

// A burst is classified in steps, each over every packet of the burst, so that the cache
// misses of the packets overlap: with traffic spread over thousands of tunnels each lookup
// (policy, template, SA) is a miss, and one packet after another would wait for each.
void Engine::classify_burst(const Tables &t, Pkt *const *pkts, Step *steps, Dirn *dirn, Sa **owner,
                            size_t n)
{
    for (bool more = true; more;) {
        more = false;
        for (size_t i = 0; i < n; i++) {
            if (steps[i].stage == Step::Done)
                continue;
            dirn[i] = classify_step(t, *pkts[i], steps[i], &owner[i]);
            more |= steps[i].stage != Step::Done;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (dirn[i] != Dirn::None)
            owner[i]->prefetch_state();  // read by prepare_burst(), after the whole burst
}

void Engine::process(Pkt *const *pkts, size_t n)
{
    const Tables &t = tables_.read();
    Burst b;
    Step steps[kMaxBurst];
    while (n) {
        size_t k = n < kMaxBurst ? n : kMaxBurst;
        for (size_t i = 0; i < k; i++) {
            pkts[i]->verdict = Verdict::Pass;
            b.dirn[i] = classify_begin(t, *pkts[i], steps[i], &b.owner[i]);
        }
        b.pkts = pkts;
        b.n = k;
        classify_burst(t, pkts, steps, b.dirn, b.owner, k);
        prepare_burst(b, false);
        crypt(b);
        finish_burst(t, b);
        pkts += k;
        n -= k;
    }
}

// ESP the classifier matched to an SA (s.id, found in the step before: s.sa). The SA is
// checked against the packet's own (destination, SPI), the key it was found by: an id from
// before a reload may name another SA now.
Engine::Dirn Engine::resolve_decap(Pkt &p, Step &s, Sa **sa)
{
    s.stage = Step::Done;
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h)) || s.l4 < h.hdr_len) {
        p.set_drop(Drop::InBadLength);
        return Dirn::None;
    }
    p.len = h.total;  // drop link-layer padding
    if (s.l4 + kEspHdrLen > p.len) {
        p.set_drop(Drop::InTruncated);
        return Dirn::None;
    }
    Sa *found = s.sa;  // by its id, in the step before
    if (found->config().spi != get32(p.ip() + s.l4) || found->config().dst != h.dst()) {
        p.set_drop(Drop::InNoStates);
        return Dirn::None;
    }
    *sa = found;
    if (!inbound(*found)) {
        p.set_drop(Drop::InReflected);
        return Dirn::None;
    }
    if (found->natt() != s.natt) {
        p.set_drop(Drop::InEncapMismatch);
        return Dirn::None;
    }
    p.l4 = s.l4;
    return Dirn::Decap;
}

// The SA that out policy pol protects a packet with: the newest SA its template names, or for a
// transport template without addresses the one for the packet's own addresses (from h, its IP
// header).
Sa *Engine::out_sa(const Tables &t, const PolicyConfig &pol, const IpHeader &h)
{
    FlowKey flow;
    if (!pol.tmpl->src.family || !pol.tmpl->dst.family) {
        flow.src = h.src();
        flow.dst = h.dst();
    }
    return t.sas.find_out(*pol.tmpl, flow);
}

// An out policy the classifier found (s.id, read in the ById step, which asked for the policy
// itself): its template then goes through the steps of classify_step().
Engine::Dirn Engine::resolve_encap(const Tables &t, Pkt &p, Step &s, Sa **sa)
{
    s.stage = Step::Done;
    const PolicyConfig *pol = s.pol;  // by_id(s.id)
    if (!pol) {  // an id a change has just removed: looked up again in these tables
        stats_.reclassified++;
        return classify(t, p, sa);
    }
    if (pol->dir != Dir::Out) {
        p.set_drop(Drop::OutNoStates);  // not a policy that protects: nothing to encrypt with
        return Dirn::None;
    }
    if (pol->action == Action::Block) {
        p.set_drop(Drop::OutPolBlock);
        return Dirn::None;
    }
    if (!pol->tmpl)
        return Dirn::None;  // bypass
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h))) {
        p.set_drop(Drop::OutBadInner);
        return Dirn::None;
    }
    p.len = h.total;
    if (s.link) {
        from_link(s, *pol->tmpl);
        return Dirn::None;
    }
    FlowKey flow;
    if (!pol->tmpl->src.family || !pol->tmpl->dst.family) {
        flow.src = h.src();
        flow.dst = h.dst();
    }
    s.out = t.sas.out_key(*pol->tmpl, flow);
    s.stage = Step::OutSa;
    return Dirn::None;
}

uint32_t Engine::natt_inner_mtu(const Classified &c, const Pkt &p)
{
    const Tables &t = tables_.read();
    if (c.kind != Classified::Encap && c.kind != Classified::Plain)
        return 0;
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h)))
        return 0;
    const PolicyConfig *pol = nullptr;
    if (c.kind == Classified::Encap) {
        pol = t.spd.by_id(c.id);
    } else {
        FlowKey flow;
        flow_from_header(h, &flow);
        pol = t.spd.lookup(Dir::Out, flow);
    }
    if (!pol || pol->dir != Dir::Out || pol->action == Action::Block || !pol->tmpl)
        return 0;
    Sa *sa = out_sa(t, *pol, h);
    // Transport mode carries whole datagrams only (RFC 4303 3.3.4): its packets are not split
    // before encryption, the outer packet is fragmented instead.
    uint32_t mtu = sa && sa->natt() && sa->tunnel() ? sa->outer_mtu(options_.link_mtu) : 0;
    return mtu ? sa->inner_mtu(mtu) : 0;
}

uint32_t Engine::plain_inner_mtu(const uint8_t *ip, uint32_t len)
{
    const Tables &t = tables_.read();
    IpHeader h;
    if (parse_ip(ip, len, &h) != IpParse::Ok)
        return 0;
    FlowKey flow;
    flow_from_header(h, &flow);
    const PolicyConfig *pol = t.spd.lookup(Dir::Out, flow);
    if (!pol || pol->action == Action::Block || !pol->tmpl)
        return 0;
    Sa *sa = out_sa(t, *pol, h);
    uint32_t mtu = sa ? sa->outer_mtu(options_.link_mtu) : 0;
    return mtu ? sa->inner_mtu(mtu) : 0;
}

// The start of process_classified() for one burst: its packets looked up from their ids,
// and classified further where the ids left off, into b.
void Engine::classify_ids(const Tables &t, Pkt *const *pkts, const Classified *cls, size_t n,
                          Burst &b)
{
    Step steps[kMaxBurst];
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *pkts[i];
        p.verdict = Verdict::Pass;
        b.owner[i] = nullptr;
        b.dirn[i] = Dirn::None;
        steps[i].stage = Step::Done;
        if (cls[i].kind == Classified::Decap) {
            steps[i].id = cls[i].id;
            steps[i].l4 = cls[i].l4;
            steps[i].natt = cls[i].natt;
            steps[i].stage = Step::DecapId;
            t.sas.prefetch_id(cls[i].id);
        } else if (cls[i].kind == Classified::Encap) {
            steps[i].id = cls[i].id;
            steps[i].stage = Step::ById;
            t.spd.prefetch_id(cls[i].id);
        } else if (cls[i].kind == Classified::Plain) {
            b.dirn[i] = classify_begin(t, p, steps[i], &b.owner[i], true);
        }
    }
    b.pkts = pkts;
    b.n = n;
    classify_burst(t, pkts, steps, b.dirn, b.owner, n);
}

void Engine::process_classified(Pkt *const *pkts, const Classified *cls, size_t n)
{
    const Tables &t = tables_.read();
    Burst b;
    while (n) {
        size_t k = n < kMaxBurst ? n : kMaxBurst;
        classify_ids(t, pkts, cls, k, b);
        prepare_burst(b, false);
        crypt(b);
        finish_burst(t, b);
        pkts += k;
        cls += k;
        n -= k;
    }
}

bool Engine::begin_classified(Pkt *const *pkts, const Classified *cls, size_t n, Burst &b)
{
    // An SA updated since the open bursts began takes over its predecessor's state, and
    // lets go of it, with its first packet: not before they have ended.
    const Tables &t = tables_.read();
    if (open_ && t.generation != open_generation_)
        return false;
    open_++;
    open_tables_ = &t;
    open_generation_ = t.generation;
    classify_ids(t, pkts, cls, n, b);
    prepare_burst(b, true);
    return true;
}

void Engine::end(Burst &b)
{
    // The tables the burst began with: this thread has not been quiescent since.
    assert(open_ > 0);
    finish_burst(*open_tables_, b);
    open_--;
}

bool classified_from_meta(const void *meta, size_t len, Pkt &p, Classified *c)
{
    if (!meta || len < sizeof(xesp_meta))
        return false;
    xesp_meta m;
    std::memcpy(&m, meta, sizeof m);
    if (m.magic != XESP_META_MAGIC ||
        (m.kind != XESP_META_DECAP && m.kind != XESP_META_ENCAP && m.kind != XESP_META_REPORT))
        return false;
    // Offsets count from the frame start, which is where l3 points until we move it.
    uint32_t start = p.l3 - p.l2_len, frame = p.l2_len + p.len;
    if (p.l2_len > p.l3 || m.l3_off >= frame || m.l4_off < m.l3_off || m.l4_off > frame)
        return false;
    p.l3 = start + m.l3_off;
    p.l2_len = m.l3_off;
    p.len = frame - m.l3_off;
    c->kind = m.kind == XESP_META_DECAP   ? Classified::Decap
              : m.kind == XESP_META_ENCAP ? Classified::Encap
                                          : Classified::Report;
    c->id = m.id;
    c->l4 = uint16_t(m.l4_off - m.l3_off);
    c->natt = m.kind == XESP_META_DECAP && (m.flags & XESP_META_F_NATT);
    return true;
}

}  // namespace xesp
