// The gateway's local link: how plaintext the gateway's own kernel sends for a protected flow
// (a ping from the gateway's inside address to the other site, a routing daemon, syslog) gets
// encrypted like forwarded traffic instead of dropped.
//
//   kernel: socket -> route -> public interface -> tc egress (protected flow?)
//             -> bpf_redirect -> xesp-local ==veth== xesp-local-gw -> XDP (a protected
//             interface of the gateway) -> AF_XDP -> encrypted -> out of the public interface
//
// It also carries the UDP that protected interfaces in tun mode take in (xesp_tc.bpf.c,
// gateway_tun.cpp): from their tc ingress program to the XDP program, its hop already taken.
//
// A veth pair in the gateway's network namespace. The kernel's end has TX checksum offload
// off, so what reaches the XDP program carries finished checksums. Both ends have the same
// MTU (kMtu: the tc program checks what it sends against the kernel's end, the veth drops at
// the gateway's) and no IPv6 (they send nothing of their own). What the veth drops (a full
// ring, a frame too big) is counted: tx_dropped(). If the gateway dies the far end keeps its
// XDP program with no socket: the traffic is dropped, never sent in the clear.
#pragma once

#include <cstdint>
#include <string>

#include "userspace/base/result.h"

namespace xesp {

class LocalLink {
public:
    static constexpr const char *kKernelEnd = "xesp-local";
    static constexpr const char *kGatewayEnd = "xesp-local-gw";
    static constexpr uint32_t kMtu = 1500;

    // Makes the pair (replacing one a crashed gateway left) and sets both ends up.
    static Result<LocalLink> create();
    // Deletes the devices of this namespace with the ends' names, and so their pairs: what a
    // crashed gateway left, or what is left here of a pair that went from under the gateway.
    static void remove_leftovers();

    LocalLink() = default;
    LocalLink(LocalLink &&o) noexcept { *this = std::move(o); }
    LocalLink &operator=(LocalLink &&o) noexcept;
    LocalLink(const LocalLink &) = delete;
    LocalLink &operator=(const LocalLink &) = delete;
    ~LocalLink();  // deletes the pair

    explicit operator bool() const { return kernel_ifindex_ != 0; }
    // Lets go of the pair without deleting it: its index may be another device's now.
    void release()
    {
        kernel_ifindex_ = 0;
        dropped_seen_ = 0;
    }
    uint32_t kernel_ifindex() const { return kernel_ifindex_; }
    // What the kernel's end could not hand to the other (its tx_dropped); 0 with no pair. Once
    // the end is gone, or renamed, what it had when last read: each read keeps it.
    uint64_t tx_dropped() const;

private:
    uint32_t kernel_ifindex_ = 0;
    mutable uint64_t dropped_seen_ = 0;
};

// Changes to a device of the gateway's (the local link's ends, the TUN device of tun mode),
// each 0 or a -errno: set it up; no multicast of its own; and bound the segments of one GSO
// packet the kernel hands it (gso_max_segs): bigger ones the kernel cuts first.
int link_set_up(const char *name);
int link_clear_multicast(const char *name);
int link_set_gso_max_segs(const char *name, uint32_t segs);
// What the kernel dropped on its way out of such a device (its tx_dropped: a full queue,
// a frame its far end would not take); 0 if it cannot be read.
uint64_t link_tx_dropped(const char *name);

}  // namespace xesp
