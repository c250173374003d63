// Fragmenting IP packets. A plaintext IPv4 packet without DF may be fragmented on its way
// (RFC 4301 8.1); once it is encrypted the gateway is the source of the outer packet, so it is
// the outer packet that gets fragmented (RFC 4303 3.3.4): the receiver reassembles before it
// decrypts. For an IPv6 outer packet the gateway adds the Fragment header itself (RFC 8200
// 4.5). The one exception is ESP in UDP (NAT-T): the far gateway's kernel would reassemble
// the outer fragments for a UDP socket, where the gateway never sees them, so the plaintext
// is split before encryption instead and the final destination reassembles it.
//
// Nothing is allocated: the first fragment stays in the packet's own frame, cut short in place,
// and the others are written into frames the caller takes from its pool. The payload never
// moves: an IPv6 Fragment header goes in by moving the headers in front of it 8 bytes into
// the headroom.
#pragma once

#include <cstdint>

#include "userspace/base/packet.h"
#include "userspace/base/wire.h"

namespace xesp {

constexpr uint32_t kIpv4MinMtu = 68;    // RFC 791: every IPv4 link carries 68 bytes
constexpr uint32_t kIpv6MinMtu = 1280;  // RFC 8200 5
using wire::kIpv6FragHdrLen;

// How many fragments of at most mtu bytes the IP packet at ip (len bytes available; the
// length in its header is the packet's) becomes: 1 if it fits as it is, 0 if it may not or
// cannot be fragmented: IPv4 with DF set, an MTU below the minimum of the family, an IPv6
// packet that is already a fragment or whose unfragmentable part leaves no room, a malformed
// header or option.
uint32_t fragments_needed(const uint8_t *ip, uint32_t len, uint32_t mtu);

// Splits p (an IPv4 or IPv6 packet at p.ip(), p.len bytes) into fragments of at most mtu
// bytes, in order: p becomes the first, extra[0 .. n-2] the others. Each extra Pkt comes with
// frame/frame_len set to a free frame; the packet is written at kFrameHeadroom and its l3, len,
// l2_len (0), l4 (0) and verdict (p's) are set. Payload sizes are multiples of 8 but for the
// last fragment.
//
// IPv4: the fragments keep the packet's Identification (xesp's outer header has one per
// packet); later fragments carry only the options whose copied flag is set (RFC 791 3.1),
// packed and padded with End of Options. A packet that is already a fragment is split again
// with its offset and MF carried over. IPv6: the Fragment header carries `ident` (the caller
// keeps a counter per SA or thread, RFC 8200 4.5) and goes behind the unfragmentable part
// (hop-by-hop, routing, and destination options in front of a routing header); p.l3 moves 8
// bytes back (over any link-layer header: p.l2_len becomes 0), and p.l4 (the ESP offset) 8
// bytes on if it is behind that part. A packet that already has a Fragment header is refused.
//
// Returns the number of fragments (1: p fits and is left as it is), or 0 with nothing changed:
// fragments_needed() said 0, there are fewer than n-1 extra frames, an extra frame is too small
// for its fragment, or (IPv6) p.l3 leaves no 8 bytes of headroom.
uint32_t fragment(Pkt &p, uint32_t mtu, uint32_t ident, Pkt *extra, uint32_t n_extra);

}  // namespace xesp
