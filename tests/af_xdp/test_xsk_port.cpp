// XskPort and FramePool on a veth pair (topology in test_xsk_port.sh, which runs this inside
// the namespace of IFNAME). The peer's AF_PACKET sockets are made in the peer namespace with
// setns(); sockets stay in the namespace they were made in.
//
//   test_xsk_port PEER_NETNS_PATH IFNAME PEER_IFNAME [--xps] [--bench SECONDS]
//
// --xps: the wrapper mapped the peer's TX queue q to CPU q, so a frame sent from CPU q must
// arrive on queue q. --bench: also measure an rx_burst -> tx_burst reflect loop.
//
// Exit status: 0 all passed, 1 something failed, 77 skipped (not root, no AF_XDP).
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "af_xdp/umem.h"
#include "af_xdp/xsk_port.h"
#include "tests/af_xdp/xsk_test_abi.h"
#include "xsk_redirect.skel.h"

using namespace xesp;
using Clock = std::chrono::steady_clock;

namespace {

int g_passed = 0;
int g_failed = 0;
// Bytes of metadata at the start of each received frame: sizeof(xsk_test_meta) where the
// kernel refuses bpf_xdp_adjust_meta (see xsk_redirect.bpf.c), else 0.
uint32_t g_skip = 0;

bool check(bool ok, const std::string &what)
{
    std::printf("%s - %s\n", ok ? "ok  " : "FAIL", what.c_str());
    ++(ok ? g_passed : g_failed);
    return ok;
}

[[noreturn]] void fatal(const std::string &what)
{
    std::printf("FAIL - %s\n", what.c_str());
    ++g_failed;
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    std::exit(1);
}

void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

bool mac_of(const char *ifname, uint8_t mac[6])
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    ifreq ifr{};
    std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    bool ok = fd >= 0 && ioctl(fd, SIOCGIFHWADDR, &ifr) == 0;
    if (ok)
        std::memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
    if (fd >= 0)
        close(fd);
    return ok;
}

// ---- Test frames: Ethernet, then seq, len, pattern --------------------------------------

struct Macs {
    uint8_t self[6];
    uint8_t peer[6];
};

constexpr uint32_t kHdr = 14 + 8;

uint32_t frame_len(uint32_t seq)
{
    return 60 + (seq * 97) % 1440;
}
uint8_t pattern(uint32_t seq, uint32_t i)
{
    return uint8_t(seq * 131 + i * 7 + (i >> 8));
}

void build(uint8_t *f, uint32_t seq, const uint8_t dst[6], const uint8_t src[6])
{
    uint32_t len = frame_len(seq);
    std::memcpy(f, dst, 6);
    std::memcpy(f + 6, src, 6);
    uint16_t type = htons(XSK_TEST_ETHERTYPE);
    std::memcpy(f + 12, &type, 2);
    std::memcpy(f + 14, &seq, 4);
    std::memcpy(f + 18, &len, 4);
    for (uint32_t i = kHdr; i < len; ++i)
        f[i] = pattern(seq, i);
}

// The frame's seq if it is an intact test frame from `src` to `dst`, else -1.
long parse(const uint8_t *f, uint32_t len, const uint8_t dst[6], const uint8_t src[6])
{
    uint32_t seq = 0;
    uint32_t want = 0;
    uint16_t type = 0;
    if (len < kHdr)
        return -1;
    std::memcpy(&type, f + 12, 2);
    std::memcpy(&seq, f + 14, 4);
    std::memcpy(&want, f + 18, 4);
    if (type != htons(XSK_TEST_ETHERTYPE) || want != len || len != frame_len(seq) ||
        std::memcmp(f, dst, 6) || std::memcmp(f + 6, src, 6))
        return -1;
    for (uint32_t i = kHdr; i < len; ++i)
        if (f[i] != pattern(seq, i))
            return -1;
    return seq;
}

// ---- The peer: AF_PACKET send and capture --------------------------------------------------

struct Peer {
    int tx = -1;
    int cap = -1;

