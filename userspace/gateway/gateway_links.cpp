// Gateway, its interfaces following the devices under them: the Ethernet addresses each takes
// frames for, read again when a watched device changes.
#include <cstring>

#include "userspace/base/log.h"
#include "userspace/gateway/gateway.h"

namespace xesp {

namespace {

constexpr uint64_t kRetryNs = 1'000'000'000;  // a device list that could not be read
constexpr uint64_t kGapNs = 100'000'000;      // between two looks: a burst of events, one

// Every device of the namespace (NextHops keeps the list from link events), or nullptr and
// why not, said in the log.
const std::vector<rtnl::Link> *read_links(NextHops &hops, const char *why)
{
    int err = 0;
    const auto *links = hops.links(err);
    if (!links)
        log(LogLevel::Warning, "cannot list the devices %s (%s)", why,
            err < 0 ? std::strerror(-err) : "netlink socket");
    return links;
}

}  // namespace

// The Ethernet addresses the classifier lets `i` take frames for (struct xesp_iface): none
// for the local link, whose frames carry the next hop's, nor when they cannot be read or do
// not fit (no check; the log says so, unless `quiet`).
std::vector<XdpProgram::Mac> Gateway::iface_macs(const GatewayIface &i, const rtnl::Uppers &u,
                                                 bool quiet)
{
    if (i.local)
        return {};
    if (u.macs.size() > XdpProgram::kMaxIfaceMacs) {
        if (!quiet)
            log(LogLevel::Warning,
                "%s: takes frames for %zu Ethernet addresses (its upper devices'), more than "
                "the %zu the classifier holds: frames to other stations' MACs are not checked",
                i.name.c_str(), u.macs.size(), XdpProgram::kMaxIfaceMacs);
        return {};
    }
    return u.macs;
}

// At `iface add`; the devices to watch for changes are read again at the next housekeeping.
std::vector<XdpProgram::Mac> Gateway::iface_macs(const GatewayIface &i)
{
    macs_due_ = true;
    if (i.local)
        return {};
    const auto *links =
        read_links(*hops_, ("for " + i.name + "'s MACs: they are not checked").c_str());
    if (!links)
        return {};
    return iface_macs(i, rtnl::accepted_macs(*links, i.ifindex), false);
}

// A watched device changed (a MAC set, a macvlan or VLAN added, removed, up or down, a bridge
// joined): the classifier's entries take the interfaces' Ethernet addresses as they are now,
// and the devices above them are the ones watched. Until then a frame to a new address is
// dropped where it would be handed over (fail closed); a failure is tried again in a second.
// A tenth of a second at least between two looks, whatever the rate of events. The device
// list is NextHops', kept from the link events: listed whole once, not at each look.
void Gateway::refresh_macs(uint64_t now)
{
    const auto *links = read_links(*hops_, "after a device change; again in a second");
    if (!links) {
        macs_at_ns_ = now + kRetryNs;
        return;
    }
    macs_due_ = false;
    macs_at_ns_ = now + kGapNs;
    std::vector<uint32_t> watched;
    for (auto &i : ifaces_) {
        if (i.local)
            continue;
        watched.push_back(i.ifindex);
        auto u = rtnl::accepted_macs(*links, i.ifindex);
        watched.insert(watched.end(), u.devices.begin(), u.devices.end());
        if (u.macs.empty())
            continue;  // gone: what it held stays until `iface del`
        auto macs = iface_macs(i, u, i.macs.empty());
        if (macs == i.macs)
            continue;
        auto r = i.mode == IfaceMode::Tun ? prog_->park_iface(i.ifindex, i.role, macs)
                                          : prog_->set_iface_role(i.ifindex, i.role, i.slot, macs);
        if (!r) {
            log(LogLevel::Warning, "%s", r.error().message.c_str());
            macs_due_ = true;
            macs_at_ns_ = now + kRetryNs;
            continue;
        }
        i.macs = std::move(macs);
        log(LogLevel::Info, "%s: takes frames for %zu Ethernet address(es) now%s", i.name.c_str(),
            i.macs.size(), i.macs.empty() ? ": no check" : "");
    }
    hops_->watch_links(std::move(watched));
}

}  // namespace xesp
