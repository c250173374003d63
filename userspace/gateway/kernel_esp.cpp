#include "userspace/gateway/kernel_esp.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "userspace/wire.h"

namespace xesp {

using wire::kIpv6Len;
using wire::kProtoEsp;

KernelEspInput::~KernelEspInput()
{
    if (fd4_ >= 0)
        ::close(fd4_);
    if (fd6_ >= 0)
        ::close(fd6_);
}

Result<void> KernelEspInput::open()
{
    fd4_ = ::socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, kProtoEsp);
    if (fd4_ < 0)
        return make_error(std::string("raw ESP socket (IPv4): ") + std::strerror(errno), errno);
    fd6_ = ::socket(AF_INET6, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, kProtoEsp);
    if (fd6_ < 0)
        return make_error(std::string("raw ESP socket (IPv6): ") + std::strerror(errno), errno);
    int on = 1;
    for (int opt : {IPV6_RECVPKTINFO, IPV6_RECVHOPLIMIT, IPV6_RECVTCLASS})
        if (setsockopt(fd6_, IPPROTO_IPV6, opt, &on, sizeof(on)) != 0)
            return make_error(std::string("raw ESP socket (IPv6) options: ") +
                                  std::strerror(errno),
                              errno);
    return {};
}

bool KernelEspInput::receive(Pkt &p)
{
    next6_ = !next6_;
    if (next6_)
        return receive6(p) || receive4(p);
    return receive4(p) || receive6(p);
}

bool KernelEspInput::receive4(Pkt &p)
{
    uint8_t *at = p.frame + kFrameHeadroom;
    ssize_t n = ::recv(fd4_, at, p.frame_len - kFrameHeadroom - kMaxEspOverheadBack, 0);
    if (n <= 0)
        return false;
    p.l3 = kFrameHeadroom;
    p.len = uint32_t(n);
    p.l2_len = 0;
    return true;
}

bool KernelEspInput::receive6(Pkt &p)
{
    uint8_t *at = p.frame + kFrameHeadroom;
    sockaddr_in6 from{};
    alignas(cmsghdr) uint8_t control[256];
    iovec iov{at + kIpv6Len, p.frame_len - kFrameHeadroom - kIpv6Len - kMaxEspOverheadBack};
    msghdr msg{};
    msg.msg_name = &from;
    msg.msg_namelen = sizeof(from);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd6_, &msg, 0);
    if (n <= 0)
        return false;
    const in6_pktinfo *info = nullptr;
    int hops = 64, tclass = 0;
    for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != IPPROTO_IPV6)
            continue;
        if (c->cmsg_type == IPV6_PKTINFO)
            info = reinterpret_cast<const in6_pktinfo *>(CMSG_DATA(c));
        else if (c->cmsg_type == IPV6_HOPLIMIT)
            std::memcpy(&hops, CMSG_DATA(c), sizeof(hops));
        else if (c->cmsg_type == IPV6_TCLASS)
            std::memcpy(&tclass, CMSG_DATA(c), sizeof(tclass));
    }
    if (!info)
        return false;               // cannot happen with IPV6_RECVPKTINFO: skip the packet
    // The IPv6 header the packet came with, as far as it matters to ESP.
    wire::put32(at, 0x60000000u | uint32_t(tclass & 0xff) << 20);
    wire::put16(at + 4, uint16_t(n));
    at[6] = kProtoEsp;
    at[7] = uint8_t(hops);
    std::memcpy(at + 8, from.sin6_addr.s6_addr, 16);
    std::memcpy(at + 24, info->ipi6_addr.s6_addr, 16);
    p.l3 = kFrameHeadroom;
    p.len = uint32_t(kIpv6Len) + uint32_t(n);
    p.l2_len = 0;
    return true;
}

} // namespace xesp
