#include "af_xdp/xsk_port.h"

#include <net/if.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xdp/xsk.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

#ifndef SO_PREFER_BUSY_POLL
#define SO_PREFER_BUSY_POLL 69
#endif
#ifndef SO_BUSY_POLL_BUDGET
#define SO_BUSY_POLL_BUDGET 70
#endif
#ifndef XDP_MAX_TX_SKB_BUDGET
#define XDP_MAX_TX_SKB_BUDGET 9  // Linux 6.17
#endif

namespace xesp {

namespace {

// Addresses moved between a ring and the pool per step (a stack buffer, no allocation).
constexpr uint32_t kBatch = 64;
// Copy-mode kicks per tx_burst: each sends at most the kernel's TX budget (32 frames, or the
// TX ring where XDP_MAX_TX_SKB_BUDGET took).
constexpr int kMaxKicks = 16;
// Binds tried, 10 ms apart, while the queue is busy.
constexpr int kBusyRetries = 100;

bool power_of_two(uint32_t v)
{
    return v && (v & (v - 1)) == 0;
}

std::string where(const std::string &ifname, uint32_t queue)
{
    return "xsk " + ifname + " queue " + std::to_string(queue);
}

std::string bind_hint(int err)
{
    switch (err) {
    case EOPNOTSUPP:
        return "; the driver has no zero-copy AF_XDP: use copy or auto mode";
    case EBUSY:
        return "; another AF_XDP socket (or a zero-copy setup) already holds this queue";
    case EINVAL:
        return "; is the queue id below the device's queue count (ethtool -l)?";
    case ENODEV:
        return "; no such interface in this network namespace";
    case EPERM:
        return "; needs CAP_NET_RAW and CAP_NET_ADMIN";
    default:
        return "";
    }
}

// Binds a throwaway socket with XDP_ZEROCOPY. A refused bind must not touch the Umem: libxdp
// binds the UMEM's own fd for its first socket and cannot set it up a second time.
Result<void> probe_zero_copy(const std::string &ifname, uint32_t queue)
{
    constexpr uint32_t kFrames = 4;
    unsigned ifindex = if_nametoindex(ifname.c_str());
    if (!ifindex)
        return make_error(where(ifname, queue) + ": " + std::strerror(errno) + bind_hint(ENODEV),
                          errno);
    int fd = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return make_error(where(ifname, queue) + ": socket(AF_XDP): " + std::strerror(errno),
                          errno);
    size_t size = kFrames * kFrameSize;
    void *area = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int err = area == MAP_FAILED ? errno : 0;
    if (!err) {
        xdp_umem_reg reg{};
        reg.addr = uint64_t(uintptr_t(area));
        reg.len = size;
        reg.chunk_size = kFrameSize;
        uint32_t ring = kFrames;
        sockaddr_xdp sxdp{};
        sxdp.sxdp_family = AF_XDP;
        sxdp.sxdp_flags = XDP_ZEROCOPY;
        sxdp.sxdp_ifindex = ifindex;
        sxdp.sxdp_queue_id = queue;
        if (setsockopt(fd, SOL_XDP, XDP_UMEM_REG, &reg, sizeof reg) ||
            setsockopt(fd, SOL_XDP, XDP_UMEM_FILL_RING, &ring, sizeof ring) ||
            setsockopt(fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &ring, sizeof ring) ||
            setsockopt(fd, SOL_XDP, XDP_RX_RING, &ring, sizeof ring) ||
            bind(fd, reinterpret_cast<sockaddr *>(&sxdp), sizeof sxdp))
            err = errno;
    }
    close(fd);
    if (area != MAP_FAILED)
        munmap(area, size);
    if (err)
        return make_error(where(ifname, queue) + ": zero-copy bind failed: " + std::strerror(err) +
                              bind_hint(err),
                          err);
    return {};
}

}  // namespace

const char *xsk_mode_name(XskMode m)
{
    switch (m) {
    case XskMode::Auto:
        return "auto";
    case XskMode::Copy:
        return "copy";
    case XskMode::ZeroCopy:
        return "zero-copy";
    }
    return "?";
}

struct XskPort::State {
    // libxdp keeps pointers to the rings it set up: they live here, on the heap, so that an
    // XskPort can move.
    xsk_ring_cons rx{};
    xsk_ring_prod tx{};
    xsk_ring_prod fill{};
    xsk_ring_cons comp{};
    xsk_socket *xsk = nullptr;
    Umem *umem = nullptr;
    FramePool *pool = nullptr;
    uint8_t *area = nullptr;
    uint64_t area_size = 0;
    int fd = -1;
    uint32_t queue = 0;
    std::string ifname;
    XskMode mode = XskMode::Copy;
    bool busy_poll = false;
    uint32_t fill_target = 0;
    uint32_t fill_held = 0;
    uint32_t skip = 0;  // XskPortOptions::skip
    uint32_t tx_size = 0;
    uint32_t comp_size = 0;
    uint32_t tx_outstanding = 0;
    XskStats counters;

