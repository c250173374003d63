// ESP that the kernel reassembled. The classifier hands IP fragments to the kernel (it cannot
// see the SPI of a later fragment, and reassembly is the kernel's trade); the kernel has no
// ESP of its own here, so the reassembled packet would die there. Raw sockets catch it and
// the gateway decrypts it like any other, after one copy into a frame: the slow path, for
// fragments only (whole ESP packets never reach the kernel).
//
// Per family, one raw ESP socket, and one raw UDP socket with a filter that keeps ESP in
// UDP/4500 only (a non-zero first word, RFC 3948 2.2): port 4500 belongs to the IKE daemon,
// and a raw socket gets its copy of each datagram without taking the port. IPv4 raw sockets
// deliver the IP header with the packet; IPv6 ones deliver the payload only, so the header is
// rebuilt from the addresses, hop limit and traffic class in the control messages. Raw
// sockets see every such packet the kernel receives, ours or not: the engine counts the
// others as unknown SPIs.
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

    const int *fds() const { return fds_; }     // kSockets of them, for poll()
    static constexpr int kSockets = 4;

private:
    enum { Esp4, Esp6, Udp4, Udp6 };
    bool receive4(int fd, Pkt &p);
    bool receive6(int fd, uint8_t next_header, Pkt &p);
    int fds_[kSockets] = {-1, -1, -1, -1};
    int next_ = 0;                  // take the sockets in turn so that none starves
};

} // namespace xesp
