// Config's lookups, and the comparisons and names of SAs and policies that the engine and the
// grammar share.
#include "userspace/esp/sa_config.h"

#include <algorithm>
#include <cstdio>

namespace xesp {

size_t ConfigKeyHash::operator()(const SaKey &k) const
{
    uint64_t h = k.spi * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < k.dst.size(); i++)
        h = (h ^ k.dst.b[i]) * 0x100000001b3ull;
    return size_t(h ^ (h >> 29));
}

size_t ConfigKeyHash::operator()(const PolicyKey &k) const
{
    uint64_t h = uint64_t(k.dir) * 0x9e3779b97f4a7c15ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 0x100000001b3ull; };
    for (const Prefix *p : {&k.sel.src, &k.sel.dst}) {
        for (size_t i = 0; i < p->addr.size(); i++)
            mix(p->addr.b[i]);
        mix(uint64_t(p->len) << 8 | p->addr.family);
    }
    mix(uint64_t(k.sel.proto) << 40 | uint64_t(k.sel.sport_set) << 33 |
        uint64_t(k.sel.dport_set) << 32 | uint64_t(k.sel.sport) << 16 | k.sel.dport);
    return size_t(h ^ (h >> 29));
}

void apply_change(Config &cfg, const ConfigChange &ch)
{
    for (const SaKey &k : ch.del_sas)
        cfg.sas.erase(k);
    for (const PolicyKey &k : ch.del_policies)
        cfg.policies.erase(k);
    for (const SaConfig &c : ch.put_sas)
        cfg.sas.push_back(c);
    for (const PolicyConfig &p : ch.put_policies)
        cfg.policies.push_back(p);
}

void apply_change(Config &cfg, ConfigChange &&ch)
{
    for (const SaKey &k : ch.del_sas)
        cfg.sas.erase(k);
    for (const PolicyKey &k : ch.del_policies)
        cfg.policies.erase(k);
    for (SaConfig &c : ch.put_sas)
        cfg.sas.push_back(std::move(c));
    for (PolicyConfig &p : ch.put_policies)
        cfg.policies.push_back(std::move(p));
}

bool Config::operator==(const Config &o) const
{
    if (sas.size() != o.sas.size() || policies.size() != o.policies.size())
        return false;
    return std::equal(sas.begin(), sas.end(), o.sas.begin(), same_sa) &&
           std::equal(policies.begin(), policies.end(), o.policies.begin(), same_policy);
}

std::string hex32(uint32_t v)
{
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", v);
    return buf;
}

std::string describe_sa(const IpAddr &dst, uint32_t spi)
{
    return "SA dst " + dst.str() + " spi " + hex32(spi);
}

bool same_keys(const SaConfig &a, const SaConfig &b)
{
    const Transform &x = a.xf, &y = b.xf;
    return x.aead == y.aead && x.enc == y.enc && x.auth == y.auth && x.enc_key == y.enc_key &&
           CRYPTO_memcmp(x.salt.data(), y.salt.data(), x.salt.size()) == 0 &&
           x.auth_key == y.auth_key;
}

bool same_sa(const SaConfig &a, const SaConfig &b)
{
    bool xf = same_keys(a, b) && a.xf.icv_len == b.xf.icv_len;
    bool encap =
        a.encap.has_value() == b.encap.has_value() &&
        (!a.encap || (a.encap->sport == b.encap->sport && a.encap->dport == b.encap->dport &&
                      a.encap->oaddr == b.encap->oaddr));
    return xf && encap && a.lifetime == b.lifetime && a.src == b.src && a.dst == b.dst &&
           a.spi == b.spi && a.reqid == b.reqid && a.mode == b.mode && a.esn == b.esn &&
           a.replay_window == b.replay_window && a.seq == b.seq && a.seq_hi == b.seq_hi &&
           a.oseq == b.oseq && a.oseq_hi == b.oseq_hi && a.sel == b.sel && a.dir == b.dir;
}

bool same_policy(const PolicyConfig &a, const PolicyConfig &b)
{
    bool tmpl = a.tmpl.has_value() == b.tmpl.has_value() &&
                (!a.tmpl || (a.tmpl->src == b.tmpl->src && a.tmpl->dst == b.tmpl->dst &&
                             a.tmpl->spi == b.tmpl->spi && a.tmpl->reqid == b.tmpl->reqid &&
                             a.tmpl->mode == b.tmpl->mode));
    return tmpl && a.sel == b.sel && a.dir == b.dir && a.priority == b.priority &&
           a.action == b.action;
}

}  // namespace xesp
