#include "userspace/nexthop.h"

#include <libmnl/libmnl.h>
#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "userspace/rtnl.h"

namespace xesp {

namespace {

using rtnl::Neigh;
using rtnl::Route;
using Dev = rtnl::Link;

using Clock = std::chrono::steady_clock;
using Mac = std::array<uint8_t, 6>;

constexpr uint32_t kNone = UINT32_MAX;
// rtnetlink answers while sendto() runs; the timeout only bounds a lost answer.
constexpr time_t kQueryTimeoutSeconds = 1;
// Events arrive in bursts (a link going down takes its routes and neighbours with it); an
// overrun costs a flush, so the buffer is generous.
constexpr int kEventSocketBuffer = 4 << 20;
// Room for one event datagram: a link message with its statistics and per-family settings
// is a few KiB, and a truncated one cannot be read again.
constexpr size_t kRecvBufferSize = 32 * 1024;
// Datagrams read from the event socket per poll().
constexpr int kEventReads = 256;

// NUD_VALID: states in which the kernel itself sends to the neighbour's address.
constexpr uint16_t kNudUsable =
    NUD_PERMANENT | NUD_NOARP | NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE;
// Entries NTF_USE must not touch: it would clear NUD_PERMANENT (see __neigh_update).
constexpr uint16_t kNudStatic = NUD_PERMANENT | NUD_NOARP;

// Fibonacci hashing: the multiplication carries every address byte into the high bits.
uint32_t hash_addr(const IpAddr &a)
{
    uint64_t lo, hi;
    std::memcpy(&lo, a.b.data(), 8);
    std::memcpy(&hi, a.b.data() + 8, 8);
    uint64_t h = (lo ^ (hi * 0x9E3779B97F4A7C15ull) ^ a.family) * 0xFF51AFD7ED558CCDull;
    return uint32_t(h >> 32);
}

uint32_t hash_hop(uint32_t ifindex, const IpAddr &a)
{
    return hash_addr(a) ^ (ifindex * 0x9E3779B9u);
}

int af_of(const IpAddr &a) { return a.family == 6 ? AF_INET6 : AF_INET; }

struct Dst {
    IpAddr addr;                        // family 0: a free slot
    HopState state = HopState::Unknown;
    bool used = false;                  // looked up since the last refresh round
    uint32_t hop = kNone;               // slot in hops
    uint32_t next = kNone;              // next destination through the same hop
    uint32_t route_mtu = 0;
    L2Hop l2;
};

struct Hop {
    uint32_t ifindex = 0;               // 0: a free slot
    IpAddr addr;                        // the gateway, or the destination itself when on-link
    uint16_t nud = 0;
    bool has_mac = false;
    Mac mac{};
    uint32_t first = kNone;             // destinations through this hop
    uint64_t round = 0;                 // the refresh round that last sent NTF_USE
};

bool usable(const Hop &h) { return (h.nud & kNudUsable) && h.has_mac; }

uint32_t mtu_of(uint32_t route_mtu, const Dev &dev)
{
    return route_mtu && route_mtu < dev.mtu ? route_mtu : dev.mtu;
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
    default:                            // unreachable, blackhole, prohibit, throw
        return HopState::Unreachable;
    }
}

// "WHAT: strerror(errno)", with errno read before anything else can change it.
Error sys_fail(const std::string &what)
{
    int err = errno;
    return make_error(what + ": " + std::strerror(err), err);
}

} // namespace

const char *hop_state_name(HopState s)
{
    switch (s) {
    case HopState::Unknown: return "unknown";
    case HopState::Resolving: return "resolving";
    case HopState::Ok: return "ok";
    case HopState::Local: return "local";
    case HopState::Unreachable: return "unreachable";
    case HopState::ViaKernel: return "via-kernel";
    }
    return "?";
}

// ---- The tables and the sockets -----------------------------------------------------------
//
// Destinations and hops live in two open-addressing tables (linear probing, at most half
// full, so a lookup touches one or two slots). Nothing is ever removed one by one: a flush
// empties both, which keeps probing simple and lets a destination be linked to its hop by
// slot numbers.

struct NextHops::State {
    Options opt;
    rtnl::Requests query;
    mnl_socket *events = nullptr;
    int raw4 = -1;
    int raw6 = -1;

    std::vector<Dst> dsts;
    std::vector<Hop> hops;
    uint32_t mask = 0;
    uint32_t count = 0;
    bool full = false;          // a miss found no room: flush at the next poll()
    bool flush_due = false;     // a route changed, or events were lost