    State() = default;
    State(const State &) = delete;
    State &operator=(const State &) = delete;
    ~State()
    {
        if (!xsk)
            return;
        xsk_socket__delete(xsk);
        umem->count_socket(-1);
    }

    // Completion ring -> pool.
    size_t reap()
    {
        size_t total = 0;
        uint64_t addrs[kBatch];
        for (;;) {
            uint32_t idx = 0;
            uint32_t n = xsk_ring_cons__peek(&comp, kBatch, &idx);
            if (!n)
                break;
            for (uint32_t i = 0; i < n; ++i)
                addrs[i] = *xsk_ring_cons__comp_addr(&comp, idx + i);
            xsk_ring_cons__release(&comp, n);
            pool->free(addrs, n);
            tx_outstanding -= std::min(tx_outstanding, n);
            total += n;
            if (n < kBatch)
                break;
        }
        return total;
    }

    bool tx_ring_empty() { return xsk_prod_nb_free(&tx, tx_size) == tx_size; }

    // A frame of this Umem (aligned: frame points at a chunk's start).
    bool ours(const Pkt &p) const
    {
        return p.frame >= area && p.frame < area + area_size &&
               uint64_t(p.frame - area) % kFrameSize == 0;
    }
    // What tx_burst sends: the link-layer header in front of l3, then the IP packet.
    static bool fits(const Pkt &p)
    {
        uint64_t start = uint64_t(p.l3) - p.l2_len, len = uint64_t(p.l2_len) + p.len;
        return p.l2_len <= p.l3 && len >= 14 && p.l3 <= kFrameSize && len <= kFrameSize - start;
    }
};

namespace {

Result<void> check_options(const Umem &umem, const XskPortOptions &o, const std::string &at)
{
    if (!power_of_two(o.rx_size) || !power_of_two(o.tx_size))
        return make_error(at + ": rx_size and tx_size must be powers of two");
    if (o.fill_target > umem.fill_size())
        return make_error(at + ": fill_target " + std::to_string(o.fill_target) +
                          " is larger than the fill ring (" + std::to_string(umem.fill_size()) +
                          ")");
    if (umem.spent())
        return make_error(at + ": the Umem's sockets were all closed; make a new Umem");
    if (o.skip > kFrameHeadroom)
        return make_error(at + ": skip " + std::to_string(o.skip) + " is larger than a frame's " +
                          std::to_string(kFrameHeadroom) + " bytes of headroom");
    return {};
}

// The mode the kernel bound, which Auto leaves to it.
Result<XskMode> bound_mode(int fd, const std::string &at)
{
    xdp_options xo{};
    socklen_t len = sizeof xo;
    if (getsockopt(fd, SOL_XDP, XDP_OPTIONS, &xo, &len))
        return make_error(at + ": getsockopt(XDP_OPTIONS): " + std::strerror(errno), errno);
    return (xo.flags & XDP_OPTIONS_ZEROCOPY) ? XskMode::ZeroCopy : XskMode::Copy;
}

Result<void> set_busy_poll(int fd, const XskPortOptions &o, const std::string &at)
{
    int one = 1;
    int usecs = int(o.busy_poll_usecs);
    int budget = int(o.busy_poll_budget);
    if (setsockopt(fd, SOL_SOCKET, SO_PREFER_BUSY_POLL, &one, sizeof one) ||
        setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &usecs, sizeof usecs) ||
        setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL_BUDGET, &budget, sizeof budget))
        return make_error(at + ": busy polling: " + std::strerror(errno) +
                              " (needs Linux 5.11 and CAP_NET_ADMIN for the budget)",
                          errno);
    return {};
}

}  // namespace

