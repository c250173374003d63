#include "userspace/kernel/rtnl.h"

#include <linux/neighbour.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace xesp::rtnl {

namespace {

// An address attribute of family `af`; family 0 when it does not fit.
IpAddr addr_from(int af, const void *p, size_t len)
{
    if (af == AF_INET && len >= 4)
        return IpAddr::v4(static_cast<const uint8_t *>(p));
    if (af == AF_INET6 && len >= 16)
        return IpAddr::v6(static_cast<const uint8_t *>(p));
    return IpAddr{};
}

struct Attrs {
    const nlattr **tb;
    int max;
};

int store_attr(const nlattr *a, void *data)
{
    auto *t = static_cast<Attrs *>(data);
    int type = mnl_attr_get_type(a);
    if (type <= t->max)
        t->tb[type] = a;
    return MNL_CB_OK;
}

bool get_u32(const nlattr *a, uint32_t &out)
{
    if (!a || mnl_attr_get_payload_len(a) < 4)
        return false;
    out = mnl_attr_get_u32(a);
    return true;
}

}  // namespace

void parse_route(const nlmsghdr *nlh, Route &r)
{
    const auto *rtm = static_cast<const rtmsg *>(mnl_nlmsg_get_payload(nlh));
    const nlattr *tb[RTA_MAX + 1] = {};
    Attrs attrs{tb, RTA_MAX};
    mnl_attr_parse(nlh, sizeof(*rtm), store_attr, &attrs);
    r.type = rtm->rtm_type;
    get_u32(tb[RTA_OIF], r.oif);
    if (tb[RTA_GATEWAY]) {
        r.via = addr_from(rtm->rtm_family, mnl_attr_get_payload(tb[RTA_GATEWAY]),
                          mnl_attr_get_payload_len(tb[RTA_GATEWAY]));
    } else if (tb[RTA_VIA] && mnl_attr_get_payload_len(tb[RTA_VIA]) >= sizeof(rtvia)) {
        // An IPv4 route through an IPv6 gateway (RFC 5549): the neighbour is an ND entry.
        const auto *via = static_cast<const rtvia *>(mnl_attr_get_payload(tb[RTA_VIA]));
        r.via = addr_from(via->rtvia_family, via->rtvia_addr,
                          mnl_attr_get_payload_len(tb[RTA_VIA]) - sizeof(rtvia));
    }
    // A route MTU that expires is path MTU the kernel learnt from an ICMP error, for its own
    // packets. Forwarded packets go by the route's configured MTU, as the kernel's own
    // forwarding does (net.ipv4.ip_forward_use_pmtu=0): a learnt value can be forged, and the
    // gateway's own ICMP errors to its own traffic would otherwise shrink the tunnel's.
    bool learnt = false;
    if (tb[RTA_CACHEINFO] && mnl_attr_get_payload_len(tb[RTA_CACHEINFO]) >= sizeof(rta_cacheinfo))
        learnt = static_cast<const rta_cacheinfo *>(mnl_attr_get_payload(tb[RTA_CACHEINFO]))
                     ->rta_expires != 0;
    if (tb[RTA_METRICS] && !learnt) {
        const nlattr *mx[RTAX_MAX + 1] = {};
        Attrs metrics{mx, RTAX_MAX};
        mnl_attr_parse_nested(tb[RTA_METRICS], store_attr, &metrics);
        get_u32(mx[RTAX_MTU], r.mtu);
    }
}

bool parse_neigh(const nlmsghdr *nlh, Neigh &n)
{
    if (mnl_nlmsg_get_payload_len(nlh) < sizeof(ndmsg))
        return false;
    const auto *ndm = static_cast<const ndmsg *>(mnl_nlmsg_get_payload(nlh));
    if ((ndm->ndm_family != AF_INET && ndm->ndm_family != AF_INET6) || (ndm->ndm_flags & NTF_PROXY))
        return false;
    const nlattr *tb[NDA_MAX + 1] = {};
    Attrs attrs{tb, NDA_MAX};
    mnl_attr_parse(nlh, sizeof(*ndm), store_attr, &attrs);
    if (!tb[NDA_DST])
        return false;
    n.ifindex = uint32_t(ndm->ndm_ifindex);
    n.nud = ndm->ndm_state;
    n.addr = addr_from(ndm->ndm_family, mnl_attr_get_payload(tb[NDA_DST]),
                       mnl_attr_get_payload_len(tb[NDA_DST]));
    n.has_mac = tb[NDA_LLADDR] && mnl_attr_get_payload_len(tb[NDA_LLADDR]) == 6;
    if (n.has_mac)
        std::memcpy(n.mac.data(), mnl_attr_get_payload(tb[NDA_LLADDR]), 6);
    return n.addr.family != 0;
}

