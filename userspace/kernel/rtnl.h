// rtnetlink for the gateway: requests and their answers, and the route, neighbour and link
// messages as the next-hop resolver (nexthop.h) reads them, from answers and from events.
//
// Every request asks for an acknowledgement, so its answers always end with NLMSG_ERROR (0
// for success), or a dump's with NLMSG_DONE; they are matched to it by sequence number, and a
// late answer to a request that timed out is skipped. NextHops resolves routes and neighbours
// with one such socket; the local link makes and removes its veth pair; the gateway lists the
// devices for the MACs its interfaces take (accepted_macs).
#pragma once

#include <libmnl/libmnl.h>
#include <linux/netlink.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <array>
#include <ctime>
#include <string>
#include <vector>

#include "userspace/base/ip.h"
#include "userspace/base/result.h"

namespace xesp::rtnl {

// What RTM_GETROUTE answers for a destination.
struct Route {
    uint8_t type = 0;  // RTN_*
    uint32_t oif = 0;
    uint32_t mtu = 0;  // configured (not learnt) route MTU; 0: none
    IpAddr via;        // family 0: on-link
};

// A neighbour entry (RTM_NEWNEIGH).
struct Neigh {
    uint32_t ifindex = 0;
    uint16_t nud = 0;
    IpAddr addr;
    bool has_mac = false;
    std::array<uint8_t, 6> mac{};
};

// A device (RTM_NEWLINK).
struct Link {
    uint32_t ifindex = 0;
    uint32_t mtu = 0;
    uint32_t flags = 0;
    bool ether = false;  // an Ethernet device: mac is its address
    std::array<uint8_t, 6> mac{};
    uint32_t master = 0;  // its bridge, bond, team or VRF (IFLA_MASTER); 0: none
    uint32_t lower = 0;   // in this namespace, the device it is stacked on (IFLA_LINK); 0: none
    std::array<char, 16> kind{};  // "macvlan", "vlan", "bridge", ... (IFLA_INFO_KIND); "": none
    std::array<char, 16> name{};  // IFLA_IFNAME
};

void parse_route(const nlmsghdr *nlh, Route &r);
// False for what is not an IPv4/IPv6 neighbour with an address (proxy entries, other families).
bool parse_neigh(const nlmsghdr *nlh, Neigh &n);
// Updates `d` with what the message carries (events may leave attributes out); false for
// messages of other families (e.g. AF_BRIDGE port notifications).
bool parse_link(const nlmsghdr *nlh, Link &d);

class Requests;
// The IPv4 broadcast addresses the kernel delivers to this host and forwards to no one: its
// broadcast routes in the local table, as it made them with each address (its subnet's, for
// prefixes shorter than /31, and an explicit `brd`; never a `peer`), sorted, each once. The
// kernel filters the dump to that table (`rq` opened strict), so only those routes are sent;
// but until policy rules are added it keeps the local and main tables in one trie, and walks
// the main table's routes to skip them (about 20 ms for 300,000 routes): a call for events,
// not for every round. Read again up to `tries` times in all while routes change under it.
// Returns 0, the kernel's -errno, -EINTR (still changing), or Requests::kSocketError.
int dump_broadcasts(Requests &rq, std::vector<IpAddr> &out, int tries = 3);
// Every device of the namespace (an RTM_GETLINK dump), read again up to `tries` times in all
// while devices change under it. Returns 0, the kernel's -errno, -EINTR (still changing), or
// Requests::kSocketError.
int dump_links(Requests &rq, std::vector<Link> &out, int tries = 3);

// The Ethernet addresses device `ifindex` takes frames for as the kernel does (not those it
// bridges), each once: its own first, then in order those of the devices above it that are up,
// to kUpperDepth levels: its master if that is a bridge, bond or team, and the macvlans and
// VLANs stacked on it (on a macvlan, none: it passes up only frames to its own MAC). Not a
// macvtap's (a guest's MAC), a VRF's, a veth peer's, nor a tunnel's over it. `devices`: every
// device above it, taken or not, whose change may change the answer. Empty when it is not an
// Ethernet device, or not in `links`.
constexpr int kUpperDepth = 3;
struct Uppers {
    std::vector<std::array<uint8_t, 6>> macs;
    std::vector<uint32_t> devices;
};
Uppers accepted_macs(const std::vector<Link> &links, uint32_t ifindex);
// "02:00:00:00:00:01".
std::string mac_str(const std::array<uint8_t, 6> &mac);

class Requests {
public:
    // A round trip that failed in the socket (not an answer from the kernel): try again later.
    static constexpr int kSocketError = 1;

    Requests() = default;
    ~Requests();
    Requests(const Requests &) = delete;
    Requests &operator=(const Requests &) = delete;

    // rtnetlink answers while sendto() runs; timeout_s only bounds a lost answer. `strict`:
    // the kernel checks each request's header strictly, and filters dumps by its fields
    // (NETLINK_GET_STRICT_CHK, Linux 4.20 on).
    Result<void> open(time_t timeout_s, bool strict = false);

    // A new request in the socket's buffer: NLM_F_REQUEST | NLM_F_ACK | flags, the next
    // sequence number; type-specific headers and attributes are the caller's to add.
    nlmsghdr *request(uint16_t type, uint16_t flags);

    // Sends req and hands each answer before the acknowledgement to on_answer. Returns 0, the
    // kernel's -errno, or kSocketError.
    template <class F> int round_trip(const nlmsghdr *req, F &&on_answer)
    {
        if (mnl_socket_sendto(nl_, req, req->nlmsg_len) < 0)
            return kSocketError;
        for (;;) {
            ssize_t n = mnl_socket_recvfrom(nl_, rbuf_.data(), rbuf_.size());
            if (n < 0)
                return kSocketError;
            int left = int(n);
            for (auto *h = reinterpret_cast<const nlmsghdr *>(rbuf_.data()); mnl_nlmsg_ok(h, left);
                 h = mnl_nlmsg_next(h, &left)) {
                if (h->nlmsg_seq != req->nlmsg_seq)
                    continue;  // the late answer to a request that timed out
                // The end of a dump, which has no acknowledgement.
                if (h->nlmsg_type == NLMSG_DONE) {
                    if (h->nlmsg_flags & NLM_F_DUMP_INTR)
                        return -EINTR;  // what changed under it may be missing
                    if (mnl_nlmsg_get_payload_len(h) < sizeof(int))
                        return 0;
                    return *static_cast<const int *>(mnl_nlmsg_get_payload(h));
                }
                if (h->nlmsg_type == NLMSG_ERROR) {
                    if (mnl_nlmsg_get_payload_len(h) < sizeof(nlmsgerr))
                        return -EPROTO;
                    return static_cast<const nlmsgerr *>(mnl_nlmsg_get_payload(h))->error;
                }
                on_answer(h);
            }
        }
    }
    // A request whose only answer is the acknowledgement.
    int call(const nlmsghdr *req)
    {
        return round_trip(req, [](const nlmsghdr *) {});
    }

private:
    // Room for one datagram: a link message with its statistics and per-family settings is a
    // few KiB, and a truncated one cannot be read again.
    static constexpr size_t kRecvBufferSize = 32 * 1024;

    mnl_socket *nl_ = nullptr;
    uint32_t seq_ = 0;
    std::vector<char> rbuf_ = std::vector<char>(kRecvBufferSize);
    alignas(nlmsghdr) char qbuf_[512];
};

}  // namespace xesp::rtnl
