// ESP that the kernel reassembled. The classifier hands IP fragments to the kernel (it cannot
// see the SPI of a later fragment, and reassembly is the kernel's trade); the kernel has no
// ESP of its own here, so the reassembled packet would die there. A raw ESP socket per family
// catches it and the gateway decrypts it like any other, after one copy into a frame: the slow
// path, for fragments only (whole ESP packets never reach the kernel).
//
// IPv4 raw sockets deliver the IP header with the packet; IPv6 ones deliver the payload only,
// so the header is rebuilt from the addresses, hop limit and traffic class in the control
// messages. ESP in UDP/4500 that arrives fragmented is not caught: port 4500 belongs to the
// IKE daemon. Raw sockets see every ESP packet the kernel receives, ours or not: the engine
// counts the others as unknown SPIs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "userspace/packet.h"
#include "userspace/result.h"

namespace xesp {

class KernelEspInput {
public:
    KernelEspInput() = default;
    ~KernelEspInput();
    KernelEspInput(const KernelEspInput &) = delete;
    KernelEspInput &operator=(const KernelEspInput &) = delete;

    // Opens the raw sockets (non-blocking). Without CAP_NET_RAW this fails.
    Result<void> open();

    // Reads one packet into p (p.frame, p.frame_len set by the caller), the IP header at
    // kFrameHeadroom. Returns false when nothing is waiting.
    bool receive(Pkt &p);

    int fd4() const { return fd4_; }
    int fd6() const { return fd6_; }

private:
    bool receive4(Pkt &p);
    bool receive6(Pkt &p);
    int fd4_ = -1, fd6_ = -1;
    bool next6_ = false;            // alternate the families so neither starves
};

} // namespace xesp
