#include "tools/gen/tx.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "af_xdp/umem.h"
#include "af_xdp/xsk_port.h"
#include "userspace/base/clock.h"

namespace xesp::gen {

namespace {

constexpr uint32_t kBurst = 64;

double since(Clock::time_point t0)
{
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Holds a sender to a rate by sleeping until a burst is due, so that a paced sender leaves the
// CPU it does not need to the path under test (a spinning one would take it all).
class Pacer {
public:
    Pacer(double rate, Clock::time_point t0) : rate_(rate), t0_(t0) {}

    // How many frames may go now, at most `max`, `sent` having gone since t0.
    uint32_t allow(uint64_t sent, uint32_t max) const
    {
        if (rate_ <= 0)
            return max;
        for (;;) {
            double due = rate_ * since(t0_) - double(sent);
            if (due >= max)
                return max;
            if (due >= 1 && due >= max / 2)
                return uint32_t(due);
            // Sleep until a full burst is due; short naps keep the caller's deadline.
            double wait = std::min((max - due) / rate_, 0.01);
            std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        }
    }

private:
    double rate_;
    Clock::time_point t0_;
};

// TX queues of dev in this namespace (/sys shows the namespace's devices under ip netns exec).
uint32_t tx_queues(const std::string &dev)
{
    std::string path = "/sys/class/net/" + dev + "/queues";
    DIR *d = opendir(path.c_str());
    if (!d)
        return 1;
    uint32_t n = 0;
    while (dirent *e = readdir(d))
        n += std::strncmp(e->d_name, "tx-", 3) == 0;
    closedir(d);
    return std::max<uint32_t>(n, 1);
}

// AF_XDP: every UMEM frame holds a finished frame of some flow from the start, and a sent frame
// comes back through the completion ring unchanged, so the loop only moves descriptors. One
// socket per TX queue (a copy-mode socket sends on the queue it is bound to; veth delivers to
// the peer's RX queue of the same number), used in turn.
Result<TxResult> tx_xsk(const TxOptions &o, const std::atomic<bool> &stop)
{
    std::vector<std::vector<uint8_t>> frames = tx_frames(o);
    // A UMEM frame for each distinct frame at least, so that every one is sent.
    uint32_t count = 4096;
    while (count < frames.size())
        count *= 2;
    auto umem = Umem::create({.frame_count = count, .fill_size = 64, .comp_size = 2048});
    if (!umem)
        return umem.error();
    FramePool pool(*umem);
    std::vector<uint64_t> all(pool.count());
    pool.alloc(all.data(), uint32_t(all.size()));
    for (size_t i = 0; i < all.size(); ++i) {
        const auto &f = frames[i % frames.size()];
        std::memcpy(umem->frame(all[i]) + kFrameHeadroom - kEthBytes, f.data(), f.size());
    }
    pool.free(all.data(), uint32_t(all.size()));

    TxResult r;
    r.queues = std::min(tx_queues(o.ep.dev), uint32_t(frames.size()));
    std::vector<XskPort> ports;
    for (uint32_t q = 0; q < r.queues; ++q) {
        auto p = XskPort::open(*umem, pool, o.ep.dev,
                               {.queue = q, .mode = XskMode::Copy, .rx_size = 64});
        if (!p)
            return p.error();
        ports.push_back(std::move(*p));
    }
    const uint32_t ip_len = ip_len_of(o.size);
    Pkt burst[kBurst];
    uint64_t addrs[kBurst];
    auto t0 = Clock::now();
    auto end = t0 + std::chrono::duration<double>(o.seconds);
    Pacer pacer(o.rate, t0);
    while (!stop.load(std::memory_order_relaxed) && Clock::now() < end) {
        for (auto &port : ports) {
            uint32_t n = pool.alloc(addrs, pacer.allow(r.sent, kBurst));
            for (uint32_t i = 0; i < n; ++i) {
                burst[i] = Pkt{umem->frame(addrs[i]), kFrameSize, kFrameHeadroom, ip_len};
                burst[i].l2_len = kEthBytes;
            }
            size_t placed = port.tx_burst(burst, n);
            port.recycle(burst + placed, n - placed);
            r.sent += placed;
            if (placed < n)
                port.complete();
        }
    }
    r.seconds = since(t0);
    // What is still on a TX ring was never sent: wait a little for it, then take it back out.
    auto drain_end = Clock::now() + std::chrono::milliseconds(500);
    for (auto &port : ports) {
        while (port.tx_outstanding() && Clock::now() < drain_end)
            port.complete();
        r.sent -= std::min<uint64_t>(r.sent, port.tx_outstanding());
    }
    return r;
}

// AF_PACKET: sendmmsg of kBurst messages over the flows' frames in turn, the qdisc bypassed.
Result<TxResult> tx_packet(const TxOptions &o, const std::atomic<bool> &stop)
{
    // Protocol 0: this socket receives nothing.
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return make_error(std::string("socket(AF_PACKET): ") + std::strerror(errno) +
                              "; needs CAP_NET_RAW",
                          errno);
    int one = 1;
    setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof one);
    sockaddr_ll ll{};
    ll.sll_family = AF_PACKET;
    ll.sll_ifindex = int(o.ep.ifindex);
    ll.sll_protocol = 0;
    if (bind(fd, reinterpret_cast<sockaddr *>(&ll), sizeof ll)) {
        int err = errno;
        close(fd);
        return make_error(o.ep.dev + ": bind(AF_PACKET): " + std::strerror(err), err);
    }

    std::vector<std::vector<uint8_t>> frames = tx_frames(o);
    const uint32_t nframes = uint32_t(frames.size());
    // Messages cycle through the frames, each call going on where the last one stopped.
    iovec iov[kBurst];
    mmsghdr msgs[kBurst]{};
    TxResult r;
    r.queues = tx_queues(o.ep.dev);  // chosen per flow by the kernel's hash
    uint32_t next = 0;
    auto t0 = Clock::now();
    auto end = t0 + std::chrono::duration<double>(o.seconds);
    Pacer pacer(o.rate, t0);
    while (!stop.load(std::memory_order_relaxed) && Clock::now() < end) {
        uint32_t burst = pacer.allow(r.sent + r.refused, kBurst);
        for (uint32_t i = 0; i < burst; ++i) {
            auto &f = frames[(next + i) % nframes];
            iov[i] = {f.data(), f.size()};
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        int n = sendmmsg(fd, msgs, burst, 0);
        if (n < 0) {
            // ENOBUFS: the device queue was full and the first frame was dropped.
            if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR) {
                int err = errno;
                close(fd);
                return make_error(o.ep.dev + ": sendmmsg: " + std::strerror(err), err);
            }
            ++r.refused;
            next = (next + 1) % nframes;
            continue;
        }
        r.sent += uint64_t(n);
        next = (next + uint32_t(n)) % nframes;
    }
    r.seconds = since(t0);
    close(fd);
    return r;
}

}  // namespace

std::vector<std::vector<uint8_t>> tx_frames(const TxOptions &o)
{
    std::vector<std::vector<uint8_t>> frames;
    uint32_t n = std::max(o.flows, o.pairs);
    for (uint32_t k = 0; k < n; ++k) {
        Endpoints ep = o.ep;
        uint32_t step = (k % o.pairs) * o.pair_step;
        ep.src = htonl(ntohl(ep.src) + step);
        ep.dst = htonl(ntohl(ep.dst) + step);
        frames.push_back(build_frame(ep, o.size, k % o.flows));
    }
    return frames;
}

const char *tx_method_name(TxMethod m)
{
    return m == TxMethod::Xsk ? "xsk" : "packet";
}

Result<TxResult> run_tx(const TxOptions &o, const std::atomic<bool> &stop)
{
    return o.method == TxMethod::Packet ? tx_packet(o, stop) : tx_xsk(o, stop);
}

}  // namespace xesp::gen
