// A TUN device that takes and gives super-packets: each packet read or written has a
// virtio-net header in front (IFF_VNET_HDR) that says how it is to be cut and where its
// checksum is to go, and the device tells the kernel it does TSO, USO and checksums itself
// (TUNSETOFFLOAD), so that what the kernel routes into it stays whole, as wireguard-go's TUN
// does. Kernels before 6.2 know no USO: UDP then comes in datagrams.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "userspace/base/result.h"
#include "userspace/offload/gso.h"

namespace xesp {

class Tun {
public:
    // What the device may be handed whole (TUN_F_*).
    static constexpr unsigned kCsum = 0x01, kTso4 = 0x02, kTso6 = 0x04, kTsoEcn = 0x08,
                              kUso4 = 0x20, kUso6 = 0x40;

    // Creates the device `name` in this network namespace, its descriptor non-blocking. It
    // goes when the last descriptor is closed; with `outlive_crash`, only when this object
    // closes it: a process that dies without (kill -9) leaves it in place, holding its index,
    // and the kernel drops what is sent to it (counted in its tx_dropped from Linux 6.11). A
    // device of that name left so is taken over (existed() says so), and is left in place
    // again on close until own() is called: what still redirects to its index must be gone
    // first.
    static Result<std::unique_ptr<Tun>> create(const std::string &name, bool outlive_crash = false);
    ~Tun();
    Tun(const Tun &) = delete;
    Tun &operator=(const Tun &) = delete;

    int fd() const { return fd_; }
    const std::string &name() const { return name_; }
    // Whether the device was there before create(): left by a process that died.
    bool existed() const { return existed_; }
    // With `outlive_crash`: from now on, closing removes the device, taken over or not.
    void own() { persist_ = outlive_; }
    void keep() { persist_ = false; }  // left in place on close after all
    // The offloads the kernel took: TSO and checksums always, USO where the kernel has it.
    unsigned offloads() const { return offloads_; }
    // Whether it takes USO both ways (IPv4 and IPv6): joined UDP may be written to it.
    bool uso() const { return (offloads_ & (kUso4 | kUso6)) == (kUso4 | kUso6); }

    // One packet, its vnet header in *h and its bytes (from the IP header) in buf (room: at
    // least 64 KB). Returns
    //   > 0      its length;
    //   0        a packet with no bytes after its vnet header: nothing to use, but the next
    //            read may have one;
    //   -EAGAIN  nothing to read now (the descriptor is non-blocking: poll for POLLIN);
    //   -EINVAL  a packet shorter than a vnet header: nothing to use, as 0;
    //   -errno   any other error of readv(2) on the device.
    ssize_t read(VnetHdr *h, uint8_t *buf, size_t room);
    // One packet with its header: 0, or -errno (-EAGAIN: the device's queue is full).
    int write(const VnetHdr &h, const uint8_t *pkt, size_t len);
    // The same with the packet in n pieces (Gro::gather()), at most Gro::kMaxRun + 1.
    int write(const VnetHdr &h, const iovec *pieces, size_t n);

private:
    Tun() = default;
    int fd_ = -1;
    std::string name_;
    unsigned offloads_ = 0;
    bool persist_ = false;  // closing clears persistence: the device goes
    bool outlive_ = false;
    bool existed_ = false;
};

}  // namespace xesp
