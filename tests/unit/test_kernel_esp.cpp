// The raw sockets that read back ESP the kernel reassembled (userspace/kernel/kernel_esp.h):
// a datagram longer than a frame is dropped and counted, never handed on cut short. Datagram
// socket pairs stand in for the raw sockets; truncation works the same on both.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "userspace/kernel/kernel_esp.h"

using namespace xesp;

namespace {

struct Pair {
    int rx = -1, tx = -1;
    Pair()
    {
        int sv[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, sv) == 0);
        rx = sv[0];
        tx = sv[1];
    }
    ~Pair() { ::close(tx); }  // rx belongs to the KernelEspInput
    void send(size_t len, uint8_t fill)
    {
        std::vector<uint8_t> d(len, fill);
        REQUIRE(::send(tx, d.data(), d.size(), 0) == ssize_t(len));
    }
};

}  // namespace

TEST_CASE("kernel ESP input drops a datagram longer than a frame", "[kernel_esp]")
{
    Pair esp4, esp6;
    int fds[KernelEspInput::kSockets] = {-1, -1, -1, -1};
    fds[KernelEspInput::Esp4] = esp4.rx;
    fds[KernelEspInput::Esp6] = esp6.rx;
    KernelEspInput in(fds);
    std::vector<uint8_t> frame(kFrameSize);
    auto fresh = [&] { return Pkt{frame.data(), kFrameSize, 0, 0}; };
    const size_t room = kFrameSize - kFrameHeadroom - kMaxEspOverheadBack;

    // IPv4: the whole datagram fits exactly, then one byte too many, then a small one.
    esp4.send(room, 0x11);
    esp4.send(room + 1, 0x22);
    esp4.send(6000, 0x33);
    esp4.send(100, 0x44);
    Pkt p = fresh();
    REQUIRE(in.receive(p));
    CHECK(p.len == room);
    CHECK(frame[kFrameHeadroom] == 0x11);
    CHECK(in.take_too_big() == 0);
    p = fresh();
    REQUIRE(in.receive(p));
    CHECK(p.len == 100);
    CHECK(frame[kFrameHeadroom] == 0x44);
    CHECK(in.take_too_big() == 2);
    CHECK(in.take_too_big() == 0);

    // IPv6 (the payload only; the header is rebuilt in front of it): too long, dropped.
    esp6.send(room - 40 + 1, 0x55);
    p = fresh();
    CHECK_FALSE(in.receive(p));
    CHECK(in.take_too_big() == 1);
}
