// Gateway, its interfaces following the devices under them: the Ethernet addresses each takes
// frames for, read again when a watched device changes; an interface whose device left the
// namespace kept by name, and attached again when a device of that name is back.
#include <net/if.h>
#include <sys/socket.h>

#include <algorithm>
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
    macs_at_ns_ = 0;  // watched from the next housekeeping on: a move away and back is seen
    if (i.local)
        return {};
    const auto *links =
        read_links(*hops_, ("for " + i.name + "'s MACs: they are not checked").c_str());
    if (!links)
        return {};
    return iface_macs(i, rtnl::accepted_macs(*links, i.ifindex), false);
}

// An interface whose device left (or was renamed) goes absent (lose_iface()), and one absent
// whose name is here is attached again (return_iface()); the local link, gone, is made again
// (remake_local_link()). Returns the device list as it is after that, or nullptr if it cannot
// be read (the log says so).
const std::vector<rtnl::Link> *Gateway::follow_devices()
{
    const auto *links = read_links(*hops_, "after a device change; again in a second");
    bool unknown = false;
    auto local =
        std::find_if(ifaces_.begin(), ifaces_.end(), [](const GatewayIface &i) { return i.local; });
    const uint32_t local_end = local != ifaces_.end() ? local->ifindex : 0;
    const uint32_t kernel_end = local_link_.kernel_ifindex();
    if (links)
        prune_renamed(*links);  // before an index it had is another interface's, lost below
    for (uint32_t ifindex : hops_->take_links_gone(unknown)) {
        lose_iface(ifindex);
        local_link_left_ |= ifindex == local_end || ifindex == kernel_end;
    }
    gone_unknown_ |= unknown;
    if (!links)
        return nullptr;
    bool remade = false;
    if (local_link_gone(*links)) {
        remake_local_link();
        remade = true;
    }
    // Left with no event seen (events lost; or before its index was watched), renamed, or
    // perhaps left and came back unseen (events lost): what was on it is checked.
    std::vector<uint32_t> gone;
    for (const auto &i : ifaces_) {
        if (i.local || i.absent)
            continue;
        auto l = std::find_if(links->begin(), links->end(),
                              [&](const rtnl::Link &k) { return k.ifindex == i.ifindex; });
        if (l == links->end() || i.name != l->name.data() || (gone_unknown_ && iface_unbound(i)))
            gone.push_back(i.ifindex);
    }
    gone_unknown_ = false;
    for (uint32_t ifindex : gone)
        lose_iface(ifindex);
    std::vector<std::pair<std::string, uint32_t>> back;
    for (auto &i : ifaces_) {
        if (!i.absent)
            continue;
        auto l = std::find_if(links->begin(), links->end(),
                              [&](const rtnl::Link &k) { return i.name == k.name.data(); });
        if (l == links->end()) {
            if (i.tried)  // the device it failed on, renamed, may keep ours
                note_renamed(i.name, i.tried);
            i.tried = 0;  // a device of that name made, or moved back, is tried
        } else if (l->ifindex != i.tried) {
            back.emplace_back(i.name, l->ifindex);
        }
    }
    if (back.empty() && !remade)
        return links;
    for (const auto &[name, ifindex] : back)
        return_iface(name, ifindex);
    // Events read meanwhile change the list.
    return read_links(*hops_, "after a device change; again in a second");
}

// Whether the local link (local_link.h) went from under the gateway: either end deleted (which
// takes the pair), moved to another namespace (perhaps back already: an RTM_DELLINK was seen,
// local_link_left_), or renamed; or, after lost events, its socket unbound.
bool Gateway::local_link_gone(const std::vector<rtnl::Link> &links) const
{
    auto local =
        std::find_if(ifaces_.begin(), ifaces_.end(), [](const GatewayIface &i) { return i.local; });
    if (!local_link_ || local == ifaces_.end())
        return false;  // none made (open_local_link() lets go of a pair it cannot attach)
    auto here = [&](uint32_t ifindex, const char *name) {
        return std::any_of(links.begin(), links.end(), [&](const rtnl::Link &k) {
            return k.ifindex == ifindex && std::strcmp(k.name.data(), name) == 0;
        });
    };
    return local_link_left_ || !here(local->ifindex, LocalLink::kGatewayEnd) ||
           !here(local_link_.kernel_ifindex(), LocalLink::kKernelEnd) ||
           (gone_unknown_ && iface_unbound(*local));
}

