// Drives one NextHops for test_nexthop.sh: a command per line on stdin, one answer line per
// command on stdout, so that the script can change routes and neighbours between questions
// while the same NextHops keeps listening to the events.
//
//   lookup ADDR                            hop DEV MTU SRC_MAC DST_MAC | state NAME
//       lookup(), poll(), lookup() again: a miss is resolved within the command when the
//       kernel already knows the answer; otherwise ask again.
//   send SRC DST PORT TEXT [df] [pad N]    sent | error MESSAGE
//       a hand-made UDP packet (IPv4 or IPv6) through send_via_kernel; pad adds N bytes
//   stats                                  stats missed=N resolved=N ...
//   broadcasts                             broadcasts ADDR... | error MESSAGE
//       rtnl::dump_broadcasts(), in its order (sorted)
//   quit
//
// Usage: nexthop_probe [--refresh-ms N]
#include <net/if.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "userspace/kernel/nexthop.h"
#include "userspace/kernel/rtnl.h"

using namespace xesp;

namespace {

std::string mac_str(const std::array<uint8_t, 6> &m)
{
    char s[18];
    std::snprintf(s, sizeof(s), "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4],
                  m[5]);
    return s;
}

std::string lookup(NextHops &nh, const IpAddr &a)
{
    nh.lookup(a);
    nh.poll();
    const L2Hop *hop = nh.lookup(a);
    if (!hop)
        return std::string("state ") + hop_state_name(nh.state(a));
    char name[IF_NAMESIZE] = "?";
    if_indextoname(hop->ifindex, name);
    return "hop " + std::string(name) + " " + std::to_string(hop->mtu) + " " + mac_str(hop->src) +
           " " + mac_str(hop->dst);
}

uint32_t sum16(const uint8_t *p, size_t n, uint32_t sum = 0)
{
    for (size_t i = 0; i + 1 < n; i += 2)
        sum += uint32_t(p[i] << 8 | p[i + 1]);
    if (n & 1)
        sum += uint32_t(p[n - 1] << 8);
    return sum;
}

uint16_t fold(uint32_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return uint16_t(~sum);
}

void put16(uint8_t *p, uint32_t v)
{
    p[0] = uint8_t(v >> 8);
    p[1] = uint8_t(v);
}

// An IPv4 (DF as asked; the kernel fills in the ID and header checksum) or IPv6 header and a
// UDP datagram with its checksum over the pseudo-header.
std::vector<uint8_t> udp_packet(const IpAddr &src, const IpAddr &dst, uint16_t port,
                                const std::string &payload, bool df)
{
    size_t ip_len = src.family == 4 ? 20 : 40, udp_len = 8 + payload.size();
    std::vector<uint8_t> pkt(ip_len + udp_len);
    uint8_t *ip = pkt.data(), *udp = ip + ip_len;
    if (src.family == 4) {
        ip[0] = 0x45;
        put16(ip + 2, uint32_t(pkt.size()));
        put16(ip + 6, df ? 0x4000 : 0);
        ip[8] = 64;
        ip[9] = 17;
        std::memcpy(ip + 12, src.b.data(), 4);
        std::memcpy(ip + 16, dst.b.data(), 4);
    } else {
        ip[0] = 0x60;
        put16(ip + 4, uint32_t(udp_len));
        ip[6] = 17;
        ip[7] = 64;
        std::memcpy(ip + 8, src.b.data(), 16);
        std::memcpy(ip + 24, dst.b.data(), 16);
    }
    put16(udp, 40000);
    put16(udp + 2, port);
    put16(udp + 4, uint32_t(udp_len));
    std::memcpy(udp + 8, payload.data(), payload.size());
    uint32_t sum = sum16(src.b.data(), src.size());
    sum = sum16(dst.b.data(), dst.size(), sum) + 17 + uint32_t(udp_len);
    uint16_t c = fold(sum16(udp, udp_len, sum));
    put16(udp + 6, c ? c : 0xffff);
    return pkt;
}

std::string send(NextHops &nh, std::istringstream &in)
{
    std::string src_s, dst_s, text, word;
    unsigned port = 0;
    in >> src_s >> dst_s >> port >> text;
    bool df = false;
    size_t pad = 0;
    while (in >> word) {
        if (word == "df")
            df = true;
        else if (word == "pad")
            in >> pad;
    }
    auto src = IpAddr::parse(src_s), dst = IpAddr::parse(dst_s);
    if (!src || !dst || src->family != dst->family || !port || text.empty())
        return "error usage: send SRC DST PORT TEXT [df] [pad N]";
    auto pkt = udp_packet(*src, *dst, uint16_t(port), text + std::string(pad, 'x'), df);
    auto r = nh.send_via_kernel(pkt.data(), pkt.size());
    return r ? "sent" : "error " + r.error().message;
}

// The MACs a device takes frames for, from the device list NextHops keeps, and how many
// times it listed the devices whole; or those of a list read now ("dump").
std::string macs(NextHops &nh, const std::string &ifname, bool dump)
{
    nh.poll();
    uint32_t ifindex = if_nametoindex(ifname.c_str());
    if (!ifindex)
        return "error no device '" + ifname + "'";
    std::vector<rtnl::Link> dumped;
    const std::vector<rtnl::Link> *links = &dumped;
    int err = 0;
    if (dump) {
        rtnl::Requests rq;
        err = rq.open(1) ? rtnl::dump_links(rq, dumped) : rtnl::Requests::kSocketError;
    } else {
        links = nh.links(err);
    }
    if (err)
        return "error listing the devices: " + std::to_string(err);
    std::string out = "macs";
    const char *sep = " ";
    for (const auto &m : rtnl::accepted_macs(*links, ifindex).macs) {
        out += sep + rtnl::mac_str(m);
        sep = ",";
    }
    return dump ? out : out + " lists=" + std::to_string(nh.stats().link_lists);
}

// The device list NextHops keeps against one read now, device by device: "match N", or the
// first difference.
std::string links_match(NextHops &nh)
{
    nh.poll();
    int err = 0;
    const std::vector<rtnl::Link> *kept = nh.links(err);
    std::vector<rtnl::Link> now;
    rtnl::Requests rq;
    if (!kept || !rq.open(1) || rtnl::dump_links(rq, now) != 0)
        return "error listing the devices";
    for (const auto &n : now) {
        auto k = std::find_if(kept->begin(), kept->end(),
                              [&](const rtnl::Link &l) { return l.ifindex == n.ifindex; });
        std::string at = "differ " + std::to_string(n.ifindex) + " ";
        if (k == kept->end())
            return at + "missing";
        if ((k->flags & IFF_UP) != (n.flags & IFF_UP))
            return at + "up";
        if (k->ether != n.ether || k->mac != n.mac)
            return at + "mac";
        if (k->master != n.master)
            return at + "master";
        if (k->lower != n.lower)
            return at + "lower";
        if (k->kind != n.kind)
            return at + "kind";
        if (k->name != n.name)
            return at + "name";
    }
    if (kept->size() != now.size())
        return "differ " + std::to_string(kept->size()) + " kept, " + std::to_string(now.size()) +
               " now";
    return "match " + std::to_string(now.size());
}

// `watch DEV... [names NAME...]`: the devices (by name, here now) and the names to watch.
std::string watch(NextHops &nh, std::istringstream &in)
{
    std::vector<uint32_t> ifindexes;
    std::vector<std::string> names;
    std::string w;
    bool by_name = false;
    while (in >> w) {
        if (w == "names") {
            by_name = true;
        } else if (by_name) {
            names.push_back(w);
        } else {
            uint32_t ifindex = if_nametoindex(w.c_str());
            if (!ifindex)
                return "error no device '" + w + "'";
            ifindexes.push_back(ifindex);
        }
    }
    nh.watch_links(std::move(ifindexes), std::move(names));
    return "watching";
}

// What the events since the last look said of the watched devices, the addresses and the
// broadcast routes: "gone [IFINDEX...] changed=0|1 urgent=0|1 unknown=0|1 addrs=0|1 brd=0|1".
std::string gone(NextHops &nh)
{
    nh.poll();
    bool unknown = false;
    std::string out = "gone";
    for (uint32_t ifindex : nh.take_links_gone(unknown))
        out += " " + std::to_string(ifindex);
    bool urgent = false;
    out += " changed=" + std::to_string(int(nh.take_link_change(&urgent)));
    out += " urgent=" + std::to_string(int(urgent)) + " unknown=" + std::to_string(int(unknown));
    out += " addrs=" + std::to_string(int(nh.take_addr_change()));
    return out + " brd=" + std::to_string(int(nh.take_broadcast_change()));
}

std::string broadcasts()
{
    rtnl::Requests rq;
    if (auto r = rq.open(1, true); !r)
        return "error " + r.error().message;
    std::vector<IpAddr> brd;
    if (int err = rtnl::dump_broadcasts(rq, brd); err)
        return "error " + std::to_string(err);
    std::string out = "broadcasts";
    for (const IpAddr &a : brd)
        out += " " + a.str();
    return out;
}

std::string stats(const NextHops &nh)
{
    const auto &s = nh.stats();
    return "stats missed=" + std::to_string(s.lookups_missed) +
           " resolved=" + std::to_string(s.resolved) + " events=" + std::to_string(s.events) +
           " sent=" + std::to_string(s.kernel_sent) +
           " send_errors=" + std::to_string(s.kernel_send_errors) +
           " probes=" + std::to_string(s.neigh_probes) + " flushes=" + std::to_string(s.flushes);
}

}  // namespace

