#include "userspace/esp/engine.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "userspace/base/clock.h"
#include "userspace/base/wire.h"
#include "userspace/esp/icmp.h"

namespace xesp {

using namespace wire;

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
        return make_error(describe_sa(c.dst, c.spi) + ": " + made.error().message);
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
    if (options.local)
        e->set_local(*options.local);  // kept sorted
    e->set_broadcast(options.broadcast);
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
        p.set_drop(Drop::OutTooBig);  // no address to answer from, or one not to answer
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
    }
    inbound_policy_checks(t, b);
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

}  // namespace xesp