// The local link gone: made again while a public interface is attached. In this order, so
// that nothing protected gets past: the egress guard stops sending there (it drops instead);
// what is left of the pair is deleted by its ends' names, never by an index that may be
// another device's now (a renamed end goes with its peer); its entry and socket go.
void Gateway::remake_local_link()
{
    (void)prog_->set_local_link(0, 0);
    auto local =
        std::find_if(ifaces_.begin(), ifaces_.end(), [](const GatewayIface &i) { return i.local; });
    const uint32_t ifindex = local->ifindex;
    local_link_drops_ += local_link_.tx_dropped();  // or what it had at the last look
    local_link_.release();
    local_link_left_ = false;
    LocalLink::remove_leftovers();
    ifaces_.erase(local);
    if (std::none_of(ifaces_.begin(), ifaces_.end(), [&](const GatewayIface &i) {
            return !i.absent && i.ifindex == ifindex;  // its index another's by now
        }))
        (void)prog_->remove_iface(ifindex);
    const bool public_here = std::any_of(ifaces_.begin(), ifaces_.end(), [](const GatewayIface &i) {
        return i.role == IfaceRole::Public;
    });
    log(LogLevel::Warning,
        "local link %s: gone from under the gateway (deleted, moved to another network "
        "namespace, or renamed)%s",
        LocalLink::kKernelEnd,
        public_here ? "; making it again" : "; made again with the next public interface");
    if (public_here)
        open_local_link();  // its ports rebuilt, or the log says why not
    if (!local_link_)
        if (auto r = rebuild_ports(); !r)
            log(LogLevel::Error, "no socket reopened after the local link went: %s",
                r.error().message.c_str());
}

