// Path MTU discovery for the tunnels themselves (RFC 4301 8.2, RFC 1191, RFC 8201). An ESP
// packet with DF set (copied from the inner packet) that meets a smaller link between the
// gateways is answered by that router with ICMP "fragmentation needed" / ICMPv6 "packet too
// big", addressed to the gateway's public address, quoting our ESP header. The kernel has no
// use for it (it owns no such SA); without us the inner sender never learns, and its large
// packets vanish: the path-MTU black hole.
//
// Raw ICMP sockets (filtered in the kernel to these two messages) get a copy of each report.
// In transport mode the quoted source is a host behind the gateway, and so is the report's
// destination: the XDP program hands such reports to the gateway (XESP_META_REPORT) instead.
// The gateway checks it against the SA it names (pmtu_acceptable) and lowers that SA's path
// MTU; from then on a DF packet too big for it is answered with the smaller tunnel MTU. A
// learnt path MTU ages out (RFC 1191 6.3 suggests ten minutes; `xesp daemon --pmtu-expires`),
// so a path that grows again is found again.
#pragma once

#include <cstddef>
#include <cstdint>

#include "userspace/base/ip.h"
#include "userspace/base/result.h"

namespace xesp {

constexpr uint32_t kPmtuExpiresSeconds = 600;  // the default
// The smallest path MTU believed: what every IPv4 host must accept (RFC 791) and the IPv6
// minimum link MTU (RFC 8200 5). A report of less is read as this (RFC 8201 4: never below
// 1280; Linux's min_pmtu does the same for IPv4).
constexpr uint32_t kPmtuFloor4 = 576, kPmtuFloor6 = 1280;
// A report must quote a sequence number the SA sent at most this many packets ago: a blind
// spoofer must then guess the SPI and land in a window of 2^20 out of 2^32 numbers, while a
// real router answers within a round trip (a million packets is seconds at line rate).
constexpr uint32_t kPmtuSeqWindow = 1u << 20;

// What one ICMP report says about one of our ESP packets.
struct PmtuReport {
    IpAddr router;      // who sent the report
    IpAddr src, dst;    // the quoted packet's addresses (our outer header)
    uint32_t spi = 0;   // host order
    uint32_t seq = 0;   // the quoted sequence number (its low 32 bits with ESN)
    uint32_t mtu = 0;   // the MTU the router offers, floors applied
    bool natt = false;  // the quoted packet was ESP in UDP (RFC 3948)
};

// An ICMP message as an IPv4 raw socket delivers it (starting at the IP header), or an ICMPv6
// message as an IPv6 raw socket does (no IP header; `router` is the sender's address). True
// and *r filled for "fragmentation needed" (type 3 code 4) or "packet too big" (type 2 code
// 0) that quotes ESP, or ESP in UDP with a non-zero SPI, far enough to read the SPI and the
// sequence number; false for anything else. A report with no MTU (an RFC 1191 5 old router)
// gets the plateau below the quoted packet's length.
bool parse_pmtu_report4(const uint8_t *ip, size_t len, PmtuReport *r);
bool parse_pmtu_report6(const uint8_t *icmp, size_t len, const IpAddr &router, PmtuReport *r);

// Whether a report is believable for an SA that sent up to sequence number `oseq` (the low 32
// bits are compared, as the quoted header carries only those): the quoted number is one it
// sent, at most kPmtuSeqWindow packets ago.
bool pmtu_seq_recent(uint32_t quoted, uint64_t oseq);

// The raw ICMP sockets. Without CAP_NET_RAW open() fails: the gateway then works without
// learning path MTUs, and says so.
class PmtuListener {
public:
    PmtuListener() = default;
    ~PmtuListener();
    PmtuListener(const PmtuListener &) = delete;
    PmtuListener &operator=(const PmtuListener &) = delete;

    Result<void> open();
    // The next report waiting on either socket; false when there is none (or after a bounded
    // number of messages that were not reports about ESP: call again later).
    bool receive(PmtuReport *r);
    const int *fds() const { return fds_; }  // kSockets of them (-1 when not open)
    static constexpr int kSockets = 2;

private:
    int fds_[kSockets] = {-1, -1};
};

}  // namespace xesp
