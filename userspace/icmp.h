// ICMP errors the gateway sends itself. Path-MTU black holes are the most common complaint
// about IPsec gateways: a packet that no longer fits once ESP is added, and may not be
// fragmented (IPv4 with DF, or any IPv6), is answered with "fragmentation needed" (RFC 792,
// RFC 1191) or "packet too big" (RFC 4443 3.2) carrying the MTU that does fit.
#pragma once

#include <cstdint>

#include "userspace/ip.h"
#include "userspace/packet.h"

namespace xesp {

// Turns p, in place, into the ICMP error for its sender: a new IP header from `from` to the
// packet's source, the ICMP header with `mtu`, and as much of the original packet as the
// rules allow (IPv4: up to 576 bytes in all, RFC 1812 4.3.2.3; IPv6: up to 1280, RFC 4443 2.4).
// The new headers go into the headroom. Returns false (p unchanged) if `from` is not of the
// packet's family, or the packet is itself an ICMP error (never answered, RFC 1122 3.2.2).
bool icmp_too_big(Pkt &p, const IpAddr &from, uint32_t mtu);

// Whether a plaintext packet may be fragmented on the way (IPv4 without DF).
bool may_fragment(const Pkt &p);

} // namespace xesp