    // Destinations waiting for poll(), by slot: each is queued once, when it is first missed.
    std::vector<uint32_t> queue;
    size_t q_head = 0;
    size_t q_len = 0;

    std::vector<Dev> devs;

    uint64_t round = 0;
    uint32_t cursor = kNone;    // the refresh round in progress, or none
    bool round_soon = false;
    Clock::time_point next_round;

    std::vector<char> ebuf = std::vector<char>(kRecvBufferSize);

    Stats stats;

    ~State()
    {
        if (events)
            mnl_socket_close(events);
        if (raw4 >= 0)
            close(raw4);
        if (raw6 >= 0)
            close(raw6);
    }

    uint32_t dst_slot(const IpAddr &a) const
    {
        uint32_t i = hash_addr(a) & mask;
        while (dsts[i].addr.family && !(dsts[i].addr == a))
            i = (i + 1) & mask;
        return i;
    }

    uint32_t hop_slot(uint32_t ifindex, const IpAddr &a) const
    {
        uint32_t i = hash_hop(ifindex, a) & mask;
        while (hops[i].ifindex && !(hops[i].ifindex == ifindex && hops[i].addr == a))
            i = (i + 1) & mask;
        return i;
    }

    void remember(uint32_t slot, const IpAddr &a)
    {
        if (a.family != 4 && a.family != 6)
            return;
        if (count >= opt.max_destinations) {
            full = true;
            return;
        }
        Dst &d = dsts[slot];
        d.addr = a;
        d.state = HopState::Resolving;
        d.used = true;
        queue[(q_head + q_len++) % queue.size()] = slot;
        ++count;
    }

    void flush()
    {
        std::fill(dsts.begin(), dsts.end(), Dst{});
        std::fill(hops.begin(), hops.end(), Hop{});
        count = 0;
        q_head = q_len = 0;
        full = flush_due = false;
        cursor = kNone;
        ++stats.flushes;
    }

    int get_route(const IpAddr &dst, Route &r)
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

    int get_neigh(uint32_t ifindex, const IpAddr &addr, Neigh &n)
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
    int probe(const Hop &h)
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

    Dev *find_dev(uint32_t ifindex)
    {
        for (Dev &d : devs)
            if (d.ifindex == ifindex)
                return &d;
        return nullptr;
    }

    // From the cache, else RTM_GETLINK; link events keep the cache current.
    int device(uint32_t ifindex, const Dev *&out)
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
    void set_neigh(uint32_t slot, const Neigh &n)
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
    bool resolve(uint32_t slot)
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
    bool attach(uint32_t slot, uint32_t ifindex, const IpAddr &via)
    {
        uint32_t hs = hop_slot(ifindex, via);
        Hop &h = hops[hs];
        if (!h.ifindex) {
            Neigh n;
            int err = get_neigh(ifindex, via, n);   // -ENOENT: no entry yet
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

    void resolve_queued()
    {
        for (uint32_t n = 0; n < opt.budget && q_len; ++n) {
            if (!resolve(queue[q_head]))
                break;
            q_head = (q_head + 1) % queue.size();
            --q_len;
        }
    }

    // ---- Events -------------------------------------------------------------------------

    void on_neigh(const nlmsghdr *nlh)
    {
        Neigh n;
        if (!parse_neigh(nlh, n))
            return;
        uint32_t slot = hop_slot(n.ifindex, n.addr);
        if (!hops[slot].ifindex)
            return;                     // not a next hop of ours
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

    void on_link(const nlmsghdr *nlh)
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

    void read_events()
    {
        for (int r = 0; r < kEventReads; ++r) {
            ssize_t n = mnl_socket_recvfrom(events, ebuf.data(), ebuf.size());
            if (n < 0) {
                if (errno != ENOBUFS)
                    break;              // EAGAIN: nothing more
                // Events were dropped: nothing we hold can be trusted.
                ++stats.event_overruns;
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
                    break;
                case RTM_NEWNEIGH:
                case RTM_DELNEIGH:
                    on_neigh(h);
                    break;
                case RTM_NEWLINK:
                case RTM_DELLINK:
                    on_link(h);
                    break;
                }
            }
        }
    }

    // ---- Refresh ------------------------------------------------------------------------

    // One NTF_USE per hop that a destination used since the last round. A round walks the
    // whole table, `budget` messages per poll(), so it can span several calls.
    void refresh()
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

    Result<void> open_sockets()
    {
        if (auto r = query.open(kQueryTimeoutSeconds); !r)
            return make_error("nexthop: " + r.error().message, r.error().code.value());

        events = mnl_socket_open2(NETLINK_ROUTE, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (!events || mnl_socket_bind(events, 0, MNL_SOCKET_AUTOPID) < 0)
            return sys_fail("nexthop: cannot open a netlink event socket");
        for (int group : {RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_LINK}) {
            if (mnl_socket_setsockopt(events, NETLINK_ADD_MEMBERSHIP, &group, sizeof(group)) < 0)
                return sys_fail("nexthop: cannot join rtnetlink group " + std::to_string(group));
        }
        int size = kEventSocketBuffer, fd = mnl_socket_get_fd(events);
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)) < 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));

