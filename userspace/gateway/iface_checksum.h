// Unfinished checksums on a protected interface. A sender that leaves TCP/UDP checksums to the
// device (CHECKSUM_PARTIAL: the checksum field holds only the pseudo-header sum) relies on
// someone finishing them later: the NIC, or the kernel before the packet leaves it. A veth
// carries such packets across as they are, and so does a tap whose writer sends a vnet header
// with VIRTIO_NET_HDR_F_NEEDS_CSUM; AF_XDP hands the bytes over with no word of their state,
// and the gateway encrypts them as they are: the far host drops every such TCP segment. Only
// the sender's side can fix it, so `iface add` looks at it and says what to do:
//   - veth: the peer's TX checksum offload (on by default) must be off: `ethtool -K PEER tx
//     off`, in the peer's network namespace. A peer in another namespace cannot be read from
//     here: the warning asks to check it.
//   - tap with a vnet header (IFF_VNET_HDR): the writer must not ask for checksum offload (for
//     qemu, `csum=off` on the virtio-net device).
#pragma once

#include <cstdint>
#include <string>

namespace xesp {

// A one-line warning with the fix, or "" when the interface cannot hand over unfinished
// checksums (or is of a kind this does not know).
std::string checksum_warning(const std::string &name, uint32_t ifindex);

}  // namespace xesp
