// A wire of two TUN devices with vnet headers (offload/tun.h) for test_tun_offload.sh: what
// one device gives is written into the other, so that a TCP connection between two network
// namespaces runs through it, and their kernels check every byte it writes.
//
//   tun_relay A B MODE MTU STATS
//     MODE pass        each packet as it came, its vnet header with it
//          split       cut with gso_split() to MTU, the pieces written one by one without
//                      offloads (the receiving kernel checks their checksums)
//          split-join  cut, then joined again by Gro and written as super-packets
//   It prints "ready" once both devices exist, and writes its counters to STATS (one
//   "name value" a line) when it gets SIGTERM.
#include <poll.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "userspace/offload/gso.h"
#include "userspace/offload/tun.h"

using namespace xesp;

namespace {

volatile sig_atomic_t stop = 0;

void on_term(int)
{
    stop = 1;
}

struct Counters {
    unsigned long reads = 0, super = 0, pieces = 0, joined = 0, writes = 0, write_errors = 0,
                  split_errors = 0, not_up = 0, read_empty = 0, read_errors = 0, super_udp = 0,
                  joined_udp = 0;
};

}  // namespace

int main(int argc, char **argv)
{
    if (argc != 6) {
        std::fprintf(stderr, "usage: tun_relay A B pass|split|split-join MTU STATS\n");
        return 2;
    }
    const std::string mode = argv[3];
    const uint32_t mtu = uint32_t(std::strtoul(argv[4], nullptr, 10));
    if (mode != "pass" && mode != "split" && mode != "split-join") {
        std::fprintf(stderr, "tun_relay: mode '%s'\n", mode.c_str());
        return 2;
    }
    std::unique_ptr<Tun> tun[2];
    for (int i = 0; i < 2; i++) {
        auto t = Tun::create(argv[1 + i]);
        if (!t) {
            std::fprintf(stderr, "tun_relay: %s\n", t.error().message.c_str());
            return 1;
        }
        tun[i] = std::move(*t);
    }
    struct sigaction sa {};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, nullptr);
    std::printf("ready offloads 0x%x\n", tun[0]->offloads());
    std::fflush(stdout);

    constexpr size_t kMaxPieces = 64, kRoom = 2048;
    std::vector<uint8_t> buf(Gro::kMaxLen + 1), joined(Gro::kMaxLen);
    std::vector<uint8_t> mem(kMaxPieces * kRoom);
    uint8_t *frames[kMaxPieces];
    const uint8_t *pieces[kMaxPieces];
    uint32_t lens[kMaxPieces];
    uint16_t run_of[kMaxPieces];
    for (size_t i = 0; i < kMaxPieces; i++) {
        frames[i] = mem.data() + i * kRoom;
        pieces[i] = frames[i];
    }
    Counters c;
    auto put = [&](Tun &out, const VnetHdr &h, const uint8_t *p, size_t len) {
        c.writes++;
        int rc = out.write(h, p, len);
        // A device not up yet takes nothing (EIO): what the kernels send as the devices come
        // up (IPv6's router solicitations) may meet that.
        if (rc == -EIO)
            c.not_up++;
        else if (rc < 0)
            c.write_errors++;
    };
    pollfd pfd[2] = {{tun[0]->fd(), POLLIN, 0}, {tun[1]->fd(), POLLIN, 0}};
    while (!stop) {
        if (::poll(pfd, 2, 100) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            Tun &in = *tun[i], &out = *tun[1 - i];
            VnetHdr h;
            ssize_t n;
            while ((n = in.read(&h, buf.data(), buf.size())) != -EAGAIN) {
                if (n == 0 || n == -EINVAL) {  // a packet with nothing to use: the next
                    c.read_empty++;
                    continue;
                }
                if (n < 0) {  // the device's error: counted, and the next poll
                    c.read_errors++;
                    break;
                }
                c.reads++;
                c.super += h.gso_type != VnetHdr::kGsoNone;
                c.super_udp += h.gso_type == VnetHdr::kGsoUdpL4;
                if (mode == "pass") {
                    put(out, h, buf.data(), size_t(n));
                    continue;
                }
                size_t k = 0;
                if (gso_split(h, buf.data(), size_t(n), mtu, frames, kRoom, lens, kMaxPieces, &k) !=
                    GsoError::None) {
                    c.split_errors++;
                    continue;
                }
                c.pieces += k;
                if (mode == "split") {
                    for (size_t p = 0; p < k; p++)
                        put(out, VnetHdr{}, pieces[p], lens[p]);
                    continue;
                }
                // UDP joined where the device written to takes USO: its kernel cuts it.
                Gro::plan(pieces, lens, k, out.uso(), run_of);
                for (size_t p = 0; p < k; p++) {
                    if (run_of[p] != p)
                        continue;
                    VnetHdr jh;
                    uint32_t len = Gro::write(pieces, lens, k, run_of, p, joined.data(), &jh);
                    c.joined += jh.gso_type != VnetHdr::kGsoNone;
                    c.joined_udp += jh.gso_type == VnetHdr::kGsoUdpL4;
                    put(out, jh, joined.data(), len);
                }
            }
        }
    }
    FILE *f = std::fopen(argv[5], "w");
    if (!f)
        return 1;
    std::fprintf(f,
                 "reads %lu\nsuper %lu\npieces %lu\njoined %lu\nwrites %lu\nwrite_errors %lu\n"
                 "split_errors %lu\nnot_up %lu\nread_empty %lu\nread_errors %lu\nsuper_udp %lu\n"
                 "joined_udp %lu\n",
                 c.reads, c.super, c.pieces, c.joined, c.writes, c.write_errors, c.split_errors,
                 c.not_up, c.read_empty, c.read_errors, c.super_udp, c.joined_udp);
    std::fclose(f);
    return 0;
}
