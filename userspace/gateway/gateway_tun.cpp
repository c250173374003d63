// Gateway, protected interfaces in tun mode (`xesp iface add DEV role protected mode tun`):
// the hosts behind DEV keep their TSO and GRO, as the kernel's own IPsec and wireguard-go's
// TUN offloads let them.
//
//   host --TSO, 64 KB--> DEV: tc ingress (xesp_tc_protected): an out policy protects it?
//        --bpf_redirect--> xesp-tun (IFF_VNET_HDR, TUNSETOFFLOAD) --read()--> take_tun():
//        cut (gso_split) into frames of the Umem --> bursts of Classified::Plain --> the
//        engine, on the data thread or the workers as any burst --> out of a public port
//   public port --XDP, AF_XDP--> the engine, decrypted --> no port of ours for its next hop
//        --> tx_tun(): held; flush_tun(): joined (Gro) --write()--> xesp-tun --> the kernel
//        forwards it to DEV, whole, and cuts it only where it must
//
//   UDP: tc ingress --hop taken, bpf_redirect--> the local link (local_link.h) --XDP,
//        AF_XDP--> the engine as in xdp mode: a burst per wakeup, not a read per datagram
//
// 1. Why not XDP. An XDP program on a veth turns its peer's GSO off: the host then sends
//    1,500-byte segments, each copied into a page for the program. A tc program on DEV sees
//    the super-packet as the host made it, and only redirects it: the TUN device hands it to
//    the gateway with a vnet header that says how to cut it and where its checksum goes.
// 2. Classification. The tc program looked the packet up in the SPD maps; the engine looks
//    each piece up again in its own tables (Classified::Plain: as plaintext only, never as
//    ESP or IKE to take in). The TUN is one for all tun-mode interfaces, as the local link is.
//    Fragments cut here (cut_tun_big(), prefragment()) are looked up with their datagram's
//    ports, so that each gets its verdict, as the kernel's one lookup of the whole datagram
//    gives. The far gateway checks what it decrypts one fragment at a time, without ports
//    (as Linux does without conntrack's defragmentation): under in/fwd policies with ports
//    it drops them. The kernel fragments the ESP packet instead, which the far end
//    reassembles before its check: a jumbo frame, which no frame holds, and NAT-T, whose
//    fragmented ESP the far end cannot reassemble (prefragment()), leave no such choice.
// 3. The tunnel's MTU. TCP is cut to what its SA carries once encrypted
//    (Engine::plain_inner_mtu: one lookup per super-packet), so that no encrypted packet is
//    fragmented; the kernel's TSO would cut to the route's MTU the same way. UDP datagrams
//    and packets not to cut are left as the sender made them: the engine answers "too big" or
//    fragments the outer packet, as in xdp mode. Those that no frame holds (jumbo frames)
//    are fragmented or answered before the engine (cut_tun_big()).
// 4. The hop. A piece is forwarded here: its TTL or hop limit goes down (and ICMP time
//    exceeded goes back) as for a packet the XDP program hands over. A decrypted packet
//    written to the TUN is the kernel's to forward: it counts that hop itself.
// 5. Fail closed. A stopped daemon clears the TUN from tun_link (set_tun_link(0)) before the
//    device goes, and the tc program drops what it would send there (drop-tun-gone). A dead
//    one leaves the device (persistent, no reader): the kernel drops what the program still
//    sends it (tun-encap; the device's tx_dropped from Linux 6.11); and no other device can
//    take its index meanwhile. One deleted by hand leaves an index no device has: the
//    program drops. Protected plaintext is never routed on in the clear.
// 6. Frames. A super-packet is cut straight into frames taken from the pool; the pieces wait
//    in tun_pieces_ for bursts of up to kBurst. The TUN device's gso_max_segs (kTunPieces)
//    bounds what one super-packet can make.
// 7. Joining. A flow's segments come from the far gateway's TX a few at a time, so a burst
//    holds a few of them. What is decrypted for the TUN is held while the data thread's rounds
//    keep bringing more (tx_tun()), and written joined (flush_tun()) after a round that
//    brought none, once Gro::kMaxRun packets are held or the first has waited kTunHoldNs
//    (100 us), and before the thread waits or sleeps: the kernel's GRO holds a flow while its
//    NAPI poll goes on, and up to a jiffy while the device stays busy. With one TCP stream
//    this took the segments in each write from about 8 to about 20, and the kernel's
//    forwarding and the receiver's ACKs down with them.
#include <errno.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "userspace/base/ip_header.h"
#include "userspace/base/log.h"
#include "userspace/base/wire.h"
#include "userspace/esp/fragment.h"
#include "userspace/gateway/gateway.h"
#include "userspace/gateway/local_link.h"

