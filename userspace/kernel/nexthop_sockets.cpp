// NextHops' sockets: the netlink query and event sockets it opens, and the raw sockets of
// send_via_kernel(), the slow path that hands a packet to the kernel to route and send.
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "userspace/base/ip_header.h"
#include "userspace/kernel/nexthop_state.h"

namespace xesp {

namespace {

// rtnetlink answers while sendto() runs; the timeout only bounds a lost answer.
constexpr time_t kQueryTimeoutSeconds = 1;
// Events arrive in bursts (a link going down takes its routes and neighbours with it); an
// overrun costs a flush, so the buffer is generous.
constexpr int kEventSocketBuffer = 4 << 20;

// "WHAT: strerror(errno)", with errno read before anything else can change it.
Error sys_fail(const std::string &what)
{
    int err = errno;
    return make_error(what + ": " + std::strerror(err), err);
}

}  // namespace

NextHops::State::~State()
{
    if (events)
        mnl_socket_close(events);
    if (raw4 >= 0)
        close(raw4);
    if (raw6 >= 0)
        close(raw6);
}

Result<void> NextHops::State::open_sockets()
{
    if (auto r = query.open(kQueryTimeoutSeconds); !r)
        return make_error("nexthop: " + r.error().message, r.error().code.value());

    events = mnl_socket_open2(NETLINK_ROUTE, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (!events || mnl_socket_bind(events, 0, MNL_SOCKET_AUTOPID) < 0)
        return sys_fail("nexthop: cannot open a netlink event socket");
    for (int group : {RTNLGRP_NEIGH, RTNLGRP_IPV4_ROUTE, RTNLGRP_IPV6_ROUTE, RTNLGRP_LINK,
                      RTNLGRP_IPV4_IFADDR, RTNLGRP_IPV6_IFADDR}) {
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
    raw6 = socket(AF_INET6, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);  // -1 without IPv6
    return {};
}

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
    IpHeader h;
    parse_ip(ip, uint32_t(len), &h);  // only the address is needed: the kernel checks
    ssize_t sent = -1;
    IpAddr dst;
    errno = EINVAL;
    if (h.version == 4) {
        dst = h.dst();
        sockaddr_in to{};
        to.sin_family = AF_INET;
        std::memcpy(&to.sin_addr, dst.b.data(), 4);
        sent = sendto(s.raw4, ip, len, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to), sizeof(to));
    } else if (h.version == 6) {
        dst = h.dst();
        sockaddr_in6 to{};
        to.sin6_family = AF_INET6;
        std::memcpy(&to.sin6_addr, dst.b.data(), 16);
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
                          (dst.family ? dst.str() : std::string("?")) + ": " + std::strerror(err),
                      err);
}

}  // namespace xesp
