// Config's lookups, and the comparisons and names of SAs and policies that the engine and the
// grammar share.
#include "userspace/esp/sa_config.h"

#include <algorithm>
#include <cstdio>

namespace xesp {

const SaConfig *Config::find_sa(const IpAddr &dst, uint32_t spi) const
{
    auto it = std::find_if(sas.begin(), sas.end(),
                           [&](const SaConfig &s) { return s.dst == dst && s.spi == spi; });
    return it == sas.end() ? nullptr : &*it;
}

const PolicyConfig *Config::find_policy(const Selector &sel, Dir dir) const
{
    auto it = std::find_if(policies.begin(), policies.end(),
                           [&](const PolicyConfig &p) { return p.sel == sel && p.dir == dir; });
    return it == policies.end() ? nullptr : &*it;
}

bool Config::operator==(const Config &o) const
{
    if (sas.size() != o.sas.size() || policies.size() != o.policies.size())
        return false;
    for (size_t i = 0; i < sas.size(); i++)
        if (!same_sa(sas[i], o.sas[i]))
            return false;
    for (size_t i = 0; i < policies.size(); i++)
        if (!same_policy(policies[i], o.policies[i]))
            return false;
    return true;
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