    void send(const uint8_t *f, uint32_t len)
    {
        for (int tries = 0; tries < 100; ++tries) {
            if (::send(tx, f, len, 0) == ssize_t(len))
                return;
            if (errno != ENOBUFS && errno != EAGAIN)
                fatal(std::string("peer send: ") + std::strerror(errno));
            std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        fatal("peer send: ENOBUFS for 10 ms");
    }

    // Test frames the peer received, until `want` came or `ms` passed.
    std::vector<std::vector<uint8_t>> capture(size_t want, int ms)
    {
        std::vector<std::vector<uint8_t>> out;
        auto end = Clock::now() + std::chrono::milliseconds(ms);
        uint8_t buf[4096];
        while (out.size() < want && Clock::now() < end) {
            pollfd p{cap, POLLIN, 0};
            if (poll(&p, 1, 10) <= 0)
                continue;
            sockaddr_ll from{};
            socklen_t fl = sizeof from;
            ssize_t n = recvfrom(cap, buf, sizeof buf, MSG_DONTWAIT,
                                 reinterpret_cast<sockaddr *>(&from), &fl);
            if (n > 0 && from.sll_pkttype != PACKET_OUTGOING)
                out.emplace_back(buf, buf + n);
        }
        return out;
    }
};

Peer open_peer(const char *netns, const char *ifname, uint8_t mac[6])
{
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int other = open(netns, O_RDONLY | O_CLOEXEC);
    if (self < 0 || other < 0 || setns(other, CLONE_NEWNET))
        fatal(std::string("enter ") + netns + ": " + std::strerror(errno));
    Peer p;
    unsigned ifindex = if_nametoindex(ifname);
    p.tx = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
    p.cap = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(XSK_TEST_ETHERTYPE));
    sockaddr_ll a{};
    a.sll_family = AF_PACKET;
    a.sll_ifindex = int(ifindex);
    sockaddr_ll c = a;
    c.sll_protocol = htons(XSK_TEST_ETHERTYPE);
    int rcvbuf = 32 << 20;
    if (!ifindex || p.tx < 0 || p.cap < 0 || !mac_of(ifname, mac) ||
        bind(p.tx, reinterpret_cast<sockaddr *>(&a), sizeof a) ||
        bind(p.cap, reinterpret_cast<sockaddr *>(&c), sizeof c) ||
        setsockopt(p.cap, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf))
        fatal(std::string("peer sockets on ") + ifname + ": " + std::strerror(errno));
    if (setns(self, CLONE_NEWNET))
        fatal(std::string("back to own netns: ") + std::strerror(errno));
    close(self);
    close(other);
    return p;
}

// ---- The XDP program ---------------------------------------------------------------------

struct XdpAttach {
    xsk_redirect *skel = nullptr;
    int ifindex = 0;
    ~XdpAttach()
    {
        if (ifindex)
            bpf_xdp_detach(ifindex, XDP_FLAGS_DRV_MODE, nullptr);
        xsk_redirect__destroy(skel);
    }
    int xsks_fd() const { return bpf_map__fd(skel->maps.xsks); }
};

// ---- Receiving -----------------------------------------------------------------------------

struct Rx {
    size_t port;
    Pkt pkt;
};

