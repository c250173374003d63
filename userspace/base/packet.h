// A packet in a frame with headroom, as it sits in an AF_XDP UMEM frame: the engine adds and
// strips ESP in place, moving only the start and the length of the IP packet.
#pragma once

#include <cstdint>

#include "userspace/base/counters.h"

namespace xesp {

// Headroom every frame keeps before the IP packet: enough for Ethernet + VLAN, an IPv6 outer
// header, UDP, ESP and the largest IV, with room to spare (AF_XDP frames get XDP_PACKET_HEADROOM).
constexpr uint32_t kFrameHeadroom = 256;
constexpr uint32_t kFrameSize = 4096;

// Largest growth of a packet by ESP: IPv6 (40) + UDP (8) + ESP (8) + IV (16) in front,
// padding (15) + trailer (2) + ICV (32) behind.
constexpr uint32_t kMaxEspOverheadFront = 72;
constexpr uint32_t kMaxEspOverheadBack = 49;

enum class Verdict : uint8_t {
    Pass,          // not ours: leave it unchanged (the gateway hands it to the kernel)
    Encrypted,     // was plaintext, now ESP
    Decrypted,     // was ESP, now the inner (tunnel) or rebuilt (transport) packet
    Drop,          // see drop
    TooBig,        // would not fit the tunnel: now the ICMP error for its sender (RFC 1191/8201)
    TimeExceeded,  // TTL / hop limit ran out here: now the ICMP error for its sender
};

struct Pkt {
    uint8_t *frame = nullptr;  // start of the frame (headroom begins here)
    uint32_t frame_len = 0;    // bytes usable in the frame
    uint32_t l3 = 0;           // offset of the IP header in the frame
    uint32_t len = 0;          // bytes of the IP packet
    uint16_t l4 = 0;           // ESP packets: offset of the ESP header from the IP header
    uint16_t l2_len = 0;       // bytes of link-layer header (Ethernet, VLAN tags) right before
                               // l3; 0 once the engine has rewritten the packet
    Verdict verdict = Verdict::Pass;
    Drop drop = Drop::Count;

    uint8_t *ip() { return frame + l3; }
    const uint8_t *ip() const { return frame + l3; }
    void set_drop(Drop d)
    {
        verdict = Verdict::Drop;
        drop = d;
    }
};

}  // namespace xesp