// A watched device changed (a MAC set, a macvlan or VLAN added, removed, up or down, a bridge
// joined): the classifier's entries take the interfaces' Ethernet addresses as they are now,
// and the devices above them are the ones watched. Until then a frame to a new address is
// dropped where it would be handed over (fail closed); a failure is tried again in a second.
// A tenth of a second at least between two looks, whatever the rate of events (but for a
// device gone or come back: housekeeping()). The device list is NextHops', kept from the link
// events: listed whole once, not at each look.
//
// First, the interfaces follow their devices (follow_devices()). Both ends of the local link
// are watched too.
void Gateway::refresh_macs(uint64_t now)
{
    macs_look_ns_ = now;
    const auto *links = follow_devices();
    if (!links) {
        macs_at_ns_ = now + kRetryNs;
        return;
    }
    macs_due_ = false;
    macs_at_ns_ = now + kGapNs;
    std::vector<uint32_t> watched;
    std::vector<std::string> names;
    for (auto &i : ifaces_) {
        if (i.local) {  // both ends: either may leave (local_link_gone())
            watched.push_back(i.ifindex);
            watched.push_back(local_link_.kernel_ifindex());
            continue;
        }
        if (i.absent) {
            names.push_back(i.name);
            if (i.tried)  // renamed, it may keep ours (note_renamed())
                watched.push_back(i.tried);
            // Come while another was attached, before its name was watched: look again.
            if (std::any_of(links->begin(), links->end(), [&](const rtnl::Link &l) {
                    return i.name == l.name.data() && l.ifindex != i.tried;
                })) {
                macs_due_ = true;
                macs_at_ns_ = now;
            }
            continue;
        }
        watched.push_back(i.ifindex);
        auto u = rtnl::accepted_macs(*links, i.ifindex);
        watched.insert(watched.end(), u.devices.begin(), u.devices.end());
        if (u.macs.empty())
            continue;  // not Ethernet
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
    for (const auto &r : renamed_)  // leaving, or renamed again
        watched.push_back(r.ifindex);
    hops_->watch_links(std::move(watched), std::move(names));
}

// Whether what the daemon put on an interface is gone from it: its sockets unbound (the kernel
// unbinds them when the device leaves the namespace, and says so with ENETDOWN), or in tun mode
// its tc program off (a move to another namespace takes it).
bool Gateway::iface_unbound(const GatewayIface &i) const
{
    if (i.mode == IfaceMode::Tun)
        return !XdpProgram::protected_attached(int(i.ifindex));
    for (const auto &p : ports_) {
        int err = 0;
        socklen_t len = sizeof err;
        if (p->ifindex == i.ifindex &&
            getsockopt(p->x.fd(), SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err)
            return true;
    }
    return false;
}

// The device of an interface left this namespace under the daemon (deleted, or moved to
// another), perhaps to come back under the same index, or was renamed: what the daemon put on
// it went with it (a move takes its tc programs and unbinds its sockets, though an XDP program
// stays on it). The interface is kept by name, absent: its slot and sockets go, and it is
// attached again as it was when a device of that name is here. Its entry goes too, unless a
// device of its index here still has one of our programs (back already, or renamed): parked
// then, it drops what it would hand over and keeps the checks of its role, where with no entry
// it would take the default role. Meanwhile the kernel has a device made anew.
void Gateway::lose_iface(uint32_t ifindex)
{
    auto it = std::find_if(ifaces_.begin(), ifaces_.end(), [&](const GatewayIface &i) {
        return !i.local && !i.absent && i.ifindex == ifindex;
    });
    if (it == ifaces_.end())
        return;
    GatewayIface &i = *it;
    const bool kept =
        XdpProgram::attached_to(int(ifindex)) || XdpProgram::protected_attached(int(ifindex));
    if (kept)
        (void)prog_->park_iface(ifindex, i.role, i.macs);
    else
        (void)prog_->remove_iface(ifindex);
    const bool sockets = i.mode == IfaceMode::Xdp;
    const std::string name = i.name;
    GatewayIface absent;
    absent.name = i.name;
    absent.role = i.role;
    absent.mode = i.mode;
    absent.absent = true;
    i = absent;
    if (kept)
        note_renamed(name, ifindex);  // unless back already under its name
    Result<void> r;
    if (sockets)
        r = rebuild_ports();
    else
        close_unused_tun();
    relink_engine();
    log(LogLevel::Warning,
        "%s: gone from this network namespace (deleted, moved to another, or renamed): its "
        "sockets are closed; attached again as %s when a device of that name is here (`xesp "
        "iface del %s` forgets it)",
        name.c_str(), iface_role_name(absent.role), name.c_str());
    if (!r)
        log(LogLevel::Error,
            "no socket reopened after %s went: %s; what the classifier would hand over is "
            "dropped until the next interface change",
            name.c_str(), r.error().message.c_str());
}

// A device of an absent interface's name is here (index `ifindex`): attached as the interface
// was. If that fails it stays absent, our classifier on it (if it has it) parked, and it is not
// tried on that device again until the name has been away.
void Gateway::return_iface(const std::string &name, uint32_t ifindex)
{
    auto it = std::find_if(ifaces_.begin(), ifaces_.end(),
                           [&](const GatewayIface &i) { return i.absent && i.name == name; });
    if (it == ifaces_.end())
        return;
    GatewayIface was = *it;
    ifaces_.erase(it);
    auto r = attach_iface({was.name, was.role, was.mode}, false, leftover(name));
    if (!r) {
        if (XdpProgram::attached_to(int(ifindex)))
            (void)prog_->park_iface(ifindex, was.role);
        was.tried = ifindex;
        ifaces_.push_back(was);
        log(LogLevel::Error,
            "%s: here again (index %u), but not attached: %s; tried again once a device of that "
            "name is made anew or moved back, or at `xesp iface del` and `add`",
            name.c_str(), ifindex, r.error().message.c_str());
        if (was.role == IfaceRole::Public)
            guard_absent_public(name, ifindex);
        return;
    }
    if (was.role == IfaceRole::Public && !local_link_)
        open_local_link();
    log(LogLevel::Info, "%s: here again (index %u): attached as %s, as before", name.c_str(),
        ifindex, iface_role_name(was.role));
}

// A device of interface `was` is here under another name with our program on it (parked, or
// the egress guard alone): it keeps dropping what is protected, as the operator may not have
// moved the routes off it, until `iface del WAS` or --detach-on-exit hands it back.
void Gateway::note_renamed(const std::string &was, uint32_t ifindex)
{
    char now[IF_NAMESIZE] = "";
    if (!if_indextoname(ifindex, now) || was == now)
        return;  // gone, or back under its name (return_iface()'s)
    RenamedDevice r{was, ifindex, now};
    if (!renamed_ours(r) || std::any_of(renamed_.begin(), renamed_.end(),
                                        [&](const auto &o) { return o.ifindex == ifindex; }))
        return;
    renamed_.push_back(r);
    renamed_changes_++;
    log(LogLevel::Warning,
        "%s: renamed %s (index %u), which keeps our program: it drops what is protected until "
        "`xesp iface del %s` (or --detach-on-exit) hands it back to the kernel",
        was.c_str(), now, ifindex, was.c_str());
}

// Renamed devices that left the namespace, or lost our program (`iface del NEWNAME`, or taken
// off by hand), are forgotten, and their classifier entries with them; those that are an
// interface of ours again (renamed back, or added under the new name), or a device an absent
// interface waits for under its name, are that interface's.
void Gateway::prune_renamed(const std::vector<rtnl::Link> &links)
{
    for (auto &r : renamed_) {
        auto l = std::find_if(links.begin(), links.end(),
                              [&](const rtnl::Link &k) { return k.ifindex == r.ifindex; });
        r.name = l != links.end() ? l->name.data() : "";
    }
    renamed_changes_ += std::erase_if(renamed_, [&](const RenamedDevice &r) {
        return (r.name.empty() || !renamed_ours(r)) && forget_renamed(r);
    });
}

// An entry of renamed() that goes: its classifier entry too, unless an interface holds that
// index. Always true, for erase_if().
bool Gateway::forget_renamed(const RenamedDevice &r)
{
    if (!held_by_iface(r))
        (void)prog_->remove_iface(r.ifindex);
    return true;
}

// Whether a renamed device's index (and classifier entry) is an interface's of ours: attached
// to it, failed on it, or about to be tried on it under its name.
bool Gateway::held_by_iface(const RenamedDevice &r) const
{
    return std::any_of(ifaces_.begin(), ifaces_.end(), [&](const GatewayIface &i) {
        return i.absent ? i.tried == r.ifindex || (!r.name.empty() && i.name == r.name)
                        : i.ifindex == r.ifindex;
    });
}

// Whether a renamed device still has one of our programs and is no interface's of ours.
bool Gateway::renamed_ours(const RenamedDevice &r) const
{
    char now[IF_NAMESIZE] = "";
    if (!if_indextoname(r.ifindex, now))
        return false;
    if (std::any_of(ifaces_.begin(), ifaces_.end(), [&](const GatewayIface &i) {
            return i.name == now || (!i.absent && i.ifindex == r.ifindex);
        }))
        return false;
    return ours_on(int(r.ifindex));
}

// `iface del WAS`: the devices that were WAS and are under other names now, handed back;
// `found`, if given: whether any was.
Result<void> Gateway::release_renamed(const std::string &was, bool *found)
{
    Result<void> out;
    for (const auto &r : renamed_) {
        if (r.was == was && found)
            *found = true;
        if (r.was != was || !renamed_ours(r))
            continue;
        char now[IF_NAMESIZE] = "";
        (void)if_indextoname(r.ifindex, now);
        auto res = release_at(was + " (renamed " + now + ")", int(r.ifindex));
        if (!res && out)
            out = res;
    }
    // Not another's, nor ours still (not handed back: the next del tries again).
    renamed_changes_ += std::erase_if(renamed_, [&](const RenamedDevice &r) {
        return r.was == was && !renamed_ours(r) && forget_renamed(r);
    });
    return out;
}

// A public interface that a device of its name is here for but could not be attached to: the
// egress guard alone goes on that device. Nothing is encrypted while the interface is absent,
// and without the guard the gateway's own plaintext for a protected flow would leave there in
// the clear; with it, it is dropped. An attach puts the guard on again with the rest; `iface
// del` of the interface, or `--detach-on-exit`, takes it off.
void Gateway::guard_absent_public(const std::string &name, uint32_t ifindex)
{
    if (auto r = prog_->attach_egress(int(ifindex)); !r)
        log(LogLevel::Error,
            "%s: %s: the gateway's own traffic for protected flows may leave it in the clear",
            name.c_str(), r.error().message.c_str());
    else
        log(LogLevel::Warning,
            "%s: its egress guard alone is on it: the gateway's own traffic for protected "
            "flows goes to the local link to be encrypted, or is dropped",
            name.c_str());
}

}  // namespace xesp
