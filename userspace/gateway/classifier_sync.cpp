#include "userspace/gateway/classifier_sync.h"

#include "userspace/base/log.h"

namespace xesp {

// One SA of a change: taken out of the map at once if it no longer belongs there, or listed
// in `writes` (with what it was in `was`) to be written with the others.
Result<void> ClassifierSync::stage_sa(const SaConfig &c, uint32_t id, std::vector<Undo> &undo,
                                      std::vector<XdpProgram::SaEntry> &writes,
                                      std::vector<std::optional<SaEntry>> &was_before)
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
    writes.push_back({c.dst, c.spi, id, flags});
    was_before.push_back(was);
    return {};
}

// The SAs stage_sa() listed, in a few system calls (a config of 100,000 tunnels at start).
Result<void> ClassifierSync::write_sas(const std::vector<XdpProgram::SaEntry> &writes,
                                       const std::vector<std::optional<SaEntry>> &was,
                                       std::vector<Undo> &undo)
{
    size_t done = 0;
    auto r = prog_.add_sas(writes, done);
    for (size_t i = 0; i < done; i++) {
        SaKey key{writes[i].dst, writes[i].spi};
        sas_[key] = SaEntry{writes[i].sa_id, writes[i].flags};
        undo.push_back({Undo::PutSa, key, was[i], 0, nullptr, nullptr});
    }
    if (!r)
        return make_error(describe_sa(writes[done].dst, writes[done].spi) + ": " +
                          r.error().message);
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
const Engine::Prepared::PolicyDel *
ClassifierSync::added_again(const Engine::Prepared &p, const Engine::Prepared::PolicyPut &put)
{
    const Engine::Prepared::PolicyDel *again = nullptr;
    if (!put.old)
        for (const auto &del : p.policy_dels)
            if (del.old->sel == put.policy->sel && del.old->dir == put.policy->dir)
                again = &del;
    return again;
}

Result<void> ClassifierSync::put_policy(const Engine::Prepared &p,
                                        const Engine::Prepared::PolicyPut &put,
                                        std::vector<Undo> *undo)
{
    const Engine::Prepared::PolicyDel *again = added_again(p, put);
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
    std::vector<XdpProgram::SaEntry> writes;
    std::vector<std::optional<SaEntry>> was;
    sas_.reserve(sas_.size() + p.sa_puts.size());
    for (const auto &put : p.sa_puts)
        if (auto r = stage_sa(put.sa->config(), put.id, undo, writes, was); !r)
            return failed(r);
    if (auto r = write_sas(writes, was, undo); !r)
        return failed(r);
    // What lets traffic through unprotected (an allow policy without a template: bypass) is
    // written only once the change is published (commit()): until then the engine still
    // has the policies it replaces, and the gateway stays closed. New policies go in
    // together, those that take another's entry one by one, all in the change's order.
    std::vector<std::pair<uint32_t, const PolicyConfig *>> adds;
    std::vector<const Engine::Prepared::PolicyPut *> added;
    auto add_all = [&]() -> Result<void> {
        size_t done = 0;
        auto r = prog_.add_policies(adds, done);
        for (size_t i = 0; i < done; i++)
            undo.push_back(
                {Undo::PutPolicy, {}, std::nullopt, added[i]->id, nullptr, added[i]->policy});
        adds.clear();
        added.clear();
        return r;
    };
    for (const auto &put : p.policy_puts) {
        if (relaxes(*put.policy))
            continue;
        if (!put.old && !added_again(p, put)) {
            adds.emplace_back(put.id, put.policy.get());
            added.push_back(&put);
            continue;
        }
        if (auto r = add_all(); !r)
            return failed(r);
        if (auto r = put_policy(p, put, &undo); !r)
            return failed(r);
    }
    if (auto r = add_all(); !r)
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
