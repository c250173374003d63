#include "userspace/gateway/classifier_sync.h"

#include "userspace/base/log.h"

namespace xesp {

Result<void> ClassifierSync::stage_sa(const SaConfig &c, uint32_t id, std::vector<Undo> &undo)
{
    SaKey key{c.dst, c.spi};
    auto it = sas_.find(key);
    std::optional<SaEntry> was;
    if (it != sas_.end())
        was = it->second;
    if (c.dir == Dir::Out) {  // not classified by SA: an update may have made it one
        if (!was)
            return {};
        if (auto r = prog_.remove_sa(c.dst, c.spi); !r)
            return make_error(describe_sa(c.dst, c.spi) + ": " + r.error().message);
        sas_.erase(it);
        undo.push_back({Undo::PutSa, key, was, 0, nullptr, nullptr});
        return {};
    }
    uint32_t flags = (c.encap ? XESP_SA_F_NATT : 0) | (c.dir == Dir::In ? XESP_SA_F_DIR_IN : 0);
    if (was && was->id == id && was->flags == flags)
        return {};
    if (auto r = prog_.add_sa(c.dst, c.spi, id, flags); !r)
        return make_error(describe_sa(c.dst, c.spi) + ": " + r.error().message);
    sas_[key] = SaEntry{id, flags};
    undo.push_back({Undo::PutSa, key, was, 0, nullptr, nullptr});
    return {};
}

void ClassifierSync::rollback(std::vector<Undo> &undo)
{
    // Each step put back as it was, newest first. These writes reverse ones that just
    // succeeded; should one fail anyway, the entry it leaves behind names an id the engine
    // does not have, and its packets are looked up again by the engine.
    for (auto u = undo.rbegin(); u != undo.rend(); ++u) {
        if (u->kind == Undo::PutSa) {
            if (u->sa) {
                (void)prog_.add_sa(u->key.dst, u->key.spi, u->sa->id, u->sa->flags);
                sas_[u->key] = *u->sa;
            } else {
                (void)prog_.remove_sa(u->key.dst, u->key.spi);
                sas_.erase(u->key);
            }
        } else if (u->kind == Undo::ReplacedPolicy) {
            (void)prog_.replace_policy(u->new_id, *u->now, u->id, *u->policy);
        } else if (u->policy) {
            (void)prog_.replace_policy(u->id, *u->now, u->id, *u->policy);
        } else {
            (void)prog_.remove_policy(u->id);
        }
    }
    undo.clear();
}

bool ClassifierSync::relaxes(const PolicyConfig &p)
{
    return !p.tmpl && p.action == Action::Allow;
}

// One policy of a change into the maps. A policy deleted and added again in the same change
// (a new id) takes the old one's entry at once, as the classifier holds one policy per
// selector and direction, and goes after its equals, as the engine puts it.
Result<void> ClassifierSync::put_policy(const Engine::Prepared &p,
                                        const Engine::Prepared::PolicyPut &put,
                                        std::vector<Undo> *undo)
{
    const Engine::Prepared::PolicyDel *again = nullptr;
    if (!put.old)
        for (const auto &del : p.policy_dels)
            if (del.old->sel == put.policy->sel && del.old->dir == put.policy->dir)
                again = &del;
    Result<void> r;
    if (put.old)
        r = prog_.replace_policy(put.id, *put.old, put.id, *put.policy);
    else if (again)
        r = prog_.replace_policy(again->id, *again->old, put.id, *put.policy, false);
    else
        r = prog_.add_policy(put.id, *put.policy);
    if (!r || !undo)
        return r;
    if (again)
        undo->push_back(
            {Undo::ReplacedPolicy, {}, std::nullopt, again->id, again->old, put.policy, put.id});
    else
        undo->push_back({Undo::PutPolicy, {}, std::nullopt, put.id, put.old, put.policy});
    return r;
}

Result<void> ClassifierSync::stage(const Engine::Prepared &p)
{
    std::vector<Undo> undo;
    auto failed = [&](Result<void> r) {
        rollback(undo);
        return r;
    };
    for (const auto &put : p.sa_puts)
        if (auto r = stage_sa(put.sa->config(), put.id, undo); !r)
            return failed(r);
    // What lets traffic through unprotected (an allow policy without a template: bypass) is
    // written only once the change is published (commit()): until then the engine still
    // has the policies it replaces, and the gateway stays closed.
    for (const auto &put : p.policy_puts)
        if (!relaxes(*put.policy))
            if (auto r = put_policy(p, put, &undo); !r)
                return failed(r);
    staged_ = std::move(undo);
    return {};
}

void ClassifierSync::commit(const Engine::Prepared &p)
{
    staged_.clear();
    for (const auto &put : p.policy_puts)
        if (relaxes(*put.policy))  // cannot fail closed any more: an error leaves the old
            if (auto r = put_policy(p, put, nullptr); !r)
                log(LogLevel::Error, "classifier: %s", r.error().message.c_str());
    // A failed delete leaves an entry naming an id the engine no longer has: its packets are
    // looked up again, and find no state, which is what a deleted SA or policy means anyway.
    for (const auto &del : p.sa_dels) {
        auto it = sas_.find(del.key);
        if (it == sas_.end() || it->second.id != del.id)
            continue;  // an outbound SA, or one this change put again under a new id
        (void)prog_.remove_sa(del.key.dst, del.key.spi);
        sas_.erase(it);
    }
    for (const auto &del : p.policy_dels)
        (void)prog_.remove_policy(del.id);  // replaced already (stage): fails, harmlessly
}

}  // namespace xesp
