// NextHops keeping its answers current: the netlink events (a route change forgets every
// destination, a neighbour change patches the destinations through that neighbour, a device
// change their source MAC and MTU), and the refresh round that keeps used neighbours fresh.
#include <linux/rtnetlink.h>
#include <net/if.h>

#include <algorithm>
#include <cerrno>

#include "userspace/kernel/nexthop_state.h"

namespace xesp {

using nexthop::Clock;
using nexthop::kNone;
using nexthop::kNudStatic;
using nexthop::mtu_of;

namespace {

// Datagrams read from the event socket per poll().
constexpr int kEventReads = 256;

}  // namespace

// ---- Events -------------------------------------------------------------------------------

void NextHops::State::on_neigh(const nlmsghdr *nlh)
{
    Neigh n;
    if (!parse_neigh(nlh, n))
        return;
    uint32_t slot = hop_slot(n.ifindex, n.addr);
    if (!hops[slot].ifindex)
        return;  // not a next hop of ours
    bool deleted = nlh->nlmsg_type == RTM_DELNEIGH;
    if (deleted) {
        n.nud = NUD_NONE;
        n.has_mac = false;
    }
    set_neigh(slot, n);
    // Garbage-collected or flushed while we send through it: ask again now rather than
    // at the next round.
    if (deleted && hops[slot].first != kNone)
        round_soon = true;
}

void NextHops::State::on_link(const nlmsghdr *nlh)
{
    if (mnl_nlmsg_get_payload_len(nlh) < sizeof(ifinfomsg))
        return;
    const auto *ifi = static_cast<const ifinfomsg *>(mnl_nlmsg_get_payload(nlh));
    auto ifindex = uint32_t(ifi->ifi_index);
    Dev *dev = find_dev(ifindex);
    if (!dev)
        return;
    Dev now = *dev;
    if (!parse_link(nlh, now))
        return;
    if (nlh->nlmsg_type == RTM_DELLINK || ((now.flags ^ dev->flags) & IFF_UP) ||
        now.ether != dev->ether) {
        devs.erase(devs.begin() + (dev - devs.data()));
        flush_due = true;
        return;
    }
    bool changed = now.mac != dev->mac || now.mtu != dev->mtu;
    *dev = now;
    if (!changed)
        return;
    for (Dst &d : dsts) {
        if (d.addr.family && d.hop != kNone && d.l2.ifindex == ifindex) {
            d.l2.src = now.mac;
            d.l2.mtu = mtu_of(d.route_mtu, now);
        }
    }
}

// A change of a watched device, or of one stacked on or enslaved to one, or of a device of a
// watched name (watch_links()); a watched device gone.
void NextHops::State::note_link(const nlmsghdr *nlh)
{
    Dev d;
    if ((watched.empty() && watched_names.empty()) || !parse_link(nlh, d))
        return;
    for (uint32_t w : watched) {
        if (w == d.ifindex || w == d.lower || w == d.master)
            link_changed = true;
        if (w == d.ifindex && nlh->nlmsg_type == RTM_DELLINK &&
            std::find(links_gone.begin(), links_gone.end(), w) == links_gone.end()) {
            links_gone.push_back(w);
            link_urgent = true;
        }
    }
    for (const std::string &n : watched_names)
        if (n == d.name.data())
            link_changed = link_urgent = true;
}

// The device list of links(), as the event leaves it.
void NextHops::State::keep_link(const nlmsghdr *nlh)
{
    if (!links_whole || mnl_nlmsg_get_payload_len(nlh) < sizeof(ifinfomsg))
        return;
    const auto *ifi = static_cast<const ifinfomsg *>(mnl_nlmsg_get_payload(nlh));
    if (ifi->ifi_family != AF_UNSPEC)
        return;  // a bridge port's notification (AF_BRIDGE): the device stays
    // A wireless extension's event carries its name and that only, not the master, lower
    // device and kind every other link message has.
    bool wireless = false;
    mnl_attr_parse(
        nlh, sizeof(ifinfomsg),
        [](const nlattr *a, void *data) {
            if (mnl_attr_get_type(a) == IFLA_WIRELESS)
                *static_cast<bool *>(data) = true;
            return MNL_CB_OK;
        },
        &wireless);
    if (wireless)
        return;
    auto ifindex = uint32_t(ifi->ifi_index);
    auto it = std::find_if(links.begin(), links.end(),
                           [&](const rtnl::Link &l) { return l.ifindex == ifindex; });
    if (nlh->nlmsg_type == RTM_DELLINK) {
        if (it != links.end())
            links.erase(it);
        // Gone from here, perhaps to another namespace: what was stacked on it stays with no
        // event, and a list would show no lower device in this one (IFLA_LINK_NETNSID).
        for (rtnl::Link &l : links) {
            if (l.lower == ifindex) {
                l.lower = 0;
                links_orphaned = true;
            }
            if (l.master == ifindex)
                l.master = 0;
        }
        return;
    }
    // A device new here, perhaps one coming back: what was stacked on it names it again, with
    // no event. Listed whole at the next links().
    if (it == links.end() && links_orphaned) {
        links_whole = false;
        link_changed = true;
        return;
    }
    rtnl::Link l = it != links.end() ? *it : rtnl::Link{};
    if (!parse_link(nlh, l))
        return;
    if (it != links.end())
        *it = l;
    else
        links.push_back(l);
}

// The list of links() once the events queued so far are applied: as the devices are now. A
// flood leaves the rest to poll(), and the caller hears of a change again.
const std::vector<rtnl::Link> *NextHops::State::drained_links()
{
    bool done = false;
    for (int i = 0; i < 16 && !done; i++)
        done = read_events();
    if (!done)
        link_changed = true;
    return &links;
}

bool NextHops::State::read_events()
{
    for (int r = 0; r < kEventReads; ++r) {
        ssize_t n = mnl_socket_recvfrom(events, ebuf.data(), ebuf.size());
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return true;  // nothing more
            if (errno == EINTR)
                continue;
            // Events were dropped (ENOBUFS), or one cut short (ENOSPC, a truncated datagram):
            // nothing we hold can be trusted.
            ++stats.event_overruns;
            link_changed = true;  // not urgent: the next look checks every interface
            links_gone_unknown = true;
            addr_changed = true;
            brd_changed = true;
            links_whole = false;
            devs.clear();
            flush_due = true;
            continue;
        }
        int left = int(n);
        for (auto *h = reinterpret_cast<const nlmsghdr *>(ebuf.data()); mnl_nlmsg_ok(h, left);
             h = mnl_nlmsg_next(h, &left)) {
            ++stats.events;
            switch (h->nlmsg_type) {
            case RTM_NEWROUTE:
            case RTM_DELROUTE:
                flush_due = true;
                // IPv4's local table: its broadcast routes (a device up again makes them anew,
                // with no address event).
                if (mnl_nlmsg_get_payload_len(h) >= sizeof(rtmsg)) {
                    const auto *rtm = static_cast<const rtmsg *>(mnl_nlmsg_get_payload(h));
                    brd_changed |= rtm->rtm_family == AF_INET && rtm->rtm_table == RT_TABLE_LOCAL;
                }
                break;
            case RTM_NEWNEIGH:
            case RTM_DELNEIGH:
                on_neigh(h);
                break;
            case RTM_NEWLINK:
            case RTM_DELLINK:
                // A device down loses its broadcast routes with no route event (one up makes
                // them anew, with one; one deleted or moved away is first set down).
                if (h->nlmsg_type == RTM_NEWLINK &&
                    mnl_nlmsg_get_payload_len(h) >= sizeof(ifinfomsg)) {
                    const auto *ifi = static_cast<const ifinfomsg *>(mnl_nlmsg_get_payload(h));
                    brd_changed |= ifi->ifi_change != ~0u && (ifi->ifi_change & IFF_UP) &&
                                   !(ifi->ifi_flags & IFF_UP);
                }
                note_link(h);
                keep_link(h);
                on_link(h);
                break;
            case RTM_NEWADDR:
            case RTM_DELADDR:
                addr_changed = true;
                if (mnl_nlmsg_get_payload_len(h) >= sizeof(ifaddrmsg))
                    brd_changed |=
                        static_cast<const ifaddrmsg *>(mnl_nlmsg_get_payload(h))->ifa_family ==
                        AF_INET;
                break;
            }
        }
    }
    return false;
}

// ---- Refresh ------------------------------------------------------------------------------

// One NTF_USE per hop that a destination used since the last round. A round walks the
// whole table, `budget` messages per poll(), so it can span several calls.
void NextHops::State::refresh()
{
    if (cursor == kNone) {
        auto now = Clock::now();
        if (!round_soon && now < next_round)
            return;
        round_soon = false;
        next_round = now + std::chrono::milliseconds(opt.refresh_ms);
        ++round;
        cursor = 0;
    }
    uint32_t sent = 0;
    while (cursor < dsts.size() && sent < opt.budget) {
        Dst &d = dsts[cursor++];
        if (!d.addr.family || !d.used || d.hop == kNone)
            continue;
        d.used = false;
        Hop &h = hops[d.hop];
        if (h.round == round || (h.nud & kNudStatic))
            continue;
        h.round = round;
        probe(h);
        ++sent;
    }
    if (cursor >= dsts.size())
        cursor = kNone;
}

}  // namespace xesp
