#include "userspace/gateway/classifier_sync.h"

#include <set>

namespace xesp {

Result<void> ClassifierSync::stage_sa(const SaConfig &c, std::vector<Undo> &undo)
{
    std::string key = describe_sa(c.dst, c.spi);
    uint32_t flags = (c.encap ? XESP_SA_F_NATT : 0) | (c.dir == Dir::In ? XESP_SA_F_DIR_IN : 0);
    auto it = sas_.find(key);
    if (it != sas_.end() && it->second.flags == flags)
        return {};
    SaEntry e = it != sas_.end() ? it->second : SaEntry{next_slot_, flags, c.dst, c.spi};
    if (auto r = prog_.add_sa(c.dst, c.spi, e.slot, flags); !r)
        return make_error(key + ": " + r.error().message);
    if (it != sas_.end()) {
        undo.push_back({Undo::FlippedSa, key, it->second, {}});
        it->second.flags = flags;
    } else {
        next_slot_++;
        sas_.emplace(key, e);
        undo.push_back({Undo::AddedSa, key, e, {}});
    }
    return {};
}

Result<void> ClassifierSync::stage_policy(const PolicyConfig &p, std::vector<Undo> &undo)
{
    std::string key = describe_policy(p.sel, p.dir);
    auto it = policies_.find(key);
    if (it != policies_.end() && same_policy(it->second.config, p))
        return {};
    PolicyEntry e{next_slot_, p};
    auto r = it != policies_.end()
                 ? prog_.replace_policy(it->second.slot, it->second.config, e.slot, p)
                 : prog_.add_policy(e.slot, p);
    if (!r)
        return make_error(key + ": " + r.error().message);
    next_slot_++;
    if (it != policies_.end()) {
        undo.push_back({Undo::ReplacedPolicy, key, {}, it->second});
        it->second = e;
    } else {
        policies_.emplace(key, e);
        undo.push_back({Undo::AddedPolicy, key, {}, e});
    }
    return {};
}

void ClassifierSync::rollback(std::vector<Undo> &undo)
{
    // Each step put back as it was, newest first. These writes reverse ones that just
    // succeeded; should one fail anyway, the entry it leaves behind names a slot that
    // translates to no id, and its packets are dropped.
    for (auto u = undo.rbegin(); u != undo.rend(); ++u) {
        switch (u->kind) {
        case Undo::AddedSa:
            (void)prog_.remove_sa(u->sa.dst, u->sa.spi);
            sas_.erase(u->key);
            break;
        case Undo::FlippedSa:
            (void)prog_.add_sa(u->sa.dst, u->sa.spi, u->sa.slot, u->sa.flags);
            sas_[u->key] = u->sa;
            break;
        case Undo::AddedPolicy:
            (void)prog_.remove_policy(u->policy.slot);
            policies_.erase(u->key);
            break;
        case Undo::ReplacedPolicy: {
            PolicyEntry &now = policies_[u->key];
            (void)prog_.replace_policy(now.slot, now.config, u->policy.slot, u->policy.config);
            now = u->policy;
            break;
        }
        }
    }
    undo.clear();
}

Result<void> ClassifierSync::stage(const Config &next)
{
    std::vector<Undo> undo;
    for (const SaConfig &c : next.sas)
        if (c.dir != Dir::Out)  // only inbound ESP is classified by SA
            if (auto r = stage_sa(c, undo); !r) {
                rollback(undo);
                return r;
            }
    for (const PolicyConfig &p : next.policies)
        if (auto r = stage_policy(p, undo); !r) {
            rollback(undo);
            return r;
        }
    return {};
}

void ClassifierSync::commit(const Config &next)
{
    std::set<std::string> keep_sas, keep_policies;
    for (const SaConfig &c : next.sas)
        if (c.dir != Dir::Out)
            keep_sas.insert(describe_sa(c.dst, c.spi));
    for (const PolicyConfig &p : next.policies)
        keep_policies.insert(describe_policy(p.sel, p.dir));
    // A failed delete leaves an entry whose slot translates to nothing: its packets are
    // dropped as having no state, which is what a deleted SA or policy means anyway.
    std::erase_if(sas_, [&](auto &kv) {
        if (keep_sas.count(kv.first))
            return false;
        (void)prog_.remove_sa(kv.second.dst, kv.second.spi);
        return true;
    });
    std::erase_if(policies_, [&](auto &kv) {
        if (keep_policies.count(kv.first))
            return false;
        (void)prog_.remove_policy(kv.second.slot);
        return true;
    });
}

ClassifierSync::Ids ClassifierSync::ids(const Config &next) const
{
    Ids out;
    static_assert(SlotTable::kMissing == Engine::kNoId, "a gone slot must read as no state");
    std::vector<std::pair<uint32_t, uint32_t>> ids;
    for (uint32_t i = 0; i < next.sas.size(); i++) {
        if (next.sas[i].dir == Dir::Out)
            continue;  // only inbound ESP is classified by SA
        auto it = sas_.find(describe_sa(next.sas[i].dst, next.sas[i].spi));
        if (it != sas_.end())
            ids.emplace_back(it->second.slot, i);
    }
    out.sa.rebuild(ids);
    ids.clear();
    for (uint32_t i = 0; i < next.policies.size(); i++) {
        auto it = policies_.find(describe_policy(next.policies[i].sel, next.policies[i].dir));
        if (it != policies_.end())
            ids.emplace_back(it->second.slot, i);
    }
    out.policy.rebuild(ids);
    return out;
}

}  // namespace xesp
