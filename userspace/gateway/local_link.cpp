#include "userspace/gateway/local_link.h"

#include <algorithm>

#include <libmnl/libmnl.h>
#include <linux/ethtool.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/sockios.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "userspace/kernel/rtnl.h"

namespace xesp {

namespace {

// The veth pair is made and removed at start and stop only: each request on a socket of its
// own. These return 0 or a -errno.
constexpr time_t kRtnlTimeoutSeconds = 1;

int link_call(rtnl::Requests &rtnl, const nlmsghdr *nlh)
{
    int rc = rtnl.call(nlh);
    return rc == rtnl::Requests::kSocketError ? -EIO : rc;
}

nlmsghdr *link_request(rtnl::Requests &rtnl, uint16_t type, uint16_t flags, uint32_t ifindex)
{
    nlmsghdr *nlh = rtnl.request(type, flags);
    auto *ifi = static_cast<ifinfomsg *>(mnl_nlmsg_put_extra_header(nlh, sizeof(ifinfomsg)));
    ifi->ifi_family = AF_UNSPEC;
    ifi->ifi_index = int(ifindex);
    return nlh;
}

int delete_link(uint32_t ifindex)
{
    rtnl::Requests rtnl;
    if (auto r = rtnl.open(kRtnlTimeoutSeconds); !r)
        return -r.error().code.value();
    return link_call(rtnl, link_request(rtnl, RTM_DELLINK, 0, ifindex));
}

int create_pair()
{
    rtnl::Requests rtnl;
    if (auto r = rtnl.open(kRtnlTimeoutSeconds); !r)
        return -r.error().code.value();
    nlmsghdr *nlh = link_request(rtnl, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, 0);
    mnl_attr_put_strz(nlh, IFLA_IFNAME, LocalLink::kKernelEnd);
    mnl_attr_put_u32(nlh, IFLA_MTU, LocalLink::kMtu);
    nlattr *info = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
    mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
    nlattr *data = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
    nlattr *peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
    // The peer's attributes follow an ifinfomsg of its own inside the nest.
    std::memset(mnl_nlmsg_get_payload_tail(nlh), 0, sizeof(ifinfomsg));
    nlh->nlmsg_len += MNL_ALIGN(sizeof(ifinfomsg));
    mnl_attr_put_strz(nlh, IFLA_IFNAME, LocalLink::kGatewayEnd);
    mnl_attr_put_u32(nlh, IFLA_MTU, LocalLink::kMtu);
    mnl_attr_nest_end(nlh, peer);
    mnl_attr_nest_end(nlh, data);
    mnl_attr_nest_end(nlh, info);
    return link_call(rtnl, nlh);
}

// ioctl on an ordinary socket: interface flags, ethtool.
int dev_ioctl(unsigned long req, ifreq &ifr)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = ioctl(fd, req, &ifr) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

// TX checksum offload off: the kernel finishes checksums before the frame crosses the pair,
// since a frame the XDP program hands to AF_XDP never gets them finished later.
int tx_checksum_off(const char *name)
{
    ethtool_value ev{};
    ev.cmd = ETHTOOL_STXCSUM;
    ev.data = 0;
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    ifr.ifr_data = reinterpret_cast<char *>(&ev);
    return dev_ioctl(SIOCETHTOOL, ifr);
}

// No IPv6 on either end: no link-local address, no DAD, no MLD of their own. Best effort: a
// kernel without IPv6 has nothing to turn off.
void ipv6_off(const char *name)
{
    std::ofstream(std::string("/proc/sys/net/ipv6/conf/") + name + "/disable_ipv6") << "1\n";
}

Error link_error(const std::string &what, int rc)
{
    return make_error("local link " + std::string(LocalLink::kKernelEnd) + ": " + what + ": " +
                          std::strerror(-rc) +
                          "; the gateway's own traffic to protected sites will be dropped",
                      -rc);
}

}  // namespace

int link_set_up(const char *name)
{
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (int rc = dev_ioctl(SIOCGIFFLAGS, ifr))
        return rc;
    ifr.ifr_flags = short(ifr.ifr_flags | IFF_UP);
    return dev_ioctl(SIOCSIFFLAGS, ifr);
}

int link_clear_multicast(const char *name)
{
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
    if (int rc = dev_ioctl(SIOCGIFFLAGS, ifr))
        return rc;
    ifr.ifr_flags = short(ifr.ifr_flags & ~IFF_MULTICAST);
    return dev_ioctl(SIOCSIFFLAGS, ifr);
}

int link_set_gso_max_segs(const char *name, uint32_t segs)
{
    uint32_t ifindex = if_nametoindex(name);
    if (!ifindex)
        return -ENODEV;
    rtnl::Requests rtnl;
    if (auto r = rtnl.open(kRtnlTimeoutSeconds); !r)
        return -r.error().code.value();
    nlmsghdr *nlh = link_request(rtnl, RTM_NEWLINK, 0, ifindex);
    mnl_attr_put_u32(nlh, IFLA_GSO_MAX_SEGS, segs);
    return link_call(rtnl, nlh);
}

void LocalLink::remove_leftovers()
{
    // Deleting either end deletes the pair, its other end in another namespace included.
    for (const char *name : {kKernelEnd, kGatewayEnd})
        if (uint32_t old = if_nametoindex(name))
            (void)delete_link(old);
}

Result<LocalLink> LocalLink::create()
{
    remove_leftovers();
    if (int rc = create_pair())
        return link_error("create the veth pair", rc);
    LocalLink l;
    l.kernel_ifindex_ = if_nametoindex(kKernelEnd);
    if (!l.kernel_ifindex_)
        return link_error("find it after creating it", -ENODEV);
    for (const char *name : {kKernelEnd, kGatewayEnd})
        ipv6_off(name);
    if (int rc = tx_checksum_off(kKernelEnd))
        return link_error("turn TX checksum offload off", rc);
    for (const char *name : {kGatewayEnd, kKernelEnd})
        if (int rc = link_set_up(name))
            return link_error(std::string("set ") + name + " up", rc);
    return l;
}

LocalLink &LocalLink::operator=(LocalLink &&o) noexcept
{
    if (this != &o) {
        if (kernel_ifindex_)
            (void)delete_link(kernel_ifindex_);
        kernel_ifindex_ = o.kernel_ifindex_;
        dropped_seen_ = o.dropped_seen_;
        o.kernel_ifindex_ = 0;
        o.dropped_seen_ = 0;
    }
    return *this;
}

uint64_t LocalLink::tx_dropped() const
{
    if (kernel_ifindex_ && if_nametoindex(kKernelEnd) == kernel_ifindex_)
        dropped_seen_ = std::max(dropped_seen_, link_tx_dropped(kKernelEnd));
    return dropped_seen_;
}

uint64_t link_tx_dropped(const char *name)
{
    uint64_t n = 0;
    std::ifstream(std::string("/sys/class/net/") + name + "/statistics/tx_dropped") >> n;
    return n;
}

LocalLink::~LocalLink()
{
    if (kernel_ifindex_)
        (void)delete_link(kernel_ifindex_);
}

}  // namespace xesp
