// One AF_XDP socket bound to one (interface, queue), on a Umem shared with the thread's other
// sockets, moving bursts of Pkt in and out.
//
// Steering is the caller's: the socket is made with libxdp's program load inhibited, and the
// caller's own XDP program redirects with bpf_redirect_map(&xsks, ctx->rx_queue_index, fallback)
// once attach() has put this socket at key `queue` of that XSKMAP. Closing the socket empties
// the slot, and the program's fallback then decides what happens to the queue's traffic.
//
// What a Pkt covers here. rx_burst hands out the frame as it came off the wire: `l3` is where
// the link-layer header starts, `len` the whole frame, l2_len 0 (classified_from_meta then moves
// l3 to the IP header and sets l2_len). tx_burst sends [l3 - l2_len, l3 + len) of each frame:
// the caller writes the link-layer header right in front of the IP packet and sets l2_len (a
// packet that grew into the headroom is sent from its new start).
//
// Copy mode (veth, and drivers without AF_XDP support) sends only when kicked, at most the
// kernel's TX budget per sendto() (32 frames; the TX ring on Linux 6.17 and later, which takes
// XDP_MAX_TX_SKB_BUDGET): tx_burst and complete() kick while descriptors wait.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "af_xdp/umem.h"
#include "userspace/base/packet.h"
#include "userspace/base/result.h"

namespace xesp {

enum class XskMode : uint8_t {
    Auto,  // zero-copy where the driver offers it, else copy (the kernel decides at bind)
    Copy,
    ZeroCopy,  // fails with EOPNOTSUPP where the driver cannot, leaving the Umem usable
};

const char *xsk_mode_name(XskMode m);

struct XskPortOptions {
    uint32_t queue = 0;
    // The first socket on a Umem decides copy or zero-copy; later ones inherit it (the kernel
    // shares one mode per UMEM), and asking them for the other mode is an error.
    XskMode mode = XskMode::Auto;
    uint32_t rx_size = 2048;   // a power of two
    uint32_t tx_size = 2048;   // a power of two
    uint32_t fill_target = 0;  // frames kept in the fill ring; 0: the Umem's fill_size
    // Busy polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL, SO_BUSY_POLL_BUDGET): the caller's
    // rx_burst drives the driver instead of interrupts. Needs the device's
    // napi_defer_hard_irqs / gro_flush_timeout set to pay off.
    bool busy_poll = false;
    uint32_t busy_poll_usecs = 20;
    uint32_t busy_poll_budget = 64;
    // Bytes an XDP program put at the start of each frame (its metadata, where the kernel
    // has no bpf_xdp_adjust_meta): rx_burst hands out the rest, so that they sit in front
    // of the packet as meta() expects them. At most kFrameHeadroom.
    uint32_t skip = 0;
};

struct XskStats {
    uint64_t rx = 0;            // frames handed out by rx_burst
    uint64_t tx = 0;            // frames placed on the TX ring by tx_burst
    uint64_t tx_ring_full = 0;  // packets tx_burst left to the caller: no room on the ring
    uint64_t tx_bad = 0;   // packets tx_burst refused (too short or past their frame), recycled
    uint64_t foreign = 0;  // frames of another Umem given to tx_burst or recycle: left alone
    uint64_t tx_kick_errors = 0;  // sendto() kicks that failed other than "try again"
    uint64_t fill_short = 0;      // refills that wanted frames the pool did not have
    // From the kernel (getsockopt XDP_STATISTICS).
    uint64_t rx_dropped = 0;  // dropped for other reasons, e.g. no fill frame
    uint64_t rx_invalid_descs = 0;
    uint64_t tx_invalid_descs = 0;
    uint64_t rx_ring_full = 0;        // dropped: the RX ring was full
    uint64_t rx_fill_ring_empty = 0;  // times the kernel found the fill ring empty
    uint64_t tx_ring_empty = 0;       // times the kernel found the TX ring empty
};

// One port per (interface, queue) on a Umem.
class XskPort {
public:
    // `umem` and `pool` must outlive the port and stay where they are. The fill ring is topped
    // up from `pool` before open() returns.
    static Result<XskPort> open(Umem &umem, FramePool &pool, const std::string &ifname,
                                const XskPortOptions &options = {});

    ~XskPort();
    XskPort(XskPort &&) noexcept;
    XskPort &operator=(XskPort &&) noexcept;

    int fd() const;  // for xsk_socket__update_xskmap and poll()
    uint32_t queue() const;
    const std::string &ifname() const;
    XskMode mode() const;  // Copy or ZeroCopy, as the kernel bound it

    // xskmap[queue] = this socket.
    Result<void> attach(int xskmap_fd);

    // Up to `max` received frames. Tops up the fill ring from the pool first.
    size_t rx_burst(Pkt *pkts, size_t max);
    // Places a prefix of `pkts` on the TX ring and returns its length; the caller keeps the rest
    // (the ring was full). Packets in the prefix now belong to the port: sent ones return to the
    // pool through the completion ring, refused ones (XskStats::tx_bad) at once. Every frame
    // must be of this port's Umem.
    size_t tx_burst(Pkt *pkts, size_t n);
    // Dropped packets' frames back to the pool.
    void recycle(const Pkt &p);
    void recycle(const Pkt *pkts, size_t n);
    // Reaps the completion ring into the pool and kicks TX if frames still wait; returns how
    // many frames came back. tx_burst does this too; call it when idle.
    size_t complete();

    uint32_t tx_outstanding() const;  // sent frames not yet back from the completion ring
    uint32_t fill_held() const;       // frames given to the kernel through the fill ring

    Result<XskStats> stats() const;

private:
    struct State;
    explicit XskPort(std::unique_ptr<State> s);
    static Result<void> create_socket(State &s, Umem &umem, const std::string &ifname,
                                      const XskPortOptions &o, const std::string &at);
    void refill();
    void kick_tx();
    std::unique_ptr<State> s_;
};

// The `len` bytes an XDP program put in front of the frame with bpf_xdp_adjust_meta, or at its
// start where rx_burst skipped them (XskPortOptions::skip), for a Pkt as rx_burst handed it
// out (before l3 moves). nullptr if they cannot fit there. The RX descriptor does not say
// whether metadata was written: check a magic value, and clear it.
inline const void *meta(const Pkt &p, size_t len)
{
    uint32_t start = p.l3 - p.l2_len;  // where the frame's link-layer header starts
    return p.l2_len <= p.l3 && len <= start ? p.frame + start - len : nullptr;
}
inline void *meta(Pkt &p, size_t len)
{
    uint32_t start = p.l3 - p.l2_len;
    return p.l2_len <= p.l3 && len <= start ? p.frame + start - len : nullptr;
}

}  // namespace xesp