// Polls every port until `want` more frames came or `ms` passed.
void receive(std::vector<XskPort> &ports, std::vector<Rx> &out, size_t want, int ms)
{
    Pkt burst[64];
    size_t target = out.size() + want;
    auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (out.size() < target && Clock::now() < end) {
        size_t got = 0;
        for (size_t i = 0; i < ports.size(); ++i) {
            size_t n = ports[i].rx_burst(burst, 64);
            for (size_t k = 0; k < n; ++k)
                out.push_back({i, burst[k]});
            got += n;
        }
        if (!got)
            std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

void send_all(std::vector<XskPort> &ports, std::vector<Pkt> &pkts, size_t port)
{
    size_t done = 0;
    auto end = Clock::now() + std::chrono::seconds(2);
    while (done < pkts.size() && Clock::now() < end) {
        size_t n = std::min<size_t>(64, pkts.size() - done);
        done += ports[port].tx_burst(pkts.data() + done, n);
        ports[port].complete();
    }
    if (done < pkts.size())
        fatal("tx_burst took " + std::to_string(done) + " of " + std::to_string(pkts.size()));
}

void drain(std::vector<XskPort> &ports)
{
    auto end = Clock::now() + std::chrono::seconds(2);
    for (auto &p : ports)
        while (p.tx_outstanding() && Clock::now() < end)
            p.complete();
}

uint32_t kernel_held(std::vector<XskPort> &ports)
{
    uint32_t n = 0;
    for (auto &p : ports)
        n += p.fill_held() + p.tx_outstanding();
    return n;
}

void topup(std::vector<XskPort> &ports)
{
    Pkt none[1];
    for (auto &p : ports)
        if (p.rx_burst(none, 0))
            fatal("rx_burst(max 0) returned frames");
}

std::vector<XskPort> open_ports(Umem &umem, FramePool &pool, const char *ifname, int xsks_fd,
                                XskPortOptions o, size_t count)
{
    std::vector<XskPort> ports;
    for (uint32_t q = 0; q < count; ++q) {
        o.queue = q;
        o.skip = g_skip;
        auto port = XskPort::open(umem, pool, ifname, o);
        if (!port)
            fatal("open: " + port.error().message);
        if (auto r = port->attach(xsks_fd); !r)
            fatal("attach: " + r.error().message);
        ports.push_back(std::move(*port));
    }
    return ports;
}

XskStats total_stats(std::vector<XskPort> &ports)
{
    XskStats t;
    for (auto &p : ports) {
        auto s = p.stats();
        if (!s)
            fatal(s.error().message);
        t.rx += s->rx;
        t.tx += s->tx;
        t.tx_bad += s->tx_bad;
        t.foreign += s->foreign;
        t.tx_ring_full += s->tx_ring_full;
        t.tx_kick_errors += s->tx_kick_errors;
        t.fill_short += s->fill_short;
        t.rx_dropped += s->rx_dropped;
        t.rx_invalid_descs += s->rx_invalid_descs;
        t.tx_invalid_descs += s->tx_invalid_descs;
        t.rx_ring_full += s->rx_ring_full;
        t.rx_fill_ring_empty += s->rx_fill_ring_empty;
    }
    return t;
}

struct Env {
    const char *ifname;
    Peer peer;
    Macs mac;
    bool xps;
    int cpus;
    int xsks_fd;
};

// ---- The cases -----------------------------------------------------------------------------

// Sends `count` frames from seq `first`, the i-th from CPU i % cpus, and receives them.
std::vector<Rx> send_and_receive(Env &env, std::vector<XskPort> &ports, uint32_t first,
                                 uint32_t count, uint32_t per_cpu_run)
{
    std::vector<Rx> got;
    uint8_t f[2048];
    for (uint32_t i = 0; i < count; ++i) {
        if (i == 0 || (first + i) % per_cpu_run == 0)
            pin(int((first + i) / per_cpu_run) % env.cpus);
        build(f, first + i, env.mac.self, env.mac.peer);
        env.peer.send(f, frame_len(first + i));
        if (i % 32 == 31)
            receive(ports, got, 0, 0);
    }
    receive(ports, got, count - std::min<size_t>(count, got.size()), 2000);
    return got;
}

void case_rx(Env &env, std::vector<XskPort> &ports, std::vector<Rx> &got, uint32_t n)
{
    got = send_and_receive(env, ports, 0, n, n / uint32_t(env.cpus));
    std::vector<Rx> extra;
    receive(ports, extra, 1, 100);
    check(got.size() == n && extra.empty(), "rx: " + std::to_string(got.size()) + " of " +
                                                std::to_string(n) + " frames arrived, " +
                                                std::to_string(extra.size()) + " extra");
    std::vector<int> seen(n);
    size_t bad = 0, dup = 0, misplaced = 0, bad_meta = 0, wrong_queue = 0;
    for (auto &r : got) {
        long seq = parse(r.pkt.ip(), r.pkt.len, env.mac.self, env.mac.peer);
        if (seq < 0 || seq >= long(n)) {
            ++bad;
            continue;
        }
        dup += seen[size_t(seq)]++ > 0;
        // Metadata at the frame's start: copy mode writes both from kFrameHeadroom on.
        uint32_t at = kFrameHeadroom + (ports[r.port].mode() == XskMode::Copy ? g_skip : 0);
        misplaced += r.pkt.l3 != at || r.pkt.frame_len != kFrameSize;
        auto *m = static_cast<xsk_test_meta *>(meta(r.pkt, sizeof(xsk_test_meta)));
        if (!m || m->magic != XSK_TEST_META_MAGIC || m->rx_queue != ports[r.port].queue())
            ++bad_meta;
        if (m)
            m->magic = 0;
        uint32_t sent_cpu = uint32_t(seq) / (n / uint32_t(env.cpus));
        wrong_queue += env.xps && sent_cpu != r.port;
    }
    check(bad == 0 && dup == 0, "rx: every frame intact and once (" + std::to_string(bad) +
                                    " damaged, " + std::to_string(dup) + " duplicated)");
    check(misplaced == 0, "rx: the frame starts at kFrameHeadroom (past the metadata where it is "
                          "in the frame) in a kFrameSize frame");
    check(bad_meta == 0,
          std::string("rx: metadata (") + (g_skip ? "in the frame" : "bpf_xdp_adjust_meta") +
              ") readable through meta() (" + std::to_string(bad_meta) + " frames without)");
    if (env.xps) {
        size_t on[2] = {0, 0};
        for (auto &r : got)
            ++on[r.port & 1];
        check(wrong_queue == 0 && on[0] && on[1],
              "rx: both queues used, each frame on its sender CPU's queue (q0 " +
                  std::to_string(on[0]) + ", q1 " + std::to_string(on[1]) + ")");
    }
}

void case_tx_reflect(Env &env, std::vector<XskPort> &ports, std::vector<Rx> &got)
{
    std::vector<std::vector<Pkt>> per_port(ports.size());
    for (auto &r : got) {
        std::memcpy(r.pkt.ip(), env.mac.peer, 6);
        std::memcpy(r.pkt.ip() + 6, env.mac.self, 6);
        per_port[r.port].push_back(r.pkt);
    }
    for (size_t i = 0; i < ports.size(); ++i)
        send_all(ports, per_port[i], i);
    auto cap = env.peer.capture(got.size(), 2000);
    auto extra = env.peer.capture(1, 100);
    std::vector<int> seen(got.size());
    size_t bad = 0, dup = 0;
    for (auto &f : cap) {
        long seq = parse(f.data(), uint32_t(f.size()), env.mac.peer, env.mac.self);
        if (seq < 0 || seq >= long(got.size()))
            ++bad;
        else
            dup += seen[size_t(seq)]++ > 0;
    }
    check(cap.size() == got.size() && extra.empty() && bad == 0 && dup == 0,
          "tx: " + std::to_string(cap.size()) + " of " + std::to_string(got.size()) +
              " reflected frames reached the peer intact (" + std::to_string(bad) + " damaged, " +
              std::to_string(dup) + " duplicated, " + std::to_string(extra.size()) + " extra)");
    got.clear();
}

void case_headroom(Env &env, std::vector<XskPort> &ports)
{
    constexpr uint32_t kGrow = 40;
    auto got = send_and_receive(env, ports, 7, 1, 1);
    if (!check(got.size() == 1, "headroom: a frame to grow arrived"))
        return;
    Pkt p = got[0].pkt;
    std::vector<uint8_t> want(kGrow);
    std::memcpy(want.data(), env.mac.peer, 6);
    std::memcpy(want.data() + 6, env.mac.self, 6);
    uint16_t type = htons(XSK_TEST_ETHERTYPE);
    std::memcpy(want.data() + 12, &type, 2);
    std::snprintf(reinterpret_cast<char *>(want.data()) + 14, kGrow - 14, "grown into headroom");
    want.insert(want.end(), p.ip(), p.ip() + p.len);
    p.l3 -= kGrow;
    p.len += kGrow;
    std::memcpy(p.ip(), want.data(), kGrow);
    std::vector<Pkt> one{p};
    send_all(ports, one, got[0].port);
    auto cap = env.peer.capture(1, 1000);
    check(cap.size() == 1 && cap[0] == want,
          "headroom: a frame moved 40 bytes into its headroom is sent from its new start");
}

void case_rounds(Env &env, std::vector<XskPort> &ports, FramePool &pool, uint32_t start,
                 uint32_t total)
{
    constexpr uint32_t kRounds = 200, kPerRound = 64;
    size_t received = 0, reflected = 0, captured = 0;
    for (uint32_t r = 0; r < kRounds; ++r) {
        auto got = send_and_receive(env, ports, r * kPerRound, kPerRound, kPerRound);
        received += got.size();
        std::vector<std::vector<Pkt>> out(ports.size());
        for (auto &x : got) {
            if (parse(x.pkt.ip(), x.pkt.len, env.mac.self, env.mac.peer) % 2) {
                ports[x.port].recycle(x.pkt);
                continue;
            }
            std::memcpy(x.pkt.ip(), env.mac.peer, 6);
            std::memcpy(x.pkt.ip() + 6, env.mac.self, 6);
            out[x.port].push_back(x.pkt);
        }
        for (size_t i = 0; i < ports.size(); ++i) {
            reflected += out[i].size();
            send_all(ports, out[i], i);
        }
        captured += env.peer.capture(reflected - captured, 1000).size();
    }
    drain(ports);
    check(received == kRounds * kPerRound && captured == reflected,
          "rounds: " + std::to_string(received) + " received, " + std::to_string(reflected) +
              " reflected, " + std::to_string(captured) + " reached the peer");
    check(pool.count() + kernel_held(ports) == total,
          "rounds: every frame is in the pool or with the kernel (" + std::to_string(pool.count()) +
              " + " + std::to_string(kernel_held(ports)) + " of " + std::to_string(total) + ")");
    topup(ports);
    check(pool.count() == start && pool.overflows() == 0, "rounds: no leak, the pool is back to " +
                                                              std::to_string(start) + " (" +
                                                              std::to_string(pool.count()) + ")");
}

void case_bad_tx(std::vector<XskPort> &ports, Umem &umem, FramePool &pool)
{
    uint32_t before = pool.count();
    uint64_t addr = 0;
    if (!pool.alloc(&addr, 1))
        fatal("bad tx: empty pool");
    Pkt bad{umem.frame(addr), kFrameSize, kFrameSize - 100, 200};
    auto before_stats = total_stats(ports);
    size_t taken = ports[0].tx_burst(&bad, 1);
    auto after = total_stats(ports);
    check(taken == 1 && after.tx_bad == before_stats.tx_bad + 1 && pool.count() == before &&
              ports[0].tx_outstanding() == 0,
          "bad tx: a frame running past its end is refused and recycled, not sent");

    std::vector<uint8_t> elsewhere(kFrameSize);
    Pkt foreign{elsewhere.data(), kFrameSize, kFrameHeadroom, 64};
    taken = ports[0].tx_burst(&foreign, 1);
    ports[0].recycle(foreign);
    auto last = total_stats(ports);
    check(taken == 1 && last.foreign == after.foreign + 2 && pool.count() == before &&
              last.tx == after.tx,
          "bad tx: a frame of another Umem is neither sent nor put in this pool");

    FramePool other = pool.split(10);
    uint64_t moved[10];
    uint32_t got = other.alloc(moved, 10);
    bool split_ok = other.count() == 0 && got == 10 && pool.count() == before - 10;
    pool.free(moved, got);
    check(split_ok && pool.count() == before && other.capacity() == pool.capacity(),
          "pool: split() moves frames to another thread's pool, and they can come back");
}

void case_stats(std::vector<XskPort> &ports, uint64_t rx, uint64_t tx)
{
    auto s = total_stats(ports);
    check(s.rx == rx && s.tx == tx, "stats: rx " + std::to_string(s.rx) + " (want " +
                                        std::to_string(rx) + "), tx " + std::to_string(s.tx) +
                                        " (want " + std::to_string(tx) + ")");
    check(s.rx_invalid_descs == 0 && s.tx_invalid_descs == 0 && s.tx_kick_errors == 0,
          "stats: no invalid descriptors, no kick errors");
}

// A pool with no frames: the kernel finds the fill ring empty and drops; rx_burst carries on.
void case_starvation(Env &env, const char *ifname)
{
    auto umem = Umem::create({.frame_count = 64, .fill_size = 32, .comp_size = 32});
    if (!umem)
        fatal(umem.error().message);
    FramePool pool(*umem);
    XskPortOptions o{.rx_size = 64, .tx_size = 64, .fill_target = 16};
    auto ports = open_ports(*umem, pool, ifname, env.xsks_fd, o, 1);
    o.queue = 1;
    o.busy_poll = true;
    o.skip = g_skip;
    auto busy = XskPort::open(*umem, pool, ifname, o);
    if (!check(bool(busy), "starvation: a port with busy polling opens" +
                               (busy ? std::string() : ": " + busy.error().message)))
        return;
    if (auto r = busy->attach(env.xsks_fd); !r)
        fatal(r.error().message);
    ports.push_back(std::move(*busy));

    std::vector<uint64_t> held(pool.count());
    held.resize(pool.alloc(held.data(), uint32_t(held.size())));
    auto got = send_and_receive(env, ports, 0, 100, 50);
    auto s = total_stats(ports);
    check(got.size() <= 32 && !got.empty(), "starvation: only the " + std::to_string(got.size()) +
                                                " frames the fill rings held arrived");
    check(s.rx_fill_ring_empty > 0 && s.fill_short > 0,
          "starvation: reported, fill ring empty " + std::to_string(s.rx_fill_ring_empty) +
              " times, pool short " + std::to_string(s.fill_short) + " times, " +
              std::to_string(s.rx_dropped) + " dropped");

    pool.free(held.data(), uint32_t(held.size()));
    for (auto &r : got)
        ports[r.port].recycle(r.pkt);
    topup(ports);
    auto again = send_and_receive(env, ports, 200, 10, 5);
    check(again.size() == 10, "starvation: frames flow again once the pool is refilled (" +
                                  std::to_string(again.size()) + " of 10)");
    std::vector<std::vector<Pkt>> back(ports.size());
    for (auto &r : again)
        back[r.port].push_back(r.pkt);
    for (size_t i = 0; i < ports.size(); ++i)
        send_all(ports, back[i], i);
    drain(ports);
    s = total_stats(ports);
    check(s.tx == again.size() && s.tx_invalid_descs == 0 && !ports[0].tx_outstanding() &&
              !ports[1].tx_outstanding(),
          "starvation: and go out again, all completed (tx " + std::to_string(s.tx) + ")");
    topup(ports);
    check(pool.count() + kernel_held(ports) == 64, "starvation: no frame lost");
}

// ---- Reflect loop throughput ---------------------------------------------------------------

// A generator AF_XDP socket on the peer (CPU 0) blasts 64-byte frames; this side (CPU 1)
// reflects them with rx_burst -> tx_burst. Both in copy mode.
void bench(Env &env, std::vector<XskPort> &ports, const char *peer_netns, const char *peer_if,
           int seconds)
{
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int other = open(peer_netns, O_RDONLY | O_CLOEXEC);
    if (setns(other, CLONE_NEWNET))
        fatal(std::string("bench: enter ") + peer_netns + ": " + std::strerror(errno));
    auto gumem = Umem::create({.frame_count = 4096});  // its fd is the generator's socket
    if (!gumem)
        fatal("bench: " + gumem.error().message);
    FramePool gpool(*gumem);
    auto gen = XskPort::open(*gumem, gpool, peer_if, {.queue = 0, .fill_target = 64});
    if (setns(self, CLONE_NEWNET) || !gen)
        fatal("bench: generator: " + (gen ? std::string("setns") : gen.error().message));
    close(self);
    close(other);
    close(env.peer.cap);  // the reflected frames are not looked at here
    env.peer.cap = -1;

    std::atomic<bool> stop{false};
    std::atomic<uint64_t> generated{0};
    std::thread g([&] {
        pin(0);
        Pkt burst[64];
        uint64_t addrs[64];
        while (!stop.load(std::memory_order_relaxed)) {
            uint32_t n = gpool.alloc(addrs, 64);
            for (uint32_t i = 0; i < n; ++i) {
                uint8_t *f = gumem->frame(addrs[i]) + kFrameHeadroom;
                std::memcpy(f, env.mac.self, 6);
                std::memcpy(f + 6, env.mac.peer, 6);
                uint16_t type = htons(XSK_TEST_ETHERTYPE);
                std::memcpy(f + 12, &type, 2);
                burst[i] = Pkt{gumem->frame(addrs[i]), kFrameSize, kFrameHeadroom, 64};
            }
            size_t sent = gen->tx_burst(burst, n);
            gen->recycle(burst + sent, n - sent);
            generated += sent;
            gen->complete();
        }
    });
    pin(env.cpus > 1 ? 1 : 0);
    Pkt burst[64];
    uint64_t reflected = 0, dropped = 0;
    auto t0 = Clock::now();
    auto end = t0 + std::chrono::seconds(seconds);
    while (Clock::now() < end) {
        for (auto &p : ports) {
            size_t n = p.rx_burst(burst, 64);
            for (size_t i = 0; i < n; ++i) {
                uint8_t *f = burst[i].ip();
                std::memcpy(f, env.mac.peer, 6);
                std::memcpy(f + 6, env.mac.self, 6);
            }
            size_t sent = n ? p.tx_burst(burst, n) : 0;
            p.recycle(burst + sent, n - sent);
            dropped += n - sent;
            reflected += sent;
            if (!n)
                p.complete();
        }
    }
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    stop = true;
    g.join();
    std::printf("bench: generated %.3f Mpps, reflected %.3f Mpps (%lu not placed), 64-byte "
                "frames, copy mode, %d s\n",
                double(generated) / secs / 1e6, double(reflected) / secs / 1e6,
                static_cast<unsigned long>(dropped), seconds);
    auto st = total_stats(ports);
    std::printf("bench: reflector rx ring full %lu, fill ring empty %lu, other drops %lu\n",
                static_cast<unsigned long>(st.rx_ring_full),
                static_cast<unsigned long>(st.rx_fill_ring_empty),
                static_cast<unsigned long>(st.rx_dropped));
    drain(ports);
}

// One Umem and its pool for both queues, through receive, reflect, grow, many rounds.
void main_cases(Env &env, int bench_secs, const char *peer_netns, const char *peer_if)
{
    constexpr uint32_t kFrames = 8192;
    auto umem = Umem::create({.frame_count = kFrames, .fill_size = 2048, .comp_size = 2048});
    if (!umem)
        fatal(umem.error().message);
    FramePool pool(*umem);

    {
        auto zc = XskPort::open(*umem, pool, env.ifname, {.queue = 0, .mode = XskMode::ZeroCopy});
        if (zc)
            check(zc->mode() == XskMode::ZeroCopy, "open: zero-copy bound (not veth?)");
        else
            check(zc.error().code.value() == EOPNOTSUPP,
                  "open: zero-copy refused with EOPNOTSUPP: " + zc.error().message);
    }
    {
        auto wide = XskPort::open(*umem, pool, env.ifname, {.skip = kFrameHeadroom + 1});
        check(!wide && wide.error().message.find("skip") != std::string::npos,
              "open: a skip beyond the frame's headroom is refused" +
                  (wide ? std::string() : ": " + wide.error().message));
    }
    auto ports = open_ports(*umem, pool, env.ifname, env.xsks_fd, {.fill_target = 1024}, 2);
    check(ports[0].mode() == ports[1].mode(),
          std::string("open: auto mode bound in ") + xsk_mode_name(ports[0].mode()) + " mode");
    const uint32_t start = pool.count();
    check(start == kFrames - 2048 && kernel_held(ports) == 2048,
          "open: each fill ring holds fill_target frames from the pool");

    constexpr uint32_t kN = 1000;
    std::vector<Rx> got;
    case_rx(env, ports, got, kN);
    size_t received = got.size();
    case_tx_reflect(env, ports, got);
    drain(ports);
    topup(ports);
    check(pool.count() == start, "tx: every sent frame came back through the completion ring");
    case_headroom(env, ports);
    case_rounds(env, ports, pool, start, kFrames);
    case_stats(ports, received + 1 + 200 * 64, received + 1 + 200 * 64 / 2);
    case_bad_tx(ports, *umem, pool);
    if (bench_secs)
        bench(env, ports, peer_netns, peer_if, bench_secs);
}

}  // namespace

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc < 4) {
        std::fprintf(stderr,
                     "usage: %s PEER_NETNS_PATH IFNAME PEER_IFNAME [--xps] "
                     "[--bench SECONDS]\n",
                     argv[0]);
        return 2;
    }
    const char *peer_netns = argv[1];
    const char *ifname = argv[2];
    const char *peer_if = argv[3];
    bool xps = false;
    int bench_secs = 0;
    for (int i = 4; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--xps"))
            xps = true;
        else if (!std::strcmp(argv[i], "--bench") && i + 1 < argc)
            bench_secs = std::atoi(argv[++i]);
    }
    if (geteuid() != 0) {
        std::printf("SKIP: needs root (network namespaces, XDP, AF_XDP)\n");
        return 77;
    }
    int probe = socket(AF_XDP, SOCK_RAW, 0);
    if (probe < 0) {
        std::printf("SKIP: no AF_XDP in this kernel (%s)\n", std::strerror(errno));
        return 77;
    }
    close(probe);

    Env env{ifname, {}, {}, xps, std::min(2, int(std::thread::hardware_concurrency())), -1};
    env.peer = open_peer(peer_netns, peer_if, env.mac.peer);
    if (!mac_of(ifname, env.mac.self))
        fatal(std::string("no interface ") + ifname);

    XdpAttach xdp;
    // Where the kernel refuses bpf_xdp_adjust_meta to XDP programs, the load fails: the
    // metadata then goes in the frame.
    for (uint32_t in_frame = 0; in_frame < 2 && !xdp.skel; in_frame++) {
        xdp.skel = xsk_redirect__open();
        if (!xdp.skel)
            fatal(std::string("open xsk_redirect.bpf.o: ") + std::strerror(errno));
        xdp.skel->rodata->meta_in_frame = in_frame;
        if (int err = xsk_redirect__load(xdp.skel)) {
            xsk_redirect__destroy(xdp.skel);
            xdp.skel = nullptr;
            if (in_frame)
                fatal(std::string("load xsk_redirect.bpf.o: ") + std::strerror(-err));
            continue;
        }
        g_skip = in_frame ? uint32_t(sizeof(xsk_test_meta)) : 0;
    }
    std::printf("metadata %s\n",
                g_skip ? "in the frame (no bpf_xdp_adjust_meta here)" : "from bpf_xdp_adjust_meta");
    int ifindex = int(if_nametoindex(ifname));
    if (int err = bpf_xdp_attach(ifindex, bpf_program__fd(xdp.skel->progs.xsk_redirect),
                                 XDP_FLAGS_DRV_MODE, nullptr))
        fatal(std::string("attach XDP to ") + ifname + ": " + std::strerror(-err));
    xdp.ifindex = ifindex;
    env.xsks_fd = xdp.xsks_fd();

    main_cases(env, bench_secs, peer_netns, peer_if);
    case_starvation(env, ifname);

    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
