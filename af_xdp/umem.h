// The UMEM every AF_XDP socket of a worker shares, and the pool its frames are handed out from.
//
// Frame layout. The UMEM is cut into kFrameSize chunks (aligned mode). The kernel writes a
// received frame XDP_PACKET_HEADROOM + frame_headroom bytes into its chunk; we choose
// frame_headroom so that the link-layer header starts at kFrameHeadroom, which leaves the ESP
// engine all of kFrameHeadroom in front of the packet to grow into, in place. Metadata from
// bpf_xdp_adjust_meta sits right before the packet, in that headroom (see meta() in
// xsk_port.h): read it before the packet grows over it. Where the XDP program puts its
// metadata at the frame's start instead (XskPortOptions::skip), copy mode writes metadata
// and frame from kFrameHeadroom on, so the link-layer header starts `skip` bytes later and the
// room to grow at the end is as much smaller; zero-copy leaves the frame where it was and the
// metadata in the headroom, as above.
//
//   chunk base                          base + kFrameHeadroom               base + kFrameSize
//   | ...headroom... | meta (<= 32 B) | Ethernet | IP ...              |  room to grow  |
//
// Frames and threads. A frame is named by its offset in the UMEM (its "address"). All free
// frames of a thread live in that thread's FramePool, a plain stack: alloc and free move bursts
// of addresses with no lock and no atomic. This is enough because a frame never changes
// thread: a thread's sockets (its RX queue on each interface) share the UMEM, a frame received
// on one is sent from another socket of the same thread, and comes back through that socket's
// completion ring into the same pool. Threads get their share with FramePool::split() at
// start-up. (bpf-examples' AF_XDP-forwarding/xsk_fwd.c keeps a locked global pool with
// per-thread slabs instead; we do not need frames to migrate.)
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "userspace/base/packet.h"
#include "userspace/base/result.h"

struct xsk_umem;
struct xsk_ring_prod;
struct xsk_ring_cons;

namespace xesp {

struct UmemOptions {
    uint32_t frame_count = 8192;  // 32 MiB of kFrameSize frames
    uint32_t fill_size = 2048;    // fill ring of each (device, queue): a power of two
    uint32_t comp_size = 2048;    // completion ring of each (device, queue): a power of two
};

// libxdp binds the UMEM's own socket as the first XskPort opened on it, so that port's
// (interface, queue) stays taken until the Umem itself is destroyed, and once every port is
// closed the Umem cannot take new ones (spent()): ports and their Umem live and die together.
class Umem {
public:
    static Result<Umem> create(const UmemOptions &options = {});

    // Every XskPort on this Umem must be closed first: the kernel holds the memory until then.
    ~Umem();
    Umem(Umem &&) noexcept;
    Umem &operator=(Umem &&) noexcept;

    uint8_t *area() const;
    uint64_t size() const;
    uint32_t frame_count() const;
    uint32_t fill_size() const;
    uint32_t comp_size() const;

    uint8_t *frame(uint64_t addr) const { return area() + addr; }
    static uint64_t frame_base(uint64_t addr) { return addr & ~uint64_t(kFrameSize - 1); }

    // For XskPort: libxdp's handle, the rings made with the UMEM (its first socket takes them
    // over: libxdp binds that socket on the UMEM's own fd) and how many sockets are bound.
    xsk_umem *handle() const;
    xsk_ring_prod *initial_fill() const;
    xsk_ring_cons *initial_comp() const;
    uint32_t sockets() const;
    void count_socket(int delta);
    // Its first socket has come and gone: libxdp cannot bind the UMEM's fd again.
    bool spent() const;

private:
    struct State;
    explicit Umem(std::unique_ptr<State> s);
    std::unique_ptr<State> s_;
};

// Free frames, by address, owned by one thread. See the top of this file.
class FramePool {
public:
    // Every frame of `umem`.
    explicit FramePool(const Umem &umem);
    // An empty pool that can hold all `capacity` frames of its Umem.
    explicit FramePool(uint32_t capacity);

    FramePool(FramePool &&) = default;
    FramePool &operator=(FramePool &&) = default;
    FramePool(const FramePool &) = delete;  // a copy would hand frames out twice
    FramePool &operator=(const FramePool &) = delete;

    // Moves up to `n` frames into a new pool with the same capacity, e.g. for another thread.
    FramePool split(uint32_t n);

    // Pops up to `n` addresses into `addrs`; returns how many.
    uint32_t alloc(uint64_t *addrs, uint32_t n)
    {
        if (n > top_)
            n = top_;
        top_ -= n;
        for (uint32_t i = 0; i < n; ++i)
            addrs[i] = stack_[top_ + i];
        return n;
    }

    // Pops exactly `n` addresses into `addrs`, or none: false (nothing taken) if fewer are
    // free. For what needs all of them (a packet's fragments or pieces).
    bool alloc_all(uint64_t *addrs, uint32_t n)
    {
        if (n > top_)
            return false;
        alloc(addrs, n);
        return true;
    }

    // Takes back `n` frames (any address inside a frame names the frame).
    void free(const uint64_t *addrs, uint32_t n)
    {
        if (n > capacity() - top_) {  // a frame freed twice: keep the pool consistent
            overflows_ += n - (capacity() - top_);
            n = capacity() - top_;
        }
        for (uint32_t i = 0; i < n; ++i)
            stack_[top_ + i] = Umem::frame_base(addrs[i]);
        top_ += n;
    }

    uint32_t count() const { return top_; }
    uint32_t capacity() const { return uint32_t(stack_.size()); }
    // Frames given back beyond capacity (double frees); they were not taken.
    uint64_t overflows() const { return overflows_; }

private:
    std::vector<uint64_t> stack_;
    uint32_t top_ = 0;
    uint64_t overflows_ = 0;
};

}  // namespace xesp
