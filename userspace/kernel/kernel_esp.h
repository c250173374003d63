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
#include <utility>

#include "userspace/base/packet.h"
#include "userspace/base/result.h"

namespace xesp {

class KernelEspInput {
public:
    enum { Esp4, Esp6, Udp4, Udp6, kSockets };  // the sockets, in fds() order

    KernelEspInput() = default;
    // Takes over sockets that are already open (tests); -1 for none.
    explicit KernelEspInput(const int (&fds)[kSockets]);
    ~KernelEspInput();
    KernelEspInput(const KernelEspInput &) = delete;
    KernelEspInput &operator=(const KernelEspInput &) = delete;

    // Opens the raw sockets (non-blocking). Without CAP_NET_RAW this fails.
    Result<void> open();

    // Reads one packet into p (p.frame, p.frame_len set by the caller), the IP header at
    // kFrameHeadroom. Returns false when nothing is waiting. A datagram too long for the
    // frame is dropped, never handed on cut short, and counted until take_too_big().
    bool receive(Pkt &p);
    uint64_t take_too_big() { return std::exchange(too_big_, 0); }

    const int *fds() const { return fds_; }  // kSockets of them, for poll()

private:
    enum class Read { Got, Empty, TooBig };
    Read receive4(int fd, Pkt &p);
    Read receive6(int fd, uint8_t next_header, Pkt &p);
    int fds_[kSockets] = {-1, -1, -1, -1};
    int next_ = 0;  // take the sockets in turn so that none starves
    uint64_t too_big_ = 0;
};

}  // namespace xesp
