#include "userspace/kernel/kernel_esp.h"

#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "userspace/base/wire.h"

namespace xesp {

using wire::kIpv6Len;
using wire::kProtoEsp;
using wire::kProtoUdp;

namespace {

// A classic BPF filter for a raw UDP socket: UDP to port 4500 whose payload starts with a
// non-zero word (ESP, not IKE's non-ESP marker, nor a one-byte keepalive). IPv4 raw sockets
// see the IP header first (its length from the IHL); IPv6 ones start at the UDP header.
Result<void> keep_esp_in_udp(int fd, bool v6)
{
    std::vector<sock_filter> code;
    if (v6)
        code.push_back(BPF_STMT(BPF_LDX | BPF_IMM, 0));
    else
        code.push_back(BPF_STMT(BPF_LDX | BPF_B | BPF_MSH, 0));  // X = 4 * IHL
    code.push_back(BPF_STMT(BPF_LD | BPF_H | BPF_IND, 2));       // destination port
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, wire::kNatTPort, 0, 3));
    code.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_IND, 8));  // first word of the payload
    code.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0));
    code.push_back(BPF_STMT(BPF_RET | BPF_K, 0x40000));  // ESP: keep it all
    code.push_back(BPF_STMT(BPF_RET | BPF_K, 0));        // anything else
    sock_fprog prog{uint16_t(code.size()), code.data()};
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog)) != 0)
        return make_error(std::string("raw UDP socket filter: ") + std::strerror(errno), errno);
    return {};
}

}  // namespace

KernelEspInput::~KernelEspInput()
{
    for (int fd : fds_)
        if (fd >= 0)
            ::close(fd);
}

Result<void> KernelEspInput::open()
{
    struct Want {
        int family, proto;
        const char *what;
    };
    const Want want[kSockets] = {{AF_INET, kProtoEsp, "raw ESP socket (IPv4)"},
                                 {AF_INET6, kProtoEsp, "raw ESP socket (IPv6)"},
                                 {AF_INET, kProtoUdp, "raw UDP socket (IPv4)"},
                                 {AF_INET6, kProtoUdp, "raw UDP socket (IPv6)"}};
    for (int i = 0; i < kSockets; i++) {
        fds_[i] = ::socket(want[i].family, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, want[i].proto);
        if (fds_[i] < 0)
            return make_error(std::string(want[i].what) + ": " + std::strerror(errno), errno);
    }
    for (int i : {Udp4, Udp6})
        if (auto r = keep_esp_in_udp(fds_[i], i == Udp6); !r)
            return r;
    int on = 1;
    for (int i : {Esp6, Udp6})
        for (int opt : {IPV6_RECVPKTINFO, IPV6_RECVHOPLIMIT, IPV6_RECVTCLASS})
            if (setsockopt(fds_[i], IPPROTO_IPV6, opt, &on, sizeof(on)) != 0)
                return make_error(std::string(want[i].what) + " options: " + std::strerror(errno),
                                  errno);
    return {};
}

KernelEspInput::KernelEspInput(const int (&fds)[kSockets])
{
    for (int i = 0; i < kSockets; i++)
        fds_[i] = fds[i];
}

bool KernelEspInput::receive(Pkt &p)
{
    for (int k = 0; k < kSockets; k++) {
        int i = next_;
        next_ = (next_ + 1) % kSockets;
        for (;;) {
            Read r = i == Esp4 || i == Udp4
                         ? receive4(fds_[i], p)
                         : receive6(fds_[i], i == Esp6 ? kProtoEsp : kProtoUdp, p);
            if (r == Read::Got)
                return true;
            if (r == Read::Empty)
                break;
            too_big_++;  // dropped whole; the next datagram may fit
        }
    }
    return false;
}

// A datagram longer than the buffer comes back cut to the buffer, with MSG_TRUNC set: what
// is left would fail its ICV at best, and a cut packet is never processed. The buffer is the
// frame less the room ESP needs, so only reassembled packets near 4 KiB and above hit this.
KernelEspInput::Read KernelEspInput::receive4(int fd, Pkt &p)
{
    uint8_t *at = p.frame + kFrameHeadroom;
    iovec iov{at, p.frame_len - kFrameHeadroom - kMaxEspOverheadBack};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    ssize_t n = ::recvmsg(fd, &msg, 0);
    if (n <= 0)
        return Read::Empty;
    if (msg.msg_flags & MSG_TRUNC)
        return Read::TooBig;
    p.l3 = kFrameHeadroom;
    p.len = uint32_t(n);
    p.l2_len = 0;
    return Read::Got;
}

KernelEspInput::Read KernelEspInput::receive6(int fd, uint8_t next_header, Pkt &p)
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
    ssize_t n = ::recvmsg(fd, &msg, 0);
    if (n <= 0)
        return Read::Empty;
    if (msg.msg_flags & MSG_TRUNC)
        return Read::TooBig;
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
        return Read::Empty;  // cannot happen with IPV6_RECVPKTINFO: skip the packet
    // The IPv6 header the packet came with, as far as it matters to ESP.
    wire::put32(at, 0x60000000u | uint32_t(tclass & 0xff) << 20);
    wire::put16(at + 4, uint16_t(n));
    at[6] = next_header;
    at[7] = uint8_t(hops);
    std::memcpy(at + 8, from.sin6_addr.s6_addr, 16);
    std::memcpy(at + 24, info->ipi6_addr.s6_addr, 16);
    p.l3 = kFrameHeadroom;
    p.len = uint32_t(kIpv6Len) + uint32_t(n);
    p.l2_len = 0;
    return Read::Got;
}

}  // namespace xesp
