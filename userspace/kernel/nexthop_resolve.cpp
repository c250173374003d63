// NextHops resolving a queued miss: the route (RTM_GETROUTE), the egress device (RTM_GETLINK,
// cached), then the next hop's neighbour entry (RTM_GETNEIGH), with NTF_USE to start ARP/ND
// where the kernel has no usable entry. Each is one netlink round trip the kernel answers at
// once; the neighbour's answer may come later, as an event (nexthop_events.cpp).
#include <libmnl/libmnl.h>
#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>

#include <cerrno>

#include "userspace/kernel/nexthop_state.h"

namespace xesp {

using nexthop::kNone;
using nexthop::kNudStatic;
using nexthop::mtu_of;
using nexthop::usable;

namespace {

int af_of(const IpAddr &a)
{
    return a.family == 6 ? AF_INET6 : AF_INET;
}

HopState route_state(uint8_t type)
{
    switch (type) {
    case RTN_UNICAST:
        return HopState::Resolving;
    case RTN_LOCAL:
    case RTN_ANYCAST:
        return HopState::Local;
    case RTN_BROADCAST:
    case RTN_MULTICAST:
        return HopState::ViaKernel;
    default:  // unreachable, blackhole, prohibit, throw
        return HopState::Unreachable;
    }
}

}  // namespace

int NextHops::State::get_route(const IpAddr &dst, Route &r)
{
    nlmsghdr *nlh = query.request(RTM_GETROUTE, 0);
    auto *rtm = static_cast<rtmsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
    rtm->rtm_family = uint8_t(af_of(dst));
    rtm->rtm_dst_len = uint8_t(dst.size() * 8);
    mnl_attr_put(nlh, RTA_DST, dst.size(), dst.b.data());
    return query.round_trip(nlh, [&](const nlmsghdr *h) {
        if (h->nlmsg_type == RTM_NEWROUTE)
            parse_route(h, r);
    });
}

int NextHops::State::get_neigh(uint32_t ifindex, const IpAddr &addr, Neigh &n)
{
    nlmsghdr *nlh = query.request(RTM_GETNEIGH, 0);
    auto *ndm = static_cast<ndmsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(ndmsg)));
    ndm->ndm_family = uint8_t(af_of(addr));
    ndm->ndm_ifindex = int(ifindex);
    mnl_attr_put(nlh, NDA_DST, addr.size(), addr.b.data());
    return query.round_trip(nlh, [&](const nlmsghdr *h) {
        if (h->nlmsg_type == RTM_NEWNEIGH)
            parse_neigh(h, n);
    });
}

// NTF_USE: neigh_add() creates the entry if needed (NLM_F_CREATE) and calls
// neigh_event_send() as a waiting packet would; the state and NLM_F_REPLACE do not
// matter on that path. The answer comes later, as an event.
int NextHops::State::probe(const Hop &h)
{
    nlmsghdr *nlh = query.request(RTM_NEWNEIGH, NLM_F_CREATE);
    auto *ndm = static_cast<ndmsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(ndmsg)));
    ndm->ndm_family = uint8_t(af_of(h.addr));
    ndm->ndm_ifindex = int(h.ifindex);
    ndm->ndm_state = NUD_NONE;
    ndm->ndm_flags = NTF_USE;
    mnl_attr_put(nlh, NDA_DST, h.addr.size(), h.addr.b.data());
    ++stats.neigh_probes;
    return query.call(nlh);
}

rtnl::Link *NextHops::State::find_dev(uint32_t ifindex)
{
    for (Dev &d : devs)
        if (d.ifindex == ifindex)
            return &d;
    return nullptr;
}

// From the cache, else RTM_GETLINK; link events keep the cache current.
int NextHops::State::device(uint32_t ifindex, const Dev *&out)
{
    if ((out = find_dev(ifindex)))
        return 0;
    nlmsghdr *nlh = query.request(RTM_GETLINK, 0);
    auto *ifi = static_cast<ifinfomsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
    ifi->ifi_index = int(ifindex);
    Dev dev;
    int err = query.round_trip(nlh, [&](const nlmsghdr *h) {
        if (h->nlmsg_type == RTM_NEWLINK)
            parse_link(h, dev);
    });
    if (err)
        return err;
    if (dev.ifindex != ifindex)
        return -ENODEV;
    devs.push_back(dev);
    out = &devs.back();
    return 0;
}

// Points every destination through hop `slot` at what the neighbour now says.
void NextHops::State::set_neigh(uint32_t slot, const Neigh &n)
{
    Hop &h = hops[slot];
    h.nud = n.nud;
    h.has_mac = n.has_mac;
    if (n.has_mac)
        h.mac = n.mac;
    bool ok = usable(h);
    for (uint32_t i = h.first; i != kNone; i = dsts[i].next) {
        Dst &d = dsts[i];
        if (ok) {
            d.l2.dst = h.mac;
            if (d.state == HopState::Resolving) {
                d.state = HopState::Ok;
                ++stats.resolved;
            }
        } else if (d.state == HopState::Ok) {
            d.state = HopState::Resolving;
        }
    }
}

// Route, device, then neighbour. Returns false when the socket failed and the
// destination should stay queued.
bool NextHops::State::resolve(uint32_t slot)
{
    Dst &d = dsts[slot];
    Route r;
    int err = get_route(d.addr, r);
    if (err == rtnl::Requests::kSocketError)
        return false;
    if (err || r.type != RTN_UNICAST) {
        d.state = err ? HopState::Unreachable : route_state(r.type);
        return true;
    }
    const Dev *dev = nullptr;
    err = device(r.oif, dev);
    if (err == rtnl::Requests::kSocketError)
        return false;
    if (err || !dev->ether) {
        d.state = err ? HopState::Unreachable : HopState::ViaKernel;
        return true;
    }
    d.l2.ifindex = r.oif;
    d.l2.src = dev->mac;
    d.route_mtu = r.mtu;
    d.l2.mtu = mtu_of(r.mtu, *dev);
    return attach(slot, r.oif, r.via.family ? r.via : d.addr);
}

// Links destination `slot` to its next hop, asking the kernel about a hop not seen yet
// and starting its resolution if the kernel has no usable entry.
bool NextHops::State::attach(uint32_t slot, uint32_t ifindex, const IpAddr &via)
{
    uint32_t hs = hop_slot(ifindex, via);
    Hop &h = hops[hs];
    if (!h.ifindex) {
        Neigh n;
        int err = get_neigh(ifindex, via, n);  // -ENOENT: no entry yet
        if (err == rtnl::Requests::kSocketError)
            return false;
        h.ifindex = ifindex;
        h.addr = via;
        h.nud = err ? 0 : n.nud;
        h.has_mac = !err && n.has_mac;
        h.mac = n.mac;
        if (!usable(h) && !(h.nud & kNudStatic))
            probe(h);
    }
    Dst &d = dsts[slot];
    d.hop = hs;
    d.next = h.first;
    h.first = slot;
    if (usable(h)) {
        d.l2.dst = h.mac;
        d.state = HopState::Ok;
        ++stats.resolved;
    } else {
        d.state = HopState::Resolving;
    }
    return true;
}

void NextHops::State::resolve_queued()
{
    for (uint32_t n = 0; n < opt.budget && q_len; ++n) {
        if (!resolve(queue[q_head]))
            break;
        q_head = (q_head + 1) % queue.size();
        --q_len;
    }
}

}  // namespace xesp
