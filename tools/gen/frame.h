// What xesp-gen sends: Ethernet / IPv4 / UDP frames of a fixed size to the next hop's MAC, one
// template per flow, and how the endpoints are found (addresses, MACs, next hop). Each datagram
// is as a host's unconnected UDP socket sends it: DF set, id 0, the UDP checksum done (what
// joins in GRO where a forwarder's kernel, or a TUN device's reader, joins datagrams).
//
// Size. --size is the Ethernet frame length with its 4-byte FCS, as in RFC 2544: 64 is the
// smallest frame (60 bytes handed to the device, a 46-byte IP packet), 1400 hands 1396 bytes to
// the device and carries a 1382-byte IP packet. Bit rates count the same bytes (FCS included,
// no preamble or inter-frame gap).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "userspace/base/result.h"

namespace xesp::gen {

constexpr uint32_t kFcsBytes = 4;
constexpr uint32_t kEthBytes = 14;
constexpr uint32_t kMinFrame = 64;    // with FCS
constexpr uint32_t kMaxFrame = 1518;  // with FCS: a 1500-byte IP packet

// IP packet length carried by a frame of `size` bytes (FCS included).
constexpr uint32_t ip_len_of(uint32_t size)
{
    return size - kFcsBytes - kEthBytes;
}

struct Endpoints {
    std::string dev;
    unsigned ifindex = 0;
    uint32_t src = 0;  // network byte order
    uint32_t dst = 0;  // network byte order
    uint8_t src_mac[6] = {};
    uint8_t dst_mac[6] = {};  // the next hop's
};

// Fills in the interface's index and MAC and the next hop's MAC: the route to `dst` through
// `dev` (/proc/net/route) names the next hop, whose MAC comes from the neighbour table
// (/proc/net/arp). An unresolved next hop is resolved by sending it one UDP datagram.
// `dst_mac` ("aa:bb:...") skips the lookup.
Result<Endpoints> resolve_endpoints(const std::string &dev, const std::string &src,
                                    const std::string &dst,
                                    const std::optional<std::string> &dst_mac);

// The frame of flow `flow` (source port GEN_SRC_PORT_BASE + flow), without FCS: size - 4 bytes.
std::vector<uint8_t> build_frame(const Endpoints &ep, uint32_t size, uint32_t flow);

std::string mac_string(const uint8_t mac[6]);

}  // namespace xesp::gen
