#include "userspace/gateway/iface_checksum.h"

#include <linux/ethtool.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/rtnetlink.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>
#include <linux/net_namespace.h>
#include <sched.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "userspace/kernel/rtnl.h"

namespace xesp {

namespace {

struct LinkKind {
    std::string kind;             // IFLA_INFO_KIND: "veth", "tun", ...
    uint32_t link = 0;            // IFLA_LINK: a veth's peer
    bool link_elsewhere = false;  // IFLA_LINK_NETNSID: the peer is in another namespace,
    int32_t link_nsid = -1;       // known here by this id
};

int kind_attr(const nlattr *a, void *data)
{
    if (mnl_attr_get_type(a) == IFLA_INFO_KIND && mnl_attr_validate(a, MNL_TYPE_STRING) >= 0)
        *static_cast<std::string *>(data) = mnl_attr_get_str(a);
    return MNL_CB_OK;
}

int link_attr(const nlattr *a, void *data)
{
    auto *k = static_cast<LinkKind *>(data);
    switch (mnl_attr_get_type(a)) {
    case IFLA_LINK:
        if (mnl_attr_validate(a, MNL_TYPE_U32) >= 0)
            k->link = mnl_attr_get_u32(a);
        break;
    case IFLA_LINK_NETNSID:
        k->link_elsewhere = true;
        if (mnl_attr_validate(a, MNL_TYPE_U32) >= 0)
            k->link_nsid = int32_t(mnl_attr_get_u32(a));
        break;
    case IFLA_LINKINFO:
        mnl_attr_parse_nested(a, kind_attr, &k->kind);
        break;
    }
    return MNL_CB_OK;
}

bool link_kind(uint32_t ifindex, LinkKind *out)
{
    rtnl::Requests rq;
    if (!rq.open(1))
        return false;
    nlmsghdr *nlh = rq.request(RTM_GETLINK, 0);
    auto *ifi = static_cast<ifinfomsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
    ifi->ifi_index = int(ifindex);
    bool got = false;
    int err = rq.round_trip(nlh, [&](const nlmsghdr *h) {
        if (h->nlmsg_type != RTM_NEWLINK)
            return;
        mnl_attr_parse(h, sizeof(ifinfomsg), link_attr, out);
        got = true;
    });
    return !err && got;
}

// The id this namespace knows the namespace of fd by; -1 if none.
int32_t nsid_of(int fd)
{
    rtnl::Requests rq;
    if (!rq.open(1))
        return -1;
    nlmsghdr *nlh = rq.request(RTM_GETNSID, 0);
    auto *g = static_cast<rtgenmsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(rtgenmsg)));
    g->rtgen_family = AF_UNSPEC;
    mnl_attr_put_u32(nlh, NETNSA_FD, uint32_t(fd));
    int32_t id = -1;
    int err = rq.round_trip(nlh, [&](const nlmsghdr *h) {
        if (h->nlmsg_type != RTM_NEWNSID)
            return;
        mnl_attr_parse(
            h, sizeof(rtgenmsg),
            [](const nlattr *a, void *data) {
                if (mnl_attr_get_type(a) == NETNSA_NSID && mnl_attr_validate(a, MNL_TYPE_U32) >= 0)
                    *static_cast<int32_t *>(data) = int32_t(mnl_attr_get_u32(a));
                return MNL_CB_OK;
            },
            &id);
    });
    return err ? -1 : id;
}

// A socket in the named namespace (under /run/netns, where `ip netns` keeps them) this one
// knows by nsid, made by a thread that enters it (a socket stays in the namespace it was made
// in; only that thread moves); -1 if none is named. Its name in *ns.
int socket_in_ns(int32_t nsid, std::string *ns)
{
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator("/run/netns", ec)) {
        int fd = open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        int s = -1;
        if (nsid_of(fd) == nsid)
            std::thread([&] {
                if (setns(fd, CLONE_NEWNET) == 0)
                    s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            }).join();
        close(fd);
        if (s >= 0) {
            *ns = e.path().filename();
            return s;
        }
    }
    return -1;
}

// TX checksum offload of the device with this ifindex in the namespace of socket fd: 1 on,
// 0 off, -1 cannot tell. Its name there in *name.
int tx_checksum(int fd, uint32_t ifindex, std::string *name)
{
    ifreq ifr{};
    ifr.ifr_ifindex = int(ifindex);
    if (ioctl(fd, SIOCGIFNAME, &ifr) < 0)
        return -1;
    *name = ifr.ifr_name;
    ethtool_value ev{};
    ev.cmd = ETHTOOL_GTXCSUM;
    ifr.ifr_data = reinterpret_cast<char *>(&ev);
    if (ioctl(fd, SIOCETHTOOL, &ifr) < 0)
        return -1;
    return ev.data != 0;
}

std::string veth_warning(const LinkKind &k)
{
    std::string ns;
    int fd = !k.link            ? -1
             : k.link_elsewhere ? socket_in_ns(k.link_nsid, &ns)
                                : socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    std::string peer;
    int on = fd >= 0 ? tx_checksum(fd, k.link, &peer) : -1;
    if (fd >= 0)
        close(fd);
    if (on == 0)
        return "";
    if (on < 0)
        return "veth peer in another network namespace: make sure its TX checksum offload is "
               "off (`ethtool -K PEER tx off` in that namespace), or TCP and UDP from it are "
               "forwarded with unfinished checksums";
    std::string fix =
        (ns.empty() ? "" : "ip netns exec " + ns + " ") + "ethtool -K " + peer + " tx off";
    return "veth peer " + peer + (ns.empty() ? "" : " (namespace " + ns + ")") +
           " has TX checksum offload on: TCP and UDP from it are forwarded with unfinished "
           "checksums; run `" +
           fix + "`";
}

std::string tap_warning(const std::string &name)
{
    std::ifstream f("/sys/class/net/" + name + "/tun_flags");
    unsigned flags = 0;
    if (!(f >> std::hex >> flags) || !(flags & IFF_VNET_HDR))
        return "";
    return "tap with a vnet header: its writer may hand over TCP and UDP with unfinished "
           "checksums (VIRTIO_NET_HDR_F_NEEDS_CSUM); turn checksum offload off there (qemu: "
           "csum=off on the virtio-net device)";
}

}  // namespace

std::string checksum_warning(const std::string &name, uint32_t ifindex)
{
    LinkKind k;
    if (!link_kind(ifindex, &k))
        return "";
    if (k.kind == "veth")
        return veth_warning(k);
    if (k.kind == "tun")
        return tap_warning(name);
    return "";
}

}  // namespace xesp