bool parse_link(const nlmsghdr *nlh, Link &d)
{
    if (mnl_nlmsg_get_payload_len(nlh) < sizeof(ifinfomsg))
        return false;
    const auto *ifi = static_cast<const ifinfomsg *>(mnl_nlmsg_get_payload(nlh));
    if (ifi->ifi_family != AF_UNSPEC)  // e.g. AF_BRIDGE port notifications
        return false;
    const nlattr *tb[IFLA_MAX + 1] = {};
    Attrs attrs{tb, IFLA_MAX};
    mnl_attr_parse(nlh, sizeof(*ifi), store_attr, &attrs);
    d.ifindex = uint32_t(ifi->ifi_index);
    d.flags = ifi->ifi_flags;
    get_u32(tb[IFLA_MTU], d.mtu);
    if (tb[IFLA_IFNAME] && mnl_attr_validate(tb[IFLA_IFNAME], MNL_TYPE_NUL_STRING) == 0) {
        d.name = {};
        std::strncpy(d.name.data(), mnl_attr_get_str(tb[IFLA_IFNAME]), d.name.size() - 1);
    }
    if (tb[IFLA_ADDRESS]) {
        d.ether = ifi->ifi_type == ARPHRD_ETHER && mnl_attr_get_payload_len(tb[IFLA_ADDRESS]) == 6;
        if (d.ether)
            std::memcpy(d.mac.data(), mnl_attr_get_payload(tb[IFLA_ADDRESS]), 6);
    }
    d.master = d.lower = 0;  // each is in every message that has it
    d.kind = {};
    get_u32(tb[IFLA_MASTER], d.master);
    if (tb[IFLA_LINKINFO]) {
        const nlattr *info[IFLA_INFO_MAX + 1] = {};
        Attrs nested{info, IFLA_INFO_MAX};
        mnl_attr_parse_nested(tb[IFLA_LINKINFO], store_attr, &nested);
        if (info[IFLA_INFO_KIND] &&
            mnl_attr_validate(info[IFLA_INFO_KIND], MNL_TYPE_NUL_STRING) == 0)
            std::strncpy(d.kind.data(), mnl_attr_get_str(info[IFLA_INFO_KIND]), d.kind.size() - 1);
    }
    // A veth's peer in another namespace carries that namespace's id, and its index there.
    uint32_t lower = 0;
    if (get_u32(tb[IFLA_LINK], lower) && !tb[IFLA_LINK_NETNSID] && lower != d.ifindex)
        d.lower = lower;
    return true;
}

namespace {

int dump_links_once(Requests &rq, std::vector<Link> &out)
{
    out.clear();
    nlmsghdr *nlh = rq.request(RTM_GETLINK, NLM_F_DUMP);
    auto *ifi = static_cast<ifinfomsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
    ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_u32(nlh, IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);  // a tenth of the bytes
    bool interrupted = false;
    int err = rq.round_trip(nlh, [&](const nlmsghdr *h) {
        interrupted |= (h->nlmsg_flags & NLM_F_DUMP_INTR) != 0;
        Link l;
        if (h->nlmsg_type == RTM_NEWLINK && parse_link(h, l))
            out.push_back(l);
    });
    return err ? err : interrupted ? -EINTR : 0;  // devices changed under it: not the whole list
}

int dump_broadcasts_once(Requests &rq, std::vector<IpAddr> &out)
{
    out.clear();
    nlmsghdr *nlh = rq.request(RTM_GETROUTE, NLM_F_DUMP);
    auto *rtm = static_cast<rtmsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtmsg)));
    rtm->rtm_family = AF_INET;
    rtm->rtm_table = RT_TABLE_LOCAL;
    rtm->rtm_type = RTN_BROADCAST;
    bool interrupted = false;
    int err = rq.round_trip(nlh, [&](const nlmsghdr *h) {
        interrupted |= (h->nlmsg_flags & NLM_F_DUMP_INTR) != 0;
        if (h->nlmsg_type != RTM_NEWROUTE || mnl_nlmsg_get_payload_len(h) < sizeof(rtmsg))
            return;
        const auto *m = static_cast<const rtmsg *>(mnl_nlmsg_get_payload(h));
        const nlattr *tb[RTA_MAX + 1] = {};
        Attrs attrs{tb, RTA_MAX};
        mnl_attr_parse(h, sizeof(*m), store_attr, &attrs);
        uint32_t table = m->rtm_table;
        get_u32(tb[RTA_TABLE], table);
        // What was asked for only, should a kernel filter less.
        if (m->rtm_family != AF_INET || m->rtm_type != RTN_BROADCAST || m->rtm_dst_len != 32 ||
            table != RT_TABLE_LOCAL || !tb[RTA_DST])
            return;
        IpAddr a = addr_from(AF_INET, mnl_attr_get_payload(tb[RTA_DST]),
                             mnl_attr_get_payload_len(tb[RTA_DST]));
        if (a.family)
            out.push_back(a);
    });
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return err ? err : interrupted ? -EINTR : 0;
}

