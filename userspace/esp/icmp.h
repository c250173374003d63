// ICMP errors the gateway sends itself. Path-MTU black holes are the most common complaint
// about IPsec gateways: a packet that no longer fits once ESP is added, and may not be
// fragmented (IPv4 with DF, or any IPv6), is answered with "fragmentation needed" (RFC 792,
// RFC 1191) or "packet too big" (RFC 4443 3.2) carrying the MTU that does fit. A packet whose
// TTL runs out is answered with "time exceeded", so that traceroute shows the gateway as the
// hop it is.
#pragma once

#include <algorithm>
#include <cstdint>

#include "userspace/base/ip.h"
#include "userspace/base/packet.h"

namespace xesp {

// Turns p, in place, into the ICMP error for its sender: a new IP header from `from` to the
// packet's source, the ICMP header with `mtu`, and as much of the original packet as the
// rules allow (IPv4: up to 576 bytes in all, RFC 1812 4.3.2.3; IPv6: up to 1280, RFC 4443 2.4).
// The new headers go into the headroom. Returns false (p unchanged) if `from` is not of the
// packet's family, or the packet may not be answered: as for time exceeded below, except that
// IPv6 packets to a multicast destination are answered (RFC 4443 2.4 e.2).
bool icmp_too_big(Pkt &p, const IpAddr &from, uint32_t mtu);

// Whether icmp_too_big() (too_big) or icmp_time_exceeded() would answer the packet at ip, from
// an address of its family: its rules alone, before a frame is taken for the answer.
bool icmp_may_answer(const uint8_t *ip, uint32_t len, bool too_big);

// The same for a packet whose TTL / hop limit ran out at this hop: ICMP time exceeded (RFC 792)
// or ICMPv6 hop limit exceeded (RFC 4443 3.3), verdict TimeExceeded. Never for an ICMP error, a
// fragment other than the first, a packet to a multicast or broadcast address, or one from an
// unspecified, loopback or multicast source (RFC 1812 4.3.2.7): false, p unchanged.
bool icmp_time_exceeded(Pkt &p, const IpAddr &from);

// How many ICMP errors a gateway sends: a token bucket of `burst` refilled at `per_sec`, the
// kernel's own defaults (net.ipv4.icmp_msgs_per_sec, icmp_msgs_burst). A flood of expiring
// packets must not become a flood of answers (RFC 1812 4.3.2.8). "Too big" is not held to it,
// as the kernel does not hold path MTU discovery to it (icmpv4_mask_allow(), and
// net.ipv6.icmp.ratemask leaves out type 2): each answer goes to a sender whose packet it
// drops, and a limit would leave the senders over it in a black hole.
class IcmpLimiter {
public:
    explicit IcmpLimiter(uint32_t per_sec = 1000, uint32_t burst = 50)
            : per_sec_(per_sec), burst_(burst), tokens_(burst)
    {}

    // One error may go at now_ns (a monotonic clock): takes a token.
    bool allow(uint64_t now_ns)
    {
        constexpr uint64_t kSecond = 1000000000;
        // Capped so that the product below cannot overflow after a long quiet spell.
        uint64_t elapsed =
            std::min<uint64_t>(now_ns > last_ns_ ? now_ns - last_ns_ : 0, 60 * kSecond);
        if (uint64_t earned = elapsed * per_sec_ / kSecond) {
            tokens_ = uint32_t(std::min<uint64_t>(burst_, tokens_ + earned));
            // A partly earned token is kept, unless the bucket is full anyway.
            last_ns_ = tokens_ == burst_ ? now_ns : last_ns_ + earned * kSecond / per_sec_;
        }
        if (!tokens_)
            return false;
        --tokens_;
        return true;
    }

private:
    uint64_t per_sec_;
    uint32_t burst_;
    uint32_t tokens_;
    uint64_t last_ns_ = 0;
};

// Time exceeded held to `limit`: a packet that may not be answered at all takes no token, so
// that a flood of those (ICMP errors, multicast with TTL 1) does not silence the answers that
// may go.
enum class IcmpAnswer { Sent, Refused, Limited };
IcmpAnswer icmp_time_exceeded(Pkt &p, const IpAddr &from, IcmpLimiter &limit, uint64_t now_ns);

// Whether a plaintext packet may be fragmented on the way (IPv4 without DF).
bool may_fragment(const Pkt &p);

}  // namespace xesp