namespace xesp {

namespace {

// The most a piece may be: a frame after the headroom, with room for the ESP trailer.
constexpr uint32_t kPieceRoom = kFrameSize - kFrameHeadroom - kMaxEspOverheadBack;

// A sysctl of the TUN device; false if it could not be written.
bool set_conf(const std::string &path, const char *value)
{
    std::ofstream f(path);
    f << value << "\n";
    f.flush();
    return bool(f);
}

int read_conf(const std::string &path)
{
    std::ifstream f(path);
    int v = -1;
    f >> v;
    return v;
}

// Multicast no router forwards (224.0.0.0/24, ff02::/16): the TUN device's own (the kernel
// reports its IPv6 groups there when it comes up, whatever its flags), never a packet to carry.
bool link_scope_multicast(const uint8_t *ip)
{
    if (wire::ip_version(ip) == 6)
        return ip[24] == 0xff && (ip[25] & 0x0f) <= 2;
    return ip[16] == 224 && ip[17] == 0 && ip[18] == 0;
}

}  // namespace

Result<void> Gateway::attach_tun_mode(GatewayIface i)
{
    const std::string what = "iface add " + i.name;
    if (i.role != IfaceRole::Protected)
        return make_error(what + ": mode tun is for protected interfaces");
    const bool opened = !tun_;
    if (opened)
        if (auto r = open_tun(); !r)
            return make_error(what + ": " + r.error().message);
    // Its entry holds the MACs it takes frames for, before the tc program reads it; from xdp
    // mode, the XDP program's entry has them until that program is off (it would drop what it
    // hands over if parked now).
    i.macs = iface_macs(i);
    const bool entry = !prog_->has_iface(i.ifindex);
    if (entry)
        if (auto r = prog_->park_iface(i.ifindex, i.role, i.macs); !r) {
            if (opened)
                close_tun();
            return make_error(what + ": " + r.error().message);
        }
    if (auto r = prog_->attach_protected(int(i.ifindex)); !r) {
        if (entry)
            (void)prog_->remove_iface(i.ifindex);
        if (opened)
            close_tun();  // a TUN taken over stays: an earlier program may still send to it
        return make_error(what + ": " + r.error().message);
    }
    tun_->own();
    // What an earlier daemon left of xdp mode runs before the tc program: it goes once the
    // tc program is on, so that one of them always drops what is protected.
    if (XdpProgram::attached_to(int(i.ifindex)))
        if (auto r = XdpProgram::detach(int(i.ifindex)); !r)
            log(LogLevel::Warning, "%s", r.error().message.c_str());
    if (!entry)
        if (auto r = prog_->park_iface(i.ifindex, i.role, i.macs); !r) {
            log(LogLevel::Warning, "%s: %s", i.name.c_str(), r.error().message.c_str());
            i.macs.clear();  // not what the entry holds: the next look writes it again
            macs_due_ = true;
        }
    ifaces_.push_back(i);
    hops_->watch_link(i.ifindex);  // its leaving is seen from now on, not from the next look
    relink_engine();               // ICMP errors for its hosts come from its address
    log(LogLevel::Info,
        "%s: attached as protected, tun mode, MTU %u; tc ingress program, what is protected "
        "goes to %s whole",
        i.name.c_str(), i.mtu, kTunName);
    return {};
}

Result<void> Gateway::open_tun()
{
    // The device outlives a daemon that dies (kill -9): it keeps its index, which the tc
    // program still redirects to, so that no other device can take that index and receive
    // protected plaintext; the kernel drops what reaches it with nobody reading.
    auto t = Tun::create(kTunName, true);
    if (!t)
        return t.error();
    tun_drops_base_ = (*t)->existed() ? link_tx_dropped(kTunName) : 0;
    if ((*t)->existed())
        log(LogLevel::Info,
            "%s: left in place (a daemon died), taken over; it has dropped %llu "
            "packets in all",
            kTunName, (unsigned long long)tun_drops_base_);
    const std::string conf4 = std::string("/proc/sys/net/ipv4/conf/") + kTunName + "/";
    // What comes out of the tunnels enters the kernel through the TUN: its sources are the
    // far sites, which the kernel routes elsewhere (rp_filter would drop them), and the kernel
    // forwards it from there (the device's forwarding, as ip_forward sets for new ones).
    if (!set_conf(conf4 + "rp_filter", "0") || !set_conf(conf4 + "forwarding", "1"))
        return make_error(std::string(kTunName) + ": cannot set rp_filter and forwarding in " +
                          conf4);
    if (read_conf("/proc/sys/net/ipv4/conf/all/rp_filter") == 1)
        log(LogLevel::Warning,
            "%s: net.ipv4.conf.all.rp_filter is 1 (strict): the kernel drops what comes out of "
            "the tunnels through %s; set it to 0 or 2",
            kTunName, kTunName);
    if (read_conf("/proc/sys/net/ipv6/conf/all/forwarding") == 0)
        log(LogLevel::Warning,
            "%s: net.ipv6.conf.all.forwarding is 0: IPv6 out of the tunnels will not be "
            "forwarded in tun mode",
            kTunName);
    // No addresses and no multicast of its own: the kernel sends nothing into it (no MLD, no
    // link-local traffic), so all that comes out of it is what the tc program sent.
    (void)set_conf(std::string("/proc/sys/net/ipv6/conf/") + kTunName + "/addr_gen_mode", "1");
    if (int rc = link_clear_multicast((*t)->name().c_str()); rc < 0)
        log(LogLevel::Warning, "%s: multicast off: %s", kTunName, std::strerror(-rc));
    // At most kTunPieces segments in one super-packet: the kernel cuts bigger ones first.
    if (int rc = link_set_gso_max_segs((*t)->name().c_str(), uint32_t(kTunPieces)); rc < 0)
        log(LogLevel::Warning, "%s: gso_max_segs: %s", kTunName, std::strerror(-rc));
    if (int rc = link_set_up((*t)->name().c_str()); rc < 0)
        return make_error(std::string(kTunName) + ": set up: " + std::strerror(-rc), -rc);
    uint32_t ifindex = if_nametoindex(kTunName);
    if (!ifindex)
        return make_error(std::string(kTunName) + ": gone after it was made");
    if (auto r = prog_->set_tun_link(ifindex); !r)
        return r;
    tun_ = std::move(*t);
    tun_buf_.resize(Gro::kMaxLen + 1);
    tun_pieces_.reserve(kTunPieces + kBurst);
    return {};
}

// A TUN device a dead daemon left goes once no tun-mode program is left in the namespace to
// redirect to its index (the interfaces it was on were taken over in xdp mode, or handed back
// to the kernel): until then it holds that index for them (open_tun()).
void Gateway::tidy_leftover_tun()
{
    if (tun_ || !if_nametoindex(kTunName) || prog_->others_protected_attached())
        return;
    auto t = Tun::create(kTunName, true);
    if (!t) {
        log(LogLevel::Warning, "%s: left by a daemon that died: %s", kTunName,
            t.error().message.c_str());
        return;
    }
    (*t)->own();  // closing deletes it
    log(LogLevel::Info,
        "%s: left by a daemon that died, deleted: no tun-mode program is left to send to it",
        kTunName);
}

// The TUN closes once no tun-mode interface is left.
void Gateway::close_unused_tun()
{
    if (std::none_of(ifaces_.begin(), ifaces_.end(),
                     [](const GatewayIface &i) { return i.mode == IfaceMode::Tun && !i.absent; }))
        close_tun();
}

void Gateway::close_tun()
{
    if (!tun_)
        return;
    (void)prog_->set_tun_link(0);  // the tc program drops, before the device is gone
    flush_tun();
    drop_tun_frames();
    tun_queue_drops_ += tun_queue_drops();  // the device's count goes with it
    // One taken over stays while a dead daemon's program elsewhere may still redirect to it.
    if (prog_->others_protected_attached())
        tun_->keep();
    tun_.reset();
}

// What the kernel dropped at the TUN device open now because its queue was full (the daemon
// fell behind), from the device's own counter; 0 with no device, or one deleted under us.
uint64_t Gateway::tun_queue_drops() const
{
    const uint64_t n = tun_ ? link_tx_dropped(kTunName) : 0;
    return n > tun_drops_base_ ? n - tun_drops_base_ : 0;
}

// The TUN device failed (deleted under the daemon): logged and closed, so that the tc
// program drops what is protected (drop-tun-gone) and the data thread does not spin on it.
void Gateway::tun_failed(int rc)
{
    log(LogLevel::Error,
        "%s: %s; tun mode stops: its protected traffic is dropped (UDP, which takes the local "
        "link, excepted) until `xesp iface del` and `add` again",
        kTunName, std::strerror(-rc));
    count(GwCounter::TunFailed);
    close_tun();
}

// The pieces waiting for a burst (counted), and answers not sent: their frames back to the
// pool (when the Umem is closed, they go with it).
void Gateway::drop_tun_frames()
{
    auto give_back = [&](const Pkt &p) {
        uint64_t addr = uint64_t(p.frame - umem_->frame(0));
        pool_->free(&addr, 1);
    };
    count(GwCounter::TunReopen, tun_pieces_.size() - tun_next_);
    if (pool_) {
        for (size_t i = tun_next_; i < tun_pieces_.size(); i++)
            give_back(tun_pieces_[i].pkt);
        for (size_t i = 0; i < ntun_answers_; i++)
            give_back(tun_answers_[i]);
    }
    tun_pieces_.clear();
    tun_next_ = 0;
    ntun_answers_ = 0;
}

// The port tun-mode bursts are sent from (and their frames recycled through): the first
// public one; the rest is up to each packet's next hop. Found once the ports are open
// (rebuild_ports()), not each round.
Gateway::Port *Gateway::find_tun_port()
{
    for (auto &p : ports_)
        for (const auto &i : ifaces_)
            if (i.ifindex == p->ifindex && i.role == IfaceRole::Public)
                return p.get();
    return nullptr;
}

// Cuts the super-packet in tun_buf_ (len bytes, its header in tun_hdr_) into frames, after
// the pieces already waiting. False: dropped (counted).
bool Gateway::cut_tun(uint32_t len)
{
    const VnetHdr &h = tun_hdr_;
    const uint8_t *pkt = tun_buf_.data();
    const uint8_t type = h.gso_type & ~VnetHdr::kGsoEcn;
    if (type == VnetHdr::kGsoNone && len > kPieceRoom)
        return cut_tun_big(len);
    uint32_t mtu = kPieceRoom;
    if (type == VnetHdr::kGsoTcpv4 || type == VnetHdr::kGsoTcpv6)
        if (uint32_t m = engine_->plain_inner_mtu(pkt, len))
            mtu = m;
    // Frames for as many pieces as it can make: one for a packet not to cut; else its length
    // over the least a piece carries (headers of up to 120 bytes, IPv4's and TCP's longest,
    // or IPv6's options headers and TCP's longest).
    uint32_t want = 1;
    if (type != VnetHdr::kGsoNone && h.gso_size) {  // gso_size 0: refused by gso_split
        const uint32_t max_hdrs = std::max<uint32_t>(120, h.csum_start + 60u);
        const uint32_t limit = std::min(mtu, kPieceRoom);
        const uint32_t least =
            std::max(1u, std::min<uint32_t>(h.gso_size, limit > max_hdrs ? limit - max_hdrs : 1));
        want = uint32_t(std::min<size_t>(kTunPieces, len / least + 1));
    }
    uint64_t addrs[kTunPieces];
    if (!pool_->alloc_all(addrs, want)) {
        count(GwCounter::NoFrames);
        return false;
    }
    const uint32_t got = want;
    uint8_t *outs[kTunPieces];
    uint32_t lens[kTunPieces];
    for (uint32_t i = 0; i < got; i++)
        outs[i] = umem_->frame(addrs[i]) + kFrameHeadroom;
    size_t n = 0;
    GsoError e = gso_split(h, pkt, len, mtu, outs, kPieceRoom, lens, got, &n);
    pool_->free(addrs + n, got - uint32_t(n));
    switch (e) {
    case GsoError::None:
        break;
    case GsoError::TooMany:  // more pieces than kTunPieces
    case GsoError::TooBig:
        count(GwCounter::TunTooBig);
        return false;
    default:
        count(GwCounter::TunBad);
        return false;
    }
    const Classified plain{Classified::Plain};
    for (size_t i = 0; i < n; i++)
        tun_pieces_.push_back(
            {Pkt{outs[i] - kFrameHeadroom, kFrameSize, kFrameHeadroom, lens[i]}, plain});
    count(GwCounter::TunPieces, n);
    return true;
}

// A packet the TUN gave whole (no GSO) that no frame holds: a jumbo frame from a protected
// link of a larger MTU. As a router in front of a smaller link: IPv4 without DF is
// fragmented, into frames of what the tunnel carries (its checksum completed first: the
// fragments could not be); the rest (DF set, or IPv6, which only its source fragments) is
// dropped and answered with "fragmentation needed" / "packet too big" (RFC 1191, RFC 4443
// 3.2) carrying that size, so that the sender's path MTU comes down to it. The answer waits
// in tun_answers_ for take_tun() to send. False: nothing was cut (counted).
bool Gateway::cut_tun_big(uint32_t len)
{
    uint8_t *pkt = tun_buf_.data();
    IpHeader ih;
    if (!lengths_ok(parse_ip(pkt, len, &ih))) {
        count(GwCounter::TunBad);
        return false;
    }
    // What the header says, not what the frame had: padding behind it is no part of it.
    if (ih.total <= kPieceRoom)
        return cut_tun(ih.total);
    len = ih.total;
    if (link_scope_multicast(pkt)) {
        count(GwCounter::TunLinkScope);
        return false;
    }
    // The hop first, as the kernel forwards: a TTL that ends here is answered with time
    // exceeded, not "too big", and nothing is cut (its fragments would each be answered).
    if (ttl_ends(pkt)) {
        count(GwCounter::TtlExceeded);
        answer_tun_big(pkt, len, 0);
        return false;
    }
    if ((tun_hdr_.flags & VnetHdr::kNeedsCsum) && !complete_csum(tun_hdr_, pkt, len)) {
        count(GwCounter::TunBad);
        return false;
    }
    const uint32_t tunnel = engine_->plain_inner_mtu(pkt, len);
    const uint32_t mtu = tunnel ? std::min(tunnel, kPieceRoom) : kPieceRoom;
    const bool df = ih.dont_fragment;  // always for IPv6: only its source fragments it
    const uint32_t n = df ? 0 : fragments_needed(pkt, len, mtu);
    if (n > 1 && n <= kTunPieces) {
        // Its fragments are looked up with its ports, as it would have been: under a policy
        // with ports, those without them would be dropped (fragment-unclassifiable).
        const Classified cls = plain_fragments(pkt, len);
        uint64_t addrs[kTunPieces];
        if (!pool_->alloc_all(addrs, n)) {
            count(GwCounter::NoFrames);
            return false;
        }
        Pkt whole{pkt, uint32_t(tun_buf_.size()), 0, len};
        Pkt extra[kTunPieces];
        for (uint32_t i = 1; i < n; i++)
            extra[i - 1] = Pkt{umem_->frame(addrs[i]), kFrameSize};
        if (fragment(whole, mtu, 0, extra, n - 1) != n) {
            pool_->free(addrs, n);
            count(GwCounter::TunBad);
            return false;
        }
        std::memcpy(umem_->frame(addrs[0]) + kFrameHeadroom, whole.ip(), whole.len);
        tun_pieces_.push_back(
            {Pkt{umem_->frame(addrs[0]), kFrameSize, kFrameHeadroom, whole.len}, cls});
        for (uint32_t i = 1; i < n; i++)
            tun_pieces_.push_back(
                {Pkt{extra[i - 1].frame, kFrameSize, kFrameHeadroom, extra[i - 1].len}, cls});
        count(GwCounter::TunFragmented);
        count(GwCounter::TunPieces, n);
        return true;
    }
    count(GwCounter::TunTooBig);
    if (df)  // IPv4 without DF that could not be cut (too many pieces) is not answered
        answer_tun_big(pkt, len, mtu);
    return false;
}

// The answer to a packet cut_tun_big() drops, for take_tun() to send: "too big" carrying
// `mtu`, or with mtu 0 time exceeded (which counts itself and keeps to the rate limit). It
// quotes no more than an IPv6 error may carry (an IPv4 one, less).
void Gateway::answer_tun_big(const uint8_t *pkt, uint32_t len, uint32_t mtu)
{
    const EngineOptions &o = engine_->options();
    const IpAddr &from = wire::ip_version(pkt) == 4 ? o.icmp_src4 : o.icmp_src6;
    uint64_t addr;
    if (!from.family || !icmp_may_answer(pkt, len, mtu != 0))
        return;
    if (ntun_answers_ == tun_answers_.size()) {  // a round's answers: as many as its reads
        count(GwCounter::IcmpLimited);
        return;
    }
    if (pool_->alloc(&addr, 1) != 1) {
        count(GwCounter::NoFrames);
        return;
    }
    Pkt &a = tun_answers_[ntun_answers_];
    a = Pkt{umem_->frame(addr), kFrameSize, kFrameHeadroom, std::min(len, kIpv6MinMtu)};
    std::memcpy(a.ip(), pkt, a.len);
    if (!(mtu ? icmp_too_big(a, from, mtu) : time_exceeded(a))) {  // time exceeded: limited
        pool_->free(&addr, 1);
        return;
    }
    ntun_answers_++;
}

// A burst of pieces, cut from what the TUN device has (up to kBurst, the rest waits); as
// take_burst(), with the hop taken and time exceeded answered here. Returns how many.
size_t Gateway::take_tun(Port &port, Pkt *pkts, Pkt **ready, Classified *cls, bool *big)
{
    *big = false;
    // A bounded number of reads a round: what fails to be cut (no frames, bad headers) must
    // not keep the thread from the ports, whose completions give the frames back.
    const bool may_read = tun_may_read();
    for (size_t reads = 0; may_read && tun_pieces_.size() - tun_next_ < kBurst && reads < kBurst;
         reads++) {
        if (tun_next_ == tun_pieces_.size()) {
            tun_pieces_.clear();
            tun_next_ = 0;
        }
        if (tun_pieces_.size() + kTunPieces > tun_pieces_.capacity())
            break;  // a whole super-packet might not fit: the next round
        ssize_t r = tun_->read(&tun_hdr_, tun_buf_.data(), tun_buf_.size());
        if (r == -EAGAIN) {
            if (!reads)
                tun_idle_ = kTunIdleRounds;
            break;
        }
        if (r < 0 && r != -EINVAL) {  // the device's error (EBADFD: it was deleted)
            tun_failed(int(r));
            return 0;
        }
        if (r <= 0 || size_t(r) >= tun_buf_.size()) {
            count(GwCounter::TunBad);  // empty, shorter than its vnet header, or cut short
            continue;
        }
        count(GwCounter::TunRx);
        (void)cut_tun(uint32_t(r));
    }
    if (ntun_answers_) {  // "too big", from cut_tun_big()
        Pkt *answers[kBurst];
        for (size_t i = 0; i < ntun_answers_; i++)
            answers[i] = &tun_answers_[i];
        transmit(port, answers, ntun_answers_);
        ntun_answers_ = 0;
    }
    size_t n = std::min(kBurst, tun_pieces_.size() - tun_next_);
    if (!n)
        return 0;
    count(GwCounter::Rx, n);
    Pkt *answers[kBurst];
    size_t k = 0, na = 0;
    const uint32_t split = split_mtu();
    for (size_t i = 0; i < n; i++) {
        pkts[i] = tun_pieces_[tun_next_ + i].pkt;
        if (link_scope_multicast(pkts[i].ip())) {
            count(GwCounter::TunLinkScope);
            port.x.recycle(pkts[i]);
            continue;
        }
        if (!forward_hop(pkts[i])) {
            count(GwCounter::TtlExceeded);
            if (time_exceeded(pkts[i]))
                answers[na++] = &pkts[i];
            else
                port.x.recycle(pkts[i]);
            continue;
        }
        cls[k] = tun_pieces_[tun_next_ + i].cls;
        *big |= may_split(pkts[i], cls[k], split);
        ready[k++] = &pkts[i];
    }
    tun_next_ += n;
    if (na)
        transmit(port, answers, na);
    return k;
}

bool Gateway::tun_may_read()
{
    if (!tun_idle_)
        return true;
    tun_idle_--;
    return false;
}

// What the TUN device has, a burst at a time, as the ports' bursts go: on this thread, or
// prepared here and encrypted on the workers.
void Gateway::rx_tun()
{
    if (!tun_)
        return;
    Port *port = tun_port_;
    if (!port) {  // nothing to encrypt for, nowhere to send: read and count
        if (!tun_may_read())
            return;
        for (int i = 0; i < int(kBurst); i++) {
            ssize_t r = tun_->read(&tun_hdr_, tun_buf_.data(), tun_buf_.size());
            if (r == -EAGAIN) {
                if (!i)
                    tun_idle_ = kTunIdleRounds;
                break;
            }
            if (r < 0 && r != -EINVAL) {
                tun_failed(int(r));
                return;
            }
            count(GwCounter::TunNoTunnel);
        }
        return;
    }
    if (workers_) {
        BurstJob *j = next_job();
        if (!j)
            return;
        bool big;
        size_t k = take_tun(*port, j->pkts, j->ready, j->cls, &big);
        if (k)
            dispatch(*port, *j, k, big);
        return;
    }
    Pkt pkts[kBurst];
    Pkt *ready[kBurst];
    Classified cls[kBurst];
    bool big;
    size_t k = take_tun(*port, pkts, ready, cls, &big);
    if (k)
        process_here(*port, ready, cls, k, big);
}

// Decrypted packets for the kernel to forward, through the TUN device: held (tun_held_), to
// be written by flush_tun() with those the next rounds bring.
void Gateway::tx_tun(Pkt *const *pkts, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!ntun_held_)
            tun_held_since_ = now_ns();
        tun_held_[ntun_held_++] = *pkts[i];
        if (ntun_held_ == tun_held_.size())
            flush_tun();
    }
    tun_added_ += n;
}

