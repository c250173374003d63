// The path MTU of the tunnels (userspace/kernel/pmtu.h): reports from routers between the gateways
// lower an SA's path MTU for a while; the engine answers too-big packets with what fits it.
#include "userspace/gateway/gateway.h"
#include "userspace/base/log.h"
#include "userspace/control/report.h"
#include "userspace/base/wire.h"

namespace xesp {

// A report is believed for an SA of ours that sent the quoted packet: the same addresses and
// encapsulation, a sequence number it sent lately. It can only lower the path MTU (RFC 1191
// 6.3); the same value again keeps it for another lifetime. True if the report was about one
// of our SAs, whether or not it lowered anything.
bool Gateway::learn_pmtu(const PmtuReport &r, uint64_t now)
{
    Sa *sa = engine_->sas().find_in(r.dst, r.spi);
    if (!sa || !(sa->config().src == r.src) || sa->natt() != r.natt ||
        !pmtu_seq_recent(r.seq, sa->oseq())) {
        count(GwCounter::PmtuIgnored);
        return false;
    }
    uint32_t link = engine_->options().link_mtu;
    uint32_t now_mtu = sa->outer_mtu(link);
    if (now_mtu && r.mtu > now_mtu) {
        count(GwCounter::PmtuIgnored);
        return true;
    }
    pmtus_[SaKey{r.dst, r.spi}] = LearntPmtu{r.mtu, now + options_.pmtu_expires_s * kSecondNs};
    count(GwCounter::PmtuLearnt);
    if (r.mtu == sa->path_mtu())
        return true;
    sa->set_path_mtu(r.mtu);
    min_pmtu_ = smaller_mtu(r.mtu, min_pmtu_);
    log(LogLevel::Notice, "%s: path MTU %u (ICMP from %s); tunnel MTU now %u for %u s",
        sa_label(sa->config()).c_str(), r.mtu, r.router.str().c_str(), sa->inner_mtu(r.mtu),
        options_.pmtu_expires_s);
    return true;
}

// A report on its way to a host behind us (the XDP program sends those here; the ones for
// the gateway's own addresses reach it through PmtuListener). In transport mode the SA's
// addresses are the hosts': the host has no such SA and no use for the report, the gateway
// has. About one of ours: learnt and kept from the host. Anything else goes on through the
// kernel, as if the gateway had never looked.
void Gateway::take_report(Port &port, Pkt &p, const Classified &c)
{
    PmtuReport r;
    bool parsed = false;
    if (wire::ip_version(p.ip()) == 4) {
        parsed = parse_pmtu_report4(p.ip(), p.len, &r);
    } else if (p.len >= 40 && c.l4 < p.len) {
        parsed = parse_pmtu_report6(p.ip() + c.l4, p.len - c.l4, IpAddr::v6(p.ip() + 8), &r);
    }
    if (parsed && learn_pmtu(r, now_ns())) {
        count(GwCounter::ReportsTaken);
        port.x.recycle(p);
        return;
    }
    to_kernel(port, p);
}

void Gateway::age_pmtu(uint64_t now)
{
    if (pmtus_.empty())
        return;
    size_t before = pmtus_.size();
    for (auto it = pmtus_.begin(); it != pmtus_.end();) {
        if (now < it->second.until_ns) {
            ++it;
            continue;
        }
        // Gone with a reconfiguration, or replaced by an SA that learnt nothing yet: no matter.
        Sa *sa = engine_->sas().find_in(it->first.dst, it->first.spi);
        if (sa && sa->path_mtu() == it->second.mtu) {
            sa->set_path_mtu(0);
            log(LogLevel::Info, "%s: learnt path MTU %u expired; the link MTU applies again",
                sa_label(sa->config()).c_str(), it->second.mtu);
        }
        it = pmtus_.erase(it);
    }
    if (pmtus_.size() != before) {
        min_pmtu_ = 0;
        for (const auto &[key, l] : pmtus_)
            min_pmtu_ = smaller_mtu(l.mtu, min_pmtu_);
    }
}

// The smallest MTU any SA's packets must fit: below it, no packet needs splitting before
// encryption (prefragment).
uint32_t Gateway::split_mtu() const
{
    return smaller_mtu(min_pmtu_, engine_->options().link_mtu);
}

}  // namespace xesp
