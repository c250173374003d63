// Next-hop MACs for the transmit path: what `ip route get DST` and the neighbour table say, kept
// in a table the per-packet code can read without a system call.
//
// The gateway writes the Ethernet header of every packet it sends from an AF_XDP socket, so
// it needs, per IP destination, the egress device, its MAC and MTU, and the next hop's MAC.
// The kernel stays the authority: a miss is resolved with RTM_GETROUTE then RTM_GETNEIGH,
// and netlink events keep the answers current (a route change forgets every destination, a
// neighbour change patches the destinations through that neighbour, a device change their
// source MAC and MTU).
//
// Two things the kernel would do for its own packets have to be done by hand, since ours
// never go through its neighbour code:
//   - Resolution without a data packet. An unresolved neighbour gets RTM_NEWNEIGH with
//     NTF_USE, which makes the kernel run neigh_event_send() as if a packet were waiting:
//     ARP/ND starts and the answer comes back as an event. Meanwhile the caller hands its
//     packets to send_via_kernel(), where the kernel queues them until ARP/ND is done.
//   - Keeping used neighbours fresh. Every refresh interval the neighbours used since the
//     last round get NTF_USE again; a stale entry is then re-probed (STALE -> DELAY ->
//     PROBE), as traffic through the kernel would do, and is not garbage-collected. Permanent
//     and NOARP entries are left alone: NTF_USE on a permanent entry makes it non-permanent.
//
// Threads. A NextHops is used by one thread: lookup() and poll() must not run concurrently.
// With several workers, give each its own (each has its own netlink sockets and table).
//
// Bounds. The table holds Options::max_destinations; when a miss finds it full, the next
// poll() forgets everything and starts again (counted in Stats::flushes). Each poll() makes
// at most Options::budget resolutions and as many refresh messages.
//
// Not covered: the source address and input interface of a packet do not take part (no
// source or iif policy routing), IPv6 link-local destinations (no zone), and ECMP picks
// whichever path `ip route get DST` picks, for every flow to DST.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "userspace/base/ip.h"
#include "userspace/base/result.h"
#include "userspace/kernel/rtnl.h"

namespace xesp {

struct L2Hop {
    uint32_t ifindex = 0;
    uint32_t mtu = 0;              // the route's MTU if set (at most the device's), else
                                   // the device's
    std::array<uint8_t, 6> src{};  // the egress device's MAC
    std::array<uint8_t, 6> dst{};  // the next hop's MAC
};

enum class HopState : uint8_t {
    Unknown,      // never looked up (or forgotten since)
    Resolving,    // the route or the neighbour is being resolved
    Ok,           // lookup() returns the hop
    Local,        // a local address: the kernel's to deliver
    Unreachable,  // no route, or an unreachable/blackhole/prohibit route
    ViaKernel,    // broadcast, multicast, or an egress device without an Ethernet address
};

const char *hop_state_name(HopState s);

class NextHops {
public:
    struct Options {
        uint32_t max_destinations = 4096;
        uint32_t budget = 32;        // resolutions (and refreshes) per poll()
        uint32_t refresh_ms = 5000;  // NTF_USE round for the neighbours in use
    };
    struct Stats {
        uint64_t lookups_missed = 0;  // lookups that returned nullptr
        uint64_t resolved = 0;        // destinations that became Ok
        uint64_t events = 0;          // netlink events read
        uint64_t kernel_sent = 0;
        uint64_t kernel_send_errors = 0;
        uint64_t neigh_probes = 0;    // NTF_USE requests sent
        uint64_t flushes = 0;         // table forgotten: route change, full, lost events
        uint64_t event_overruns = 0;  // the event socket lost events (ENOBUFS)
        uint64_t link_lists = 0;      // whole device lists read (links())
    };

    // Netlink sockets (a query socket; an event socket on the neighbour, IPv4 route, IPv6
    // route and link groups, non-blocking) and the raw sockets of send_via_kernel. Needs
    // CAP_NET_ADMIN (NTF_USE) and CAP_NET_RAW.
    static Result<std::unique_ptr<NextHops>> open(const Options &options);
    static Result<std::unique_ptr<NextHops>> open() { return open(Options{}); }
    ~NextHops();
    NextHops(const NextHops &) = delete;
    NextHops &operator=(const NextHops &) = delete;

    // Per packet: no system call, no allocation, expected O(1). nullptr unless the state is Ok;
    // a destination not seen before is queued for the next poll(). The hop stays valid until
    // the next poll(). Bytes of an IPv4 IpAddr past the fourth must be zero (as IpAddr::v4
    // makes them).
    const L2Hop *lookup(const IpAddr &dst);

    // Why lookup() returned nullptr, as far as the last resolution knows.
    HopState state(const IpAddr &dst) const;

    // The control loop: applies the pending netlink events, resolves queued misses (netlink
    // round trips to the kernel, which answers at once), and runs the refresh round when it
    // is due. Call it when event_fd() is readable, while pending() is not zero, and at least
    // every few hundred milliseconds for the refresh. With `events` false the socket is not
    // read (the caller knows it has nothing): the queue and the refresh round only.
    void poll(bool events = true);
    int event_fd() const;
    size_t pending() const;

    // The slow path: a complete IPv4 or IPv6 packet (header included, any source address)
    // for the kernel to route and send, e.g. while the next hop is Resolving; the kernel
    // queues it until ARP/ND finishes. Errors (EMSGSIZE for a packet over the route's MTU,
    // ENETUNREACH, ENOBUFS, ...) are counted in Stats::kernel_send_errors.
    Result<void> send_via_kernel(const uint8_t *ip, size_t len);
    // The sockets send_via_kernel() sends from (the XDP program's egress guard knows them).
    std::vector<int> send_fds() const;

    const Stats &stats() const;

    // Devices the caller watches (its interfaces and the devices above them): poll() notes
    // each link event about one of them, or one stacked on or enslaved to one, and events
    // lost; and each about a device of one of `names` (one new here, or renamed to one).
    // True once after such a change; `urgent`, if given, tells whether a watched device left
    // or a device of a watched name came (not events lost).
    void watch_links(std::vector<uint32_t> ifindexes, std::vector<std::string> names = {});
    // One more device watched, until the next watch_links().
    void watch_link(uint32_t ifindex);
    bool take_link_change(bool *urgent = nullptr);
    // True once after an address of the namespace was added or removed (or events were lost).
    bool take_addr_change();
    // True once after what may change the IPv4 broadcast routes (rtnl::dump_broadcasts()): an
    // IPv4 address added or removed, a route of IPv4's local table, any device set down (or
    // events were lost).
    bool take_broadcast_change();
    // The watched devices that left this namespace (deleted, or moved to another) since the
    // last call, each once, even one back by now under the same index. `unknown`: events
    // were lost meanwhile, so that a device may have left and come back unseen.
    std::vector<uint32_t> take_links_gone(bool &unknown);
    // Every device of the namespace as the link events left it, those queued so far applied
    // first: listed whole (an RTM_GETLINK dump) at the first call and again after events were
    // lost, else kept from the events, so that a device change costs its event, not a list
    // of thousands from the kernel. nullptr if the list could not be read (events lost
    // twice over counts too), with the kernel's -errno or rtnl::Requests::kSocketError in
    // `err`.
    const std::vector<rtnl::Link> *links(int &err);

private:
    struct State;
    explicit NextHops(std::unique_ptr<State> s);
    std::unique_ptr<State> s_;
};

}  // namespace xesp