// The held packets written: the segments of a TCP flow that follow each other joined into one
// (Gro), and the datagrams of a UDP flow where the device takes USO, each written with its
// vnet header; then every frame goes back to the pool, written or not (drop-tun-write).
void Gateway::flush_tun()
{
    const size_t k = ntun_held_;
    if (!k)
        return;
    ntun_held_ = 0;
    const uint8_t *ips[Gro::kMaxRun];
    uint32_t lens[Gro::kMaxRun];
    uint16_t run_of[Gro::kMaxRun];
    uint64_t addrs[Gro::kMaxRun];
    for (size_t i = 0; i < k; i++) {
        ips[i] = tun_held_[i].ip();
        lens[i] = tun_held_[i].len;
        addrs[i] = uint64_t(tun_held_[i].frame - umem_->frame(0));
    }
    Gro::plan(ips, lens, k, tun_ && tun_->uso(), run_of);
    for (size_t i = 0; i < k; i++) {
        if (run_of[i] != i)
            continue;
        // The run's headers made anew, its payloads written from their frames (a packet
        // alone: itself, one piece).
        uint8_t hdr[Gro::kMaxHdrs];
        iovec pieces[Gro::kMaxRun + 1];
        size_t npieces;
        VnetHdr h;
        Gro::gather(ips, lens, k, run_of, i, hdr, pieces, &npieces, &h);
        const size_t segs = npieces == 1 ? 1 : npieces - 1;
        // No device: close_tun() writes the hold first, so never here.
        const int rc = tun_ ? tun_->write(h, pieces, npieces) : -ENODEV;
        if (rc < 0) {
            count(GwCounter::TunWriteError, segs);
            continue;
        }
        count(GwCounter::TunTx);
        count(GwCounter::TunJoined, segs - 1);
    }
    pool_->free(addrs, uint32_t(k));
}

}  // namespace xesp
