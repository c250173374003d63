// Inside NextHops (nexthop.h): its tables, its sockets and the work each poll() does, shared by
// the files that implement it and by no one else.
//
//   nexthop.cpp          the public calls, and the two tables (lookup, remember, flush)
//   nexthop_resolve.cpp  a queued miss: route, device, then neighbour (RTM_GET*, NTF_USE)
//   nexthop_events.cpp   netlink events that keep the answers current, and the refresh round
//   nexthop_sockets.cpp  opening the sockets, and send_via_kernel's raw sockets
//
// Destinations and hops live in two open-addressing tables (linear probing, at most half
// full, so a lookup touches one or two slots). Nothing is ever removed one by one: a flush
// empties both, which keeps probing simple and lets a destination be linked to its hop by
// slot numbers.
#pragma once

#include <libmnl/libmnl.h>
#include <linux/neighbour.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "userspace/base/clock.h"
#include "userspace/kernel/nexthop.h"
#include "userspace/kernel/rtnl.h"

namespace xesp::nexthop {

using xesp::Clock;
using Mac = std::array<uint8_t, 6>;

constexpr uint32_t kNone = UINT32_MAX;
// Room for one event datagram: a link message with its statistics and per-family settings
// is a few KiB, and a truncated one cannot be read again.
constexpr size_t kRecvBufferSize = 32 * 1024;

// NUD_VALID: states in which the kernel itself sends to the neighbour's address.
constexpr uint16_t kNudUsable =
    NUD_PERMANENT | NUD_NOARP | NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE;
// Entries NTF_USE must not touch: it would clear NUD_PERMANENT (see __neigh_update).
constexpr uint16_t kNudStatic = NUD_PERMANENT | NUD_NOARP;

struct Dst {
    IpAddr addr;  // family 0: a free slot
    HopState state = HopState::Unknown;
    bool used = false;      // looked up since the last refresh round
    uint32_t hop = kNone;   // slot in hops
    uint32_t next = kNone;  // next destination through the same hop
    uint32_t route_mtu = 0;
    L2Hop l2;
};

struct Hop {
    uint32_t ifindex = 0;  // 0: a free slot
    IpAddr addr;           // the gateway, or the destination itself when on-link
    uint16_t nud = 0;
    bool has_mac = false;
    Mac mac{};
    uint32_t first = kNone;  // destinations through this hop
    uint64_t round = 0;      // the refresh round that last sent NTF_USE
};

inline bool usable(const Hop &h)
{
    return (h.nud & kNudUsable) && h.has_mac;
}

inline uint32_t mtu_of(uint32_t route_mtu, const rtnl::Link &dev)
{
    return route_mtu && route_mtu < dev.mtu ? route_mtu : dev.mtu;
}

}  // namespace xesp::nexthop

namespace xesp {

struct NextHops::State {
    using Dst = nexthop::Dst;
    using Hop = nexthop::Hop;
    using Dev = rtnl::Link;
    using Neigh = rtnl::Neigh;
    using Route = rtnl::Route;

    Options opt;
    rtnl::Requests query;
    mnl_socket *events = nullptr;
    int raw4 = -1;
    int raw6 = -1;

    std::vector<Dst> dsts;
    std::vector<Hop> hops;
    uint32_t mask = 0;
    uint32_t count = 0;
    bool full = false;       // a miss found no room: flush at the next poll()
    bool flush_due = false;  // a route changed, or events were lost

    // Destinations waiting for poll(), by slot: each is queued once, when it is first missed.
    std::vector<uint32_t> queue;
    size_t q_head = 0;
    size_t q_len = 0;

    std::vector<Dev> devs;
    std::vector<uint32_t> watched;  // watch_links()
    std::vector<std::string> watched_names;
    bool link_changed = false;
    bool link_urgent = false;
    bool addr_changed = false;
    bool brd_changed = false;          // take_broadcast_change()
    std::vector<uint32_t> links_gone;  // take_links_gone()
    bool links_gone_unknown = false;
    // links(): every device, kept from the events while links_whole (which lost events end).
    // Events queued before the list are applied after it, up to the last one, before the list
    // is handed out: each carries a device's whole state, and those that follow it too, so the
    // list ends as the devices are.
    std::vector<rtnl::Link> links;
    bool links_whole = false;
    bool links_orphaned = false;  // a device left with others stacked on it (keep_link())

    uint64_t round = 0;
    uint32_t cursor = nexthop::kNone;  // the refresh round in progress, or none
    bool round_soon = false;
    nexthop::Clock::time_point next_round;

    void note_link(const nlmsghdr *nlh);
    void keep_link(const nlmsghdr *nlh);
    const std::vector<rtnl::Link> *drained_links();
    std::vector<char> ebuf = std::vector<char>(nexthop::kRecvBufferSize);

    Stats stats;

    ~State();  // nexthop_sockets.cpp

    // The tables (nexthop.cpp).
    uint32_t dst_slot(const IpAddr &a) const;
    uint32_t hop_slot(uint32_t ifindex, const IpAddr &a) const;
    void remember(uint32_t slot, const IpAddr &a);
    void flush();

    // Resolution (nexthop_resolve.cpp).
    int get_route(const IpAddr &dst, Route &r);
    int get_neigh(uint32_t ifindex, const IpAddr &addr, Neigh &n);
    int probe(const Hop &h);
    Dev *find_dev(uint32_t ifindex);
    int device(uint32_t ifindex, const Dev *&out);
    void set_neigh(uint32_t slot, const Neigh &n);
    bool resolve(uint32_t slot);
    bool attach(uint32_t slot, uint32_t ifindex, const IpAddr &via);
    void resolve_queued();

    // Events and the refresh round (nexthop_events.cpp).
    void on_neigh(const nlmsghdr *nlh);
    void on_link(const nlmsghdr *nlh);
    bool read_events();  // true: the socket has no more
    void refresh();

    // The sockets (nexthop_sockets.cpp).
    Result<void> open_sockets();
};

}  // namespace xesp
