#include "tools/gen/frame.h"

#include <arpa/inet.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "tools/gen/gen_abi.h"
#include "userspace/base/clock.h"

namespace xesp::gen {

namespace {

constexpr auto kResolveTimeout = std::chrono::seconds(3);

Result<uint32_t> parse_ip4(const std::string &what, const std::string &text)
{
    in_addr a{};
    if (inet_pton(AF_INET, text.c_str(), &a) != 1)
        return make_error(what + " '" + text + "' is not an IPv4 address");
    return uint32_t(a.s_addr);
}

bool parse_mac(const std::string &text, uint8_t mac[6])
{
    unsigned b[6];
    char tail;
    if (std::sscanf(text.c_str(), "%x:%x:%x:%x:%x:%x%c", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5],
                    &tail) != 6)
        return false;
    for (int i = 0; i < 6; ++i) {
        if (b[i] > 0xff)
            return false;
        mac[i] = uint8_t(b[i]);
    }
    return true;
}

Result<void> own_mac(const std::string &dev, uint8_t mac[6])
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return make_error(std::string("socket: ") + std::strerror(errno), errno);
    ifreq ifr{};
    std::snprintf(ifr.ifr_name, IFNAMSIZ, "%s", dev.c_str());
    int err = ioctl(fd, SIOCGIFHWADDR, &ifr) ? errno : 0;
    close(fd);
    if (err)
        return make_error(dev + ": cannot read its MAC: " + std::strerror(err) +
                              "; is the interface in this network namespace?",
                          err);
    std::memcpy(mac, ifr.ifr_hwaddr.sa_data, 6);
    return {};
}

// The next hop towards dst through dev: the gateway of the longest matching route, or dst
// itself on a directly connected network. /proc/net/route shows addresses as the hex of their
// in-memory (network order) value, so they compare as is.
Result<uint32_t> next_hop(const std::string &dev, uint32_t dst)
{
    std::ifstream in("/proc/net/route");
    std::string line;
    std::getline(in, line);  // header
    int best_len = -1;
    uint32_t best_metric = 0, hop = 0;
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string iface;
        unsigned dest, gw, flags, refcnt, use, metric, mask;
        if (!(f >> iface >> std::hex >> dest >> gw >> flags >> std::dec >> refcnt >> use >>
              metric >> std::hex >> mask))
            continue;
        if (iface != dev || !(flags & RTF_UP) || (dst & mask) != dest)
            continue;
        int len = __builtin_popcount(mask);
        if (len < best_len || (len == best_len && metric >= best_metric))
            continue;
        best_len = len;
        best_metric = metric;
        hop = (flags & RTF_GATEWAY) ? gw : dst;
    }
    if (best_len < 0) {
        char d[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &dst, d, sizeof d);
        return make_error(std::string("no route to ") + d + " through " + dev +
                          "; add one, or give --dst-mac");
    }
    return hop;
}

// The complete neighbour entry for hop on dev, if any.
bool neighbour_mac(const std::string &dev, uint32_t hop, uint8_t mac[6])
{
    char want[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &hop, want, sizeof want);
    std::ifstream in("/proc/net/arp");
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string ip, hwtype, flags, hw, mask, iface;
        if (!(f >> ip >> hwtype >> flags >> hw >> mask >> iface))
            continue;
        // ATF_COM (0x2): resolved.
        if (ip == want && iface == dev && (std::stoul(flags, nullptr, 16) & 0x2))
            return parse_mac(hw, mac);
    }
    return false;
}

// One datagram to the discard port makes the kernel resolve the next hop.
void poke(const std::string &dev, uint32_t hop)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return;
    setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, dev.c_str(), socklen_t(dev.size()));
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(9);
    to.sin_addr.s_addr = hop;
    sendto(fd, "x", 1, MSG_DONTWAIT, reinterpret_cast<sockaddr *>(&to), sizeof to);
    close(fd);
}

Result<void> hop_mac(const std::string &dev, uint32_t dst, uint8_t mac[6])
{
    auto hop = next_hop(dev, dst);
    if (!hop)
        return hop.error();
    if (neighbour_mac(dev, *hop, mac))
        return {};
    auto deadline = Clock::now() + kResolveTimeout;
    while (Clock::now() < deadline) {
        poke(dev, *hop);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (neighbour_mac(dev, *hop, mac))
            return {};
    }
    char h[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &*hop, h, sizeof h);
    return make_error(std::string("next hop ") + h + " on " + dev +
                      " did not answer ARP; is it up? (or give --dst-mac)");
}

