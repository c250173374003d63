#include "userspace/offload/tun.h"

#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace xesp {

Result<std::unique_ptr<Tun>> Tun::create(const std::string &name, bool outlive_crash)
{
    if (name.empty() || name.size() >= IFNAMSIZ)
        return make_error("tun: '" + name + "' is not a device name (1 to " +
                          std::to_string(IFNAMSIZ - 1) + " characters)");
    std::unique_ptr<Tun> t(new Tun);
    t->fd_ = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (t->fd_ < 0)
        return make_error("tun: /dev/net/tun: " + std::string(std::strerror(errno)), errno);
    ifreq ifr{};
    std::memcpy(ifr.ifr_name, name.data(), name.size());
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI | IFF_VNET_HDR;
    t->existed_ = if_nametoindex(name.c_str()) != 0;
    if (::ioctl(t->fd_, TUNSETIFF, &ifr) < 0)
        return make_error("tun: " + name + ": " + std::strerror(errno), errno);
    t->name_ = ifr.ifr_name;
    if (outlive_crash) {
        if (::ioctl(t->fd_, TUNSETPERSIST, 1) < 0)
            return make_error("tun: " + name + ": persist: " + std::strerror(errno), errno);
        t->persist_ = !t->existed_;  // a device taken over stays until own()
        t->outlive_ = true;
    }
    int hdr = sizeof(VnetHdr);
    if (::ioctl(t->fd_, TUNSETVNETHDRSZ, &hdr) < 0)
        return make_error("tun: " + name + ": vnet header size: " + std::strerror(errno), errno);
    // USO where the kernel has it (6.2 on), without it where it does not.
    for (unsigned want :
         {kCsum | kTso4 | kTso6 | kTsoEcn | kUso4 | kUso6, kCsum | kTso4 | kTso6 | kTsoEcn}) {
        if (::ioctl(t->fd_, TUNSETOFFLOAD, want) == 0) {
            t->offloads_ = want;
            return t;
        }
        if (errno != EINVAL)
            break;
    }
    return make_error("tun: " + name + ": offloads: " + std::strerror(errno), errno);
}

Tun::~Tun()
{
    if (fd_ < 0)
        return;
    if (persist_)
        (void)::ioctl(fd_, TUNSETPERSIST, 0);  // the device goes with the descriptor
    ::close(fd_);
}

ssize_t Tun::read(VnetHdr *h, uint8_t *buf, size_t room)
{
    iovec iov[2] = {{h, sizeof *h}, {buf, room}};
    ssize_t n = ::readv(fd_, iov, 2);
    if (n < 0)
        return -errno;  // -EAGAIN: nothing to read
    if (size_t(n) < sizeof *h)
        return -EINVAL;             // not even a vnet header: nothing to go by
    return n - ssize_t(sizeof *h);  // 0: a packet with no bytes after its vnet header
}

int Tun::write(const VnetHdr &h, const uint8_t *pkt, size_t len)
{
    iovec piece{const_cast<uint8_t *>(pkt), len};
    return write(h, &piece, 1);
}

int Tun::write(const VnetHdr &h, const iovec *pieces, size_t n)
{
    iovec iov[Gro::kMaxRun + 2];
    if (n > Gro::kMaxRun + 1)
        return -EINVAL;
    iov[0] = {const_cast<VnetHdr *>(&h), sizeof h};
    std::copy(pieces, pieces + n, iov + 1);
    ssize_t r = ::writev(fd_, iov, int(n + 1));
    return r < 0 ? -errno : 0;
}

}  // namespace xesp
