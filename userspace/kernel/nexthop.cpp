// NextHops, the calls of nexthop.h and the two tables they read: lookup() and state() per
// packet, poll() for the control loop. The work poll() does is in nexthop_resolve.cpp and
// nexthop_events.cpp (see nexthop_state.h).
#include "userspace/kernel/nexthop.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "userspace/kernel/nexthop_state.h"

namespace xesp {

using nexthop::Clock;
using nexthop::Dst;
using nexthop::Hop;
using nexthop::kNone;

namespace {

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

}  // namespace

const char *hop_state_name(HopState s)
{
    switch (s) {
    case HopState::Unknown:
        return "unknown";
    case HopState::Resolving:
        return "resolving";
    case HopState::Ok:
        return "ok";
    case HopState::Local:
        return "local";
    case HopState::Unreachable:
        return "unreachable";
    case HopState::ViaKernel:
        return "via-kernel";
    }
    return "?";
}

// ---- The tables ---------------------------------------------------------------------------

uint32_t NextHops::State::dst_slot(const IpAddr &a) const
{
    uint32_t i = hash_addr(a) & mask;
    while (dsts[i].addr.family && !(dsts[i].addr == a))
        i = (i + 1) & mask;
    return i;
}

uint32_t NextHops::State::hop_slot(uint32_t ifindex, const IpAddr &a) const
{
    uint32_t i = hash_hop(ifindex, a) & mask;
    while (hops[i].ifindex && !(hops[i].ifindex == ifindex && hops[i].addr == a))
        i = (i + 1) & mask;
    return i;
}

void NextHops::State::remember(uint32_t slot, const IpAddr &a)
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

void NextHops::State::flush()
{
    std::fill(dsts.begin(), dsts.end(), Dst{});
    std::fill(hops.begin(), hops.end(), Hop{});
    count = 0;
    q_head = q_len = 0;
    full = flush_due = false;
    cursor = kNone;
    ++stats.flushes;
}

NextHops::NextHops(std::unique_ptr<State> s) : s_(std::move(s))
{}
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

void NextHops::poll(bool events)
{
    State &s = *s_;
    if (events)
        s.read_events();
    if (s.flush_due || s.full)
        s.flush();
    s.resolve_queued();
    s.refresh();
}

int NextHops::event_fd() const
{
    return mnl_socket_get_fd(s_->events);
}

size_t NextHops::pending() const
{
    return s_->q_len;
}

const NextHops::Stats &NextHops::stats() const
{
    return s_->stats;
}

void NextHops::watch_links(std::vector<uint32_t> ifindexes, std::vector<std::string> names)
{
    s_->watched = std::move(ifindexes);
    s_->watched_names = std::move(names);
}

void NextHops::watch_link(uint32_t ifindex)
{
    if (std::find(s_->watched.begin(), s_->watched.end(), ifindex) == s_->watched.end())
        s_->watched.push_back(ifindex);
}

bool NextHops::take_link_change(bool *urgent)
{
    const bool u = std::exchange(s_->link_urgent, false);
    if (urgent)
        *urgent = u;
    return std::exchange(s_->link_changed, false);
}

bool NextHops::take_addr_change()
{
    return std::exchange(s_->addr_changed, false);
}

bool NextHops::take_broadcast_change()
{
    return std::exchange(s_->brd_changed, false);
}

std::vector<uint32_t> NextHops::take_links_gone(bool &unknown)
{
    unknown = std::exchange(s_->links_gone_unknown, false);
    return std::exchange(s_->links_gone, {});
}

const std::vector<rtnl::Link> *NextHops::links(int &err)
{
    State &s = *s_;
    err = 0;
    // Events lost while the queue drains make the list untrustworthy again: one more list.
    for (int tries = 0; tries < 2; tries++) {
        if (!s.links_whole) {
            rtnl::Requests rq;
            if (!rq.open(1)) {
                err = rtnl::Requests::kSocketError;
                return nullptr;
            }
            err = rtnl::dump_links(rq, s.links);
            if (err)
                return nullptr;
            ++s.stats.link_lists;
            s.links_whole = true;
            s.links_orphaned = false;
        }
        const auto *links = s.drained_links();
        if (s.links_whole)
            return links;
    }
    err = -ENOBUFS;
    return nullptr;
}

}  // namespace xesp