// The one's complement sum (RFC 1071) of len bytes, added to sum, not folded.
uint32_t inet_sum(uint32_t sum, const uint8_t *p, size_t len)
{
    for (size_t i = 0; i + 1 < len; i += 2)
        sum += uint32_t(p[i]) << 8 | p[i + 1];
    if (len & 1)
        sum += uint32_t(p[len - 1]) << 8;
    return sum;
}

uint16_t fold_not(uint32_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return uint16_t(~sum);
}

uint16_t ip_checksum(const uint8_t *p, size_t len)
{
    return htons(fold_not(inet_sum(0, p, len)));
}

void put16(uint8_t *p, uint16_t host)
{
    p[0] = uint8_t(host >> 8), p[1] = uint8_t(host);
}

}  // namespace

Result<Endpoints> resolve_endpoints(const std::string &dev, const std::string &src,
                                    const std::string &dst,
                                    const std::optional<std::string> &dst_mac)
{
    Endpoints ep;
    ep.dev = dev;
    ep.ifindex = if_nametoindex(dev.c_str());
    if (!ep.ifindex)
        return make_error(dev + ": no such interface in this network namespace");
    auto s = parse_ip4("--src", src);
    if (!s)
        return s.error();
    auto d = parse_ip4("--dst", dst);
    if (!d)
        return d.error();
    ep.src = *s;
    ep.dst = *d;
    if (auto r = own_mac(dev, ep.src_mac); !r)
        return r.error();
    if (dst_mac) {
        if (!parse_mac(*dst_mac, ep.dst_mac))
            return make_error("--dst-mac '" + *dst_mac + "' is not a MAC (aa:bb:cc:dd:ee:ff)");
        return ep;
    }
    if (auto r = hop_mac(dev, ep.dst, ep.dst_mac); !r)
        return r.error();
    return ep;
}

std::vector<uint8_t> build_frame(const Endpoints &ep, uint32_t size, uint32_t flow)
{
    const uint32_t ip_len = ip_len_of(size);
    std::vector<uint8_t> f(kEthBytes + ip_len, 0);
    std::memcpy(&f[0], ep.dst_mac, 6);
    std::memcpy(&f[6], ep.src_mac, 6);
    put16(&f[12], 0x0800);

    uint8_t *ip = &f[kEthBytes];
    ip[0] = 0x45;
    put16(ip + 2, uint16_t(ip_len));
    // As a host's unconnected UDP socket sends it: DF (path MTU discovery, Linux's default),
    // id 0 (what Linux gives a DF datagram of such a socket), TTL 64, the UDP checksum done.
    put16(ip + 6, 0x4000);
    ip[8] = 64;
    ip[9] = IPPROTO_UDP;
    std::memcpy(ip + 12, &ep.src, 4);
    std::memcpy(ip + 16, &ep.dst, 4);
    uint16_t csum = ip_checksum(ip, 20);
    std::memcpy(ip + 10, &csum, 2);

    uint8_t *udp = ip + 20;
    const uint16_t udp_len = uint16_t(ip_len - 20);
    put16(udp, uint16_t(GEN_SRC_PORT_BASE + flow));
    put16(udp + 2, GEN_UDP_PORT);
    put16(udp + 4, udp_len);
    uint32_t magic = htonl(GEN_MAGIC);
    std::memcpy(udp + 8, &magic, 4);
    // The pseudo-header (RFC 768): addresses, protocol, UDP length; 0 is sent as 0xffff.
    uint32_t sum = inet_sum(0, ip + 12, 8) + IPPROTO_UDP + udp_len;
    uint16_t ucsum = fold_not(inet_sum(sum, udp, udp_len));
    put16(udp + 6, ucsum ? ucsum : 0xffff);
    return f;
}

std::string mac_string(const uint8_t mac[6])
{
    char s[18];
    std::snprintf(s, sizeof s, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
                  mac[4], mac[5]);
    return s;
}

}  // namespace xesp::gen