// dump(rq, out) again, up to `tries` times in all, while what it reads changes under it.
template <typename T>
int dump_tries(int (*dump)(Requests &, std::vector<T> &), Requests &rq, std::vector<T> &out,
               int tries)
{
    int err = -EINTR;
    for (int i = 0; i < tries && err == -EINTR; i++)
        err = dump(rq, out);
    return err;
}

}  // namespace

int dump_broadcasts(Requests &rq, std::vector<IpAddr> &out, int tries)
{
    return dump_tries(dump_broadcasts_once, rq, out, tries);
}

int dump_links(Requests &rq, std::vector<Link> &out, int tries)
{
    return dump_tries(dump_links_once, rq, out, tries);
}

namespace {

bool kind_is(const Link &l, std::initializer_list<const char *> kinds)
{
    for (const char *k : kinds)
        if (std::strcmp(l.kind.data(), k) == 0)
            return true;
    return false;
}

}  // namespace

Uppers accepted_macs(const std::vector<Link> &links, uint32_t ifindex)
{
    Uppers u;
    std::unordered_map<uint32_t, const Link *> by_index;
    std::unordered_multimap<uint32_t, const Link *> stacked;  // by the device below
    for (const Link &l : links) {
        by_index.emplace(l.ifindex, &l);
        if (l.lower)
            stacked.emplace(l.lower, &l);
    }
    auto self = by_index.find(ifindex);
    if (self == by_index.end() || !self->second->ether)
        return u;
    u.macs.push_back(self->second->mac);
    // Each device above, once, and whether the kernel gives it frames for its MAC: it is up,
    // and every device between it and `ifindex` passes them on.
    struct Node {
        const Link *l;
        bool takes;
    };
    std::unordered_set<uint32_t> seen{ifindex};
    std::vector<Node> level{{self->second, true}}, next;
    auto take = [&](const Link *l, bool takes) {
        if (!seen.insert(l->ifindex).second)
            return;
        u.devices.push_back(l->ifindex);
        takes = takes && (l->flags & IFF_UP) && l->ether;
        next.push_back({l, takes});
        if (takes && std::find(u.macs.begin(), u.macs.end(), l->mac) == u.macs.end())
            u.macs.push_back(l->mac);
    };
    for (int depth = 0; depth < kUpperDepth && !level.empty(); depth++) {
        next.clear();
        for (const Node &n : level) {
            // A macvlan passes up only frames to its own MAC: not a VLAN's above it, nor its
            // bridge's.
            const bool passes = n.takes && (n.l->ifindex == ifindex || !kind_is(*n.l, {"macvlan"}));
            if (auto m = by_index.find(n.l->master); n.l->master && m != by_index.end())
                take(m->second, passes && kind_is(*m->second, {"bridge", "bond", "team"}));
            auto [first, last] = stacked.equal_range(n.l->ifindex);
            for (auto it = first; it != last; ++it)
                take(it->second, passes && kind_is(*it->second, {"macvlan", "vlan"}));
        }
        level.swap(next);
    }
    std::sort(u.macs.begin() + 1, u.macs.end());  // one order, whatever the dump's
    std::sort(u.devices.begin(), u.devices.end());
    return u;
}

std::string mac_str(const std::array<uint8_t, 6> &mac)
{
    char s[18];
    std::snprintf(s, sizeof s, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
                  mac[4], mac[5]);
    return s;
}

Requests::~Requests()
{
    if (nl_)
        mnl_socket_close(nl_);
}

Result<void> Requests::open(time_t timeout_s, bool strict)
{
    nl_ = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    if (!nl_ || mnl_socket_bind(nl_, 0, MNL_SOCKET_AUTOPID) < 0)
        return make_error(std::string("cannot open a netlink socket: ") + std::strerror(errno),
                          errno);
    timeval tv{timeout_s, 0};
    setsockopt(mnl_socket_get_fd(nl_), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;  // acknowledgements without a copy of the request
    mnl_socket_setsockopt(nl_, NETLINK_CAP_ACK, &one, sizeof(one));
    if (strict && mnl_socket_setsockopt(nl_, NETLINK_GET_STRICT_CHK, &one, sizeof(one)) < 0) {
        int err = errno;
        mnl_socket_close(nl_);
        nl_ = nullptr;
        return make_error(std::string("netlink: no strict checking: ") + std::strerror(err), err);
    }
    return {};
}

nlmsghdr *Requests::request(uint16_t type, uint16_t flags)
{
    nlmsghdr *nlh = mnl_nlmsg_put_header(qbuf_);
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    nlh->nlmsg_seq = ++seq_;
    return nlh;
}

}  // namespace xesp::rtnl