int main(int argc, char **argv)
{
    NextHops::Options opt;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--refresh-ms")
            opt.refresh_ms = uint32_t(std::stoul(argv[i + 1]));
    }
    auto nh = NextHops::open(opt);
    if (!nh) {
        std::cerr << nh.error().message << "\n";
        return 1;
    }
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd, arg;
        in >> cmd;
        std::string out;
        if (cmd == "lookup") {
            in >> arg;
            auto a = IpAddr::parse(arg);
            out = a ? lookup(**nh, *a) : "error bad address '" + arg + "'";
        } else if (cmd == "send") {
            out = send(**nh, in);
        } else if (cmd == "macs" || cmd == "macs-dump") {
            in >> arg;
            out = macs(**nh, arg, cmd == "macs-dump");
        } else if (cmd == "watch") {
            out = watch(**nh, in);
        } else if (cmd == "gone") {
            out = gone(**nh);
        } else if (cmd == "links-match") {
            out = links_match(**nh);
        } else if (cmd == "broadcasts") {
            out = broadcasts();
        } else if (cmd == "stats") {
            out = stats(**nh);
        } else if (cmd == "quit") {
            break;
        } else {
            out = "error unknown command '" + cmd + "'";
        }
        std::cout << out << std::endl;
    }
    return 0;
}