// Creates and binds the socket into s->xsk with its four rings in s.
Result<void> XskPort::create_socket(State &s, Umem &umem, const std::string &ifname,
                                    const XskPortOptions &o, const std::string &at)
{
    xsk_socket_config cfg{};
    cfg.rx_size = o.rx_size;
    cfg.tx_size = o.tx_size;
    cfg.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;
    cfg.bind_flags = XDP_USE_NEED_WAKEUP;
    if (o.mode == XskMode::Copy)
        cfg.bind_flags |= XDP_COPY;
    else if (o.mode == XskMode::ZeroCopy)
        cfg.bind_flags |= XDP_ZEROCOPY;
    // The first socket takes over the rings made with the UMEM; libxdp must see its own ring
    // structs then, or a failed bind unmaps them under the Umem.
    bool first = umem.sockets() == 0;
    xsk_ring_prod *fill = first ? umem.initial_fill() : &s.fill;
    xsk_ring_cons *comp = first ? umem.initial_comp() : &s.comp;
    // The kernel frees a closed socket's hold on its queue in deferred work: EBUSY right after
    // a close (a restart) is transient.
    int err = 0;
    for (int tries = 0; tries < kBusyRetries; ++tries) {
        err = xsk_socket__create_shared(&s.xsk, ifname.c_str(), o.queue, umem.handle(), &s.rx,
                                        &s.tx, fill, comp, &cfg);
        if (err != -EBUSY)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (err) {
        s.xsk = nullptr;
        return make_error(at + ": " + std::strerror(-err) + bind_hint(-err), -err);
    }
    umem.count_socket(+1);
    if (first) {
        s.fill = *fill;
        s.comp = *comp;
    } else if (!s.fill.ring) {
        // libxdp found the (device, queue) already set up and shares its fill ring: two
        // ports would each think they own it.
        return make_error(at + ": this Umem already has a socket on the queue; one port each");
    }
    return {};
}

Result<XskPort> XskPort::open(Umem &umem, FramePool &pool, const std::string &ifname,
                              const XskPortOptions &o)
{
    const std::string at = where(ifname, o.queue);
    if (auto r = check_options(umem, o, at); !r)
        return r.error();
    if (o.mode == XskMode::ZeroCopy && umem.sockets() == 0) {
        if (auto r = probe_zero_copy(ifname, o.queue); !r)
            return r.error();
    }
    auto s = std::make_unique<State>();
    s->umem = &umem;
    if (auto r = create_socket(*s, umem, ifname, o, at); !r)
        return r.error();
    s->pool = &pool;
    s->area = umem.area();
    s->area_size = umem.size();
    s->fd = xsk_socket__fd(s->xsk);
    s->queue = o.queue;
    s->ifname = ifname;
    s->fill_target = o.fill_target ? o.fill_target : umem.fill_size();
    s->skip = o.skip;
    s->tx_size = o.tx_size;
    s->comp_size = umem.comp_size();

    auto mode = bound_mode(s->fd, at);
    if (!mode)
        return mode.error();
    s->mode = *mode;
    if (o.mode != XskMode::Auto && o.mode != s->mode)
        return make_error(at + ": asked for " + xsk_mode_name(o.mode) + " but the Umem is in " +
                          xsk_mode_name(s->mode) + " mode, set by its first socket");
    if (s->mode == XskMode::Copy) {
        // Copy mode sends 32 frames per sendto() unless told more (Linux 6.17): as many as
        // the TX ring holds, so that a burst goes in one call. Older kernels say ENOPROTOOPT,
        // a ring under 32 gets EACCES; both keep 32.
        unsigned budget = o.tx_size;
        (void)setsockopt(s->fd, SOL_XDP, XDP_MAX_TX_SKB_BUDGET, &budget, sizeof budget);
    }
    if (o.busy_poll) {
        if (auto r = set_busy_poll(s->fd, o, at); !r)
            return r.error();
        s->busy_poll = true;
    }
    XskPort port(std::move(s));
    port.refill();
    return port;
}

XskPort::XskPort(std::unique_ptr<State> s) : s_(std::move(s))
{}
XskPort::~XskPort() = default;
XskPort::XskPort(XskPort &&) noexcept = default;
XskPort &XskPort::operator=(XskPort &&) noexcept = default;

int XskPort::fd() const
{
    return s_->fd;
}
uint32_t XskPort::queue() const
{
    return s_->queue;
}
const std::string &XskPort::ifname() const
{
    return s_->ifname;
}
XskMode XskPort::mode() const
{
    return s_->mode;
}
uint32_t XskPort::tx_outstanding() const
{
    return s_->tx_outstanding;
}
uint32_t XskPort::fill_held() const
{
    return s_->fill_held;
}

Result<void> XskPort::attach(int xskmap_fd)
{
    int err = xsk_socket__update_xskmap(s_->xsk, xskmap_fd);
    if (err)
        return make_error(where(s_->ifname, s_->queue) +
                              ": XSKMAP update failed: " + std::strerror(-err) +
                              "; is the map a BPF_MAP_TYPE_XSKMAP with more than " +
                              std::to_string(s_->queue) + " entries?",
                          -err);
    return {};
}

// Keeps fill_target frames with the kernel. The kernel moves frames from the fill ring to
// its own free list as it needs them, so what we gave it (fill_held), not the ring's
// occupancy, is what we top up.
void XskPort::refill()
{
    State &s = *s_;
    if (s.fill_held >= s.fill_target)
        return;
    uint32_t want = s.fill_target - s.fill_held;
    want = std::min(want, xsk_prod_nb_free(&s.fill, want));
    uint64_t addrs[kBatch];
    while (want) {
        uint32_t n = s.pool->alloc(addrs, std::min(want, kBatch));
        if (!n) {
            ++s.counters.fill_short;
            break;
        }
        uint32_t idx = 0;
        xsk_ring_prod__reserve(&s.fill, n, &idx);  // room checked above
        for (uint32_t i = 0; i < n; ++i)
            *xsk_ring_prod__fill_addr(&s.fill, idx + i) = addrs[i];
        xsk_ring_prod__submit(&s.fill, n);
        s.fill_held += n;
        want -= n;
    }
}

size_t XskPort::rx_burst(Pkt *pkts, size_t max)
{
    State &s = *s_;
    refill();
    uint32_t idx = 0;
    uint32_t n = xsk_ring_cons__peek(&s.rx, uint32_t(std::min<size_t>(max, UINT32_MAX)), &idx);
    if (!n) {
        // Zero-copy drivers stop when the fill ring runs dry and ask to be woken; busy polling
        // runs the driver from here.
        if (s.busy_poll || xsk_ring_prod__needs_wakeup(&s.fill))
            recvfrom(s.fd, nullptr, 0, MSG_DONTWAIT, nullptr, nullptr);
        return 0;
    }
    for (uint32_t i = 0; i < n; ++i) {
        const xdp_desc *d = xsk_ring_cons__rx_desc(&s.rx, idx + i);
        uint64_t base = Umem::frame_base(d->addr);
        uint32_t skip = std::min(s.skip, d->len);
        pkts[i] = Pkt{s.area + base, kFrameSize, uint32_t(d->addr - base) + skip, d->len - skip};
    }
    xsk_ring_cons__release(&s.rx, n);
    s.fill_held -= n;
    s.counters.rx += n;
    return n;
}

void XskPort::kick_tx()
{
    State &s = *s_;
    if (s.mode == XskMode::ZeroCopy) {
        // The driver sends on its own once woken.
        if (xsk_ring_prod__needs_wakeup(&s.tx) &&
            sendto(s.fd, nullptr, 0, MSG_DONTWAIT, nullptr, 0) < 0 && errno != EAGAIN &&
            errno != EBUSY && errno != ENOBUFS)
            ++s.counters.tx_kick_errors;
        return;
    }
    // Copy mode sends in the sendto() itself, a batch at a time, and says EAGAIN while more
    // wait or while the completion ring is full.
    for (int i = 0; i < kMaxKicks && !s.tx_ring_empty(); ++i) {
        if (!xsk_ring_prod__needs_wakeup(&s.tx))
            return;
        if (sendto(s.fd, nullptr, 0, MSG_DONTWAIT, nullptr, 0) < 0) {
            if (errno != EAGAIN && errno != EBUSY && errno != ENOBUFS) {
                ++s.counters.tx_kick_errors;
                return;
            }
            s.reap();
        }
    }
}

size_t XskPort::tx_burst(Pkt *pkts, size_t n)
{
    State &s = *s_;
    s.reap();
    // Never more in flight than the completion ring can report back.
    uint32_t room =
        std::min<uint32_t>(xsk_prod_nb_free(&s.tx, s.tx_size), s.comp_size - s.tx_outstanding);
    size_t taken = 0;
    uint32_t good = 0;
    for (; taken < n && good < room; ++taken)
        good += s.ours(pkts[taken]) && s.fits(pkts[taken]);
    uint32_t idx = 0;
    if (good)
        xsk_ring_prod__reserve(&s.tx, good, &idx);  // fits: good <= room
    uint32_t placed = 0;
    for (size_t i = 0; i < taken; ++i) {
        const Pkt &p = pkts[i];
        if (!s.ours(p)) {
            ++s.counters.foreign;
            continue;
        }
        if (!s.fits(p)) {
            ++s.counters.tx_bad;
            recycle(p);
            continue;
        }
        xdp_desc *d = xsk_ring_prod__tx_desc(&s.tx, idx + placed++);
        d->addr = uint64_t(p.frame - s.area) + p.l3 - p.l2_len;
        d->len = p.l2_len + p.len;
        d->options = 0;
    }
    if (good) {
        xsk_ring_prod__submit(&s.tx, good);
        s.tx_outstanding += good;
        s.counters.tx += good;
        kick_tx();
        s.reap();
    }
    s.counters.tx_ring_full += n - taken;
    return taken;
}

void XskPort::recycle(const Pkt &p)
{
    recycle(&p, 1);
}

void XskPort::recycle(const Pkt *pkts, size_t n)
{
    State &s = *s_;
    uint64_t addrs[kBatch];
    while (n) {
        uint32_t k = 0;
        for (; n && k < kBatch; ++pkts, --n) {
            if (s.ours(*pkts))
                addrs[k++] = uint64_t(pkts->frame - s.area);
            else
                ++s.counters.foreign;
        }
        s.pool->free(addrs, k);
    }
}

size_t XskPort::complete()
{
    size_t n = s_->reap();
    if (s_->tx_outstanding && !s_->tx_ring_empty()) {
        kick_tx();
        n += s_->reap();
    }
    return n;
}

Result<XskStats> XskPort::stats() const
{
    XskStats st = s_->counters;
    xdp_statistics k{};
    socklen_t len = sizeof k;  // older kernels fill only the first three fields
    if (getsockopt(s_->fd, SOL_XDP, XDP_STATISTICS, &k, &len))
        return make_error(where(s_->ifname, s_->queue) +
                              ": getsockopt(XDP_STATISTICS): " + std::strerror(errno),
                          errno);
    st.rx_dropped = k.rx_dropped;
    st.rx_invalid_descs = k.rx_invalid_descs;
    st.tx_invalid_descs = k.tx_invalid_descs;
    st.rx_ring_full = k.rx_ring_full;
    st.rx_fill_ring_empty = k.rx_fill_ring_empty_descs;
    st.tx_ring_empty = k.tx_ring_empty_descs;
    return st;
}

}  // namespace xesp