        // IPPROTO_RAW implies a header-included socket, for IPv6 too; it receives nothing.
        int one = 1;
        raw4 = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
        if (raw4 < 0)
            return sys_fail("nexthop: cannot open a raw IPv4 socket (needs CAP_NET_RAW)");
        setsockopt(raw4, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one));
        raw6 = socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);   // -1 without IPv6
        return {};
    }
};

NextHops::NextHops(std::unique_ptr<State> s) : s_(std::move(s)) {}
NextHops::~NextHops() = default;

Result<std::unique_ptr<NextHops>> NextHops::open(const Options &options)
{
    if (options.max_destinations == 0 || options.max_destinations > (1u << 24) ||
        options.budget == 0)
        return make_error("nexthop: max_destinations must be 1 to 16M and budget at least 1",
                          EINVAL);
    auto s = std::make_unique<State>();
    s->opt = options;
    uint32_t slots = 2;
    while (slots < 2 * options.max_destinations)
        slots *= 2;
    s->mask = slots - 1;
    s->dsts.resize(slots);
    s->hops.resize(slots);
    s->queue.resize(options.max_destinations);
    s->next_round = Clock::now() + std::chrono::milliseconds(options.refresh_ms);
    if (auto r = s->open_sockets(); !r)
        return r.error();
    return std::unique_ptr<NextHops>(new NextHops(std::move(s)));
}

const L2Hop *NextHops::lookup(const IpAddr &dst)
{
    State &s = *s_;
    uint32_t slot = s.dst_slot(dst);
    Dst &d = s.dsts[slot];
    if (d.addr.family) {
        d.used = true;
        if (d.state == HopState::Ok)
            return &d.l2;
    } else {
        s.remember(slot, dst);
    }
    ++s.stats.lookups_missed;
    return nullptr;
}

HopState NextHops::state(const IpAddr &dst) const
{
    const Dst &d = s_->dsts[s_->dst_slot(dst)];
    return d.addr.family ? d.state : HopState::Unknown;
}

void NextHops::poll()
{
    State &s = *s_;
    s.read_events();
    if (s.flush_due || s.full)
        s.flush();
    s.resolve_queued();
    s.refresh();
}

int NextHops::event_fd() const { return mnl_socket_get_fd(s_->events); }

size_t NextHops::pending() const { return s_->q_len; }

const NextHops::Stats &NextHops::stats() const { return s_->stats; }

std::vector<int> NextHops::send_fds() const
{
    std::vector<int> fds;
    for (int fd : {s_->raw4, s_->raw6})
        if (fd >= 0)
            fds.push_back(fd);
    return fds;
}

Result<void> NextHops::send_via_kernel(const uint8_t *ip, size_t len)
{
    State &s = *s_;
    int version = len ? ip[0] >> 4 : 0;
    ssize_t sent = -1;
    IpAddr dst;
    errno = EINVAL;
    if (version == 4 && len >= 20) {
        dst = IpAddr::v4(ip + 16);
        sockaddr_in to{};
        to.sin_family = AF_INET;
        std::memcpy(&to.sin_addr, ip + 16, 4);
        sent = sendto(s.raw4, ip, len, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to), sizeof(to));
    } else if (version == 6 && len >= 40) {
        dst = IpAddr::v6(ip + 24);
        sockaddr_in6 to{};
        to.sin6_family = AF_INET6;
        std::memcpy(&to.sin6_addr, ip + 24, 16);
        errno = EAFNOSUPPORT;
        if (s.raw6 >= 0)
            sent = sendto(s.raw6, ip, len, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to),
                          sizeof(to));
    }
    if (sent == ssize_t(len)) {
        ++s.stats.kernel_sent;
        return {};
    }
    int err = sent < 0 ? errno : EMSGSIZE;
    ++s.stats.kernel_send_errors;
    return make_error("nexthop: kernel send of " + std::to_string(len) + " bytes to " +
                          (dst.family ? dst.str() : std::string("?")) + ": " +
                          std::strerror(err),
                      err);
}

} // namespace xesp
