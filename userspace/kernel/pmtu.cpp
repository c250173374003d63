#include "userspace/kernel/pmtu.h"

#include <linux/icmp.h>
#include <netinet/icmp6.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "userspace/base/ip_header.h"
#include "userspace/base/wire.h"

namespace xesp {

using wire::get16;
using wire::get32;

namespace {

constexpr uint8_t kIcmpUnreachable = 3, kIcmpFragNeeded = 4;  // RFC 792
constexpr uint8_t kIcmp6TooBig = 2;                           // RFC 4443 3.2
constexpr size_t kIcmpHdrLen = 8;
constexpr int kMaxSkipped = 64;

// RFC 1191 7: the plateau below a packet that did not fit, for a report without an MTU.
uint32_t plateau_below(uint32_t len)
{
    static constexpr uint32_t kPlateaus[] = {32000, 17914, 8166, 4352, 2002,
                                             1492,  1006,  508,  296,  68};
    for (uint32_t p : kPlateaus)
        if (p < len)
            return p;
    return 0;
}

// The ESP header behind the quoted IP header at q (hl bytes of header, qlen bytes quoted):
// plain ESP, or ESP in UDP with a non-zero SPI.
bool quoted_esp(const uint8_t *q, size_t qlen, size_t hl, uint8_t proto, PmtuReport *r)
{
    const uint8_t *l4 = q + hl;
    if (proto == wire::kProtoEsp) {
        if (qlen < hl + wire::kEspHdrLen)
            return false;
        r->natt = false;
    } else if (proto == wire::kProtoUdp) {
        if (qlen < hl + wire::kUdpLen + wire::kEspHdrLen)
            return false;
        l4 += wire::kUdpLen;
        r->natt = true;
    } else {
        return false;
    }
    r->spi = get32(l4);
    r->seq = get32(l4 + 4);
    return r->spi != 0;  // 0: IKE's non-ESP marker (RFC 3948 2.2), not ESP
}

}  // namespace

bool parse_pmtu_report4(const uint8_t *ip, size_t len, PmtuReport *r)
{
    // Neither header's total length is checked: the kernel gave us what arrived, and the
    // quoted packet is cut short by design.
    IpHeader h;
    if (!header_ok(parse_ip(ip, uint32_t(len), &h)) || h.version != 4 ||
        h.proto != wire::kProtoIcmp || len < h.hdr_len + kIcmpHdrLen + wire::kIpv4Len)
        return false;
    const uint8_t *icmp = ip + h.hdr_len;
    if (icmp[0] != kIcmpUnreachable || icmp[1] != kIcmpFragNeeded)
        return false;
    const uint8_t *q = icmp + kIcmpHdrLen;
    size_t qlen = len - h.hdr_len - kIcmpHdrLen;
    IpHeader qh;
    if (!header_ok(parse_ip(q, uint32_t(qlen), &qh)) || qh.version != 4)
        return false;
    if (qh.frag_offset)
        return false;  // a later fragment carries no ESP header
    if (!quoted_esp(q, qlen, qh.hdr_len, qh.proto, r))
        return false;
    uint32_t quoted_len = qh.total;
    uint32_t mtu = get16(icmp + 6);
    if (!mtu)
        mtu = plateau_below(quoted_len);
    if (mtu >= quoted_len)
        return false;  // the packet fitted: not a report to believe
    r->mtu = mtu < kPmtuFloor4 ? kPmtuFloor4 : mtu;
    r->router = h.src();
    r->src = qh.src();
    r->dst = qh.dst();
    return true;
}

bool parse_pmtu_report6(const uint8_t *icmp, size_t len, const IpAddr &router, PmtuReport *r)
{
    if (len < kIcmpHdrLen + wire::kIpv6Len || icmp[0] != kIcmp6TooBig || icmp[1] != 0)
        return false;
    const uint8_t *q = icmp + kIcmpHdrLen;
    size_t qlen = len - kIcmpHdrLen;
    IpHeader qh;
    parse_ip(q, uint32_t(qlen), &qh);
    if (qh.version != 6)
        return false;
    // Our ESP packets carry no extension headers: ESP or UDP follows the fixed header, named
    // by its next header field (byte 6).
    if (!quoted_esp(q, qlen, qh.hdr_len, q[6], r))
        return false;
    uint32_t quoted_len = qh.total;
    uint32_t mtu = get32(icmp + 4);
    if (mtu >= quoted_len)
        return false;
    r->mtu = mtu < kPmtuFloor6 ? kPmtuFloor6 : mtu;
    r->router = router;
    r->src = qh.src();
    r->dst = qh.dst();
    return true;
}

bool pmtu_seq_recent(uint32_t quoted, uint64_t oseq)
{
    uint32_t age = uint32_t(oseq) - quoted;  // modulo 2^32: a number not yet sent is huge
    return age < kPmtuSeqWindow && age < oseq;
}

PmtuListener::~PmtuListener()
{
    for (int fd : fds_)
        if (fd >= 0)
            ::close(fd);
}

Result<void> PmtuListener::open()
{
    fds_[0] = ::socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_ICMP);
    if (fds_[0] < 0)
        return make_error(std::string("raw ICMP socket: ") + std::strerror(errno), errno);
    fds_[1] = ::socket(AF_INET6, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_ICMPV6);
    if (fds_[1] < 0)
        return make_error(std::string("raw ICMPv6 socket: ") + std::strerror(errno), errno);
    // Only the two messages we read: the kernel drops the rest before they are queued.
    icmp_filter f4{~(1u << kIcmpUnreachable)};
    if (setsockopt(fds_[0], SOL_RAW, ICMP_FILTER, &f4, sizeof(f4)) != 0)
        return make_error(std::string("raw ICMP socket filter: ") + std::strerror(errno), errno);
    icmp6_filter f6;
    ICMP6_FILTER_SETBLOCKALL(&f6);
    ICMP6_FILTER_SETPASS(kIcmp6TooBig, &f6);
    if (setsockopt(fds_[1], IPPROTO_ICMPV6, ICMP6_FILTER, &f6, sizeof(f6)) != 0)
        return make_error(std::string("raw ICMPv6 socket filter: ") + std::strerror(errno), errno);
    return {};
}

bool PmtuListener::receive(PmtuReport *r)
{
    uint8_t buf[2048];
    // Reports that are not about ESP (most destination unreachables) are skipped here, a
    // bounded number of them per call.
    for (int i = 0; i < kMaxSkipped; i++) {
        ssize_t n = fds_[0] < 0 ? -1 : ::recv(fds_[0], buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        if (parse_pmtu_report4(buf, size_t(n), r))
            return true;
    }
    for (int i = 0; i < kMaxSkipped; i++) {
        sockaddr_in6 from{};
        socklen_t fl = sizeof(from);
        ssize_t n = fds_[1] < 0 ? -1
                                : ::recvfrom(fds_[1], buf, sizeof(buf), 0,
                                             reinterpret_cast<sockaddr *>(&from), &fl);
        if (n <= 0)
            break;
        if (parse_pmtu_report6(buf, size_t(n), IpAddr::v6(from.sin6_addr.s6_addr), r))
            return true;
    }
    return false;
}

}  // namespace xesp
