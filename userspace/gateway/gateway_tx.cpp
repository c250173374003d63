// The transmit side: after the engine, each packet of a burst is sorted once by where it
// goes next (VPP's next nodes): back to the pool, to the kernel, to the engine again as an
// ICMP answer, or out of a port through its next hop; then each list is handled as a whole.
#include <algorithm>
#include <cstring>

#include "userspace/esp/fragment.h"
#include "userspace/gateway/gateway.h"
#include "userspace/base/ip_header.h"
#include "userspace/base/wire.h"

namespace xesp {

// A router's hop on a packet it forwards (RFC 1812 5.3.1, RFC 8200 3): the TTL or hop limit
// goes down by one, the IPv4 checksum follows incrementally (RFC 1624); false when it would
// reach zero and the packet must not go on. Plaintext is counted before it is encrypted and
// after it is decrypted, as the kernel's forward path does around xfrm.
bool Gateway::forward_hop(Pkt &p)
{
    uint8_t *ip = p.ip();
    if (wire::ip_version(ip) == 6) {
        if (ip[7] <= 1)
            return false;
        ip[7]--;
        return true;
    }
    if (ip[8] <= 1)
        return false;
    ip[8]--;
    uint32_t sum = uint32_t(ip[10]) << 8 | ip[11];
    sum += 0x0100;  // ~(TTL << 8) went up by 0x0100
    sum = (sum & 0xffff) + (sum >> 16);
    ip[10] = uint8_t(sum >> 8);
    ip[11] = uint8_t(sum);
    return true;
}

// Whether forward_hop() would refuse p: its TTL or hop limit ends at this hop.
bool Gateway::ttl_ends(const uint8_t *ip)
{
    return (wire::ip_version(ip) == 6 ? ip[7] : ip[8]) <= 1;
}

// p's TTL ran out at this hop: p becomes the ICMP time exceeded for its sender, from the
// gateway's address on the protected side, if one may be sent and the rate limit allows it.
bool Gateway::time_exceeded(Pkt &p)
{
    const EngineOptions &o = engine_->options();
    const IpAddr &from = wire::ip_version(p.ip()) == 6 ? o.icmp_src6 : o.icmp_src4;
    switch (icmp_time_exceeded(p, from, icmp_limit_, now_ns())) {
    case IcmpAnswer::Sent:
        count(GwCounter::TimeExceeded);
        return true;
    case IcmpAnswer::Limited:
        count(GwCounter::IcmpLimited);
        return false;
    case IcmpAnswer::Refused:
        break;
    }
    return false;
}

Gateway::Port *Gateway::tx_port(uint32_t ifindex, uint32_t queue)
{
    Port *any = nullptr;
    for (auto &p : ports_) {
        if (p->ifindex != ifindex)
            continue;
        if (p->x.queue() == queue)
            return p.get();
        if (!any)
            any = p.get();
    }
    return any;
}

// A copy to the kernel's routing (a raw socket); the frame goes back to the pool.
void Gateway::to_kernel(Port &rx, Pkt &p)
{
    count(hops_->send_via_kernel(p.ip(), p.len) ? GwCounter::TxKernel : GwCounter::TxKernelError);
    rx.x.recycle(p);
}

// Whether ip goes to one of the gateway's broadcast addresses (the limited broadcast among
// them): the kernel takes each for itself, and forwards none.
bool Gateway::decrypted_broadcast(const uint8_t *ip) const
{
    return wire::ip_version(ip) == 4 &&
           std::binary_search(broadcasts_.begin(), broadcasts_.end(), ip_dst(ip));
}

// Whether ip goes to a multicast group: the kernel delivers it to the gateway's own members
// of the group and, with no multicast router, forwards it to no one.
bool Gateway::decrypted_multicast(const uint8_t *ip)
{
    return wire::ip_version(ip) == 6 ? ip[24] == 0xff : (ip[16] >> 4) == 0xe;
}

// One pass over the burst: the verdict, the TTL of what was decrypted, the ICMP rate limit
// and the next hop decide each packet's list.
void Gateway::sort_tx(Port &rx, Pkt *const *pkts, size_t n, TxLists &l)
{
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *pkts[i];
        if (p.verdict == Verdict::Drop) {
            l.recycle[l.nrecycle++] = &p;
            continue;
        }
        const L2Hop *hop = nullptr;
        Port *out = nullptr;
        if (p.verdict != Verdict::Pass) {  // Pass: a bypass policy, the kernel forwards it
            hop = hops_->lookup(ip_dst(p.ip()));
            out = hop ? tx_port(hop->ifindex, rx.x.queue()) : nullptr;
        }
        if (p.verdict == Verdict::Decrypted) {
            // To a broadcast address of the gateway's: the kernel delivers such a packet to
            // itself and forwards it to no one (directed broadcasts, RFC 2644; Linux's
            // bc_forwarding off), but handed to it through the raw socket it would broadcast
            // it on the link. The TUN device hands it to the kernel's input, which does the
            // former.
            // The same for a multicast group: through the raw socket the kernel would send
            // it onto a link, as if the gateway had made it.
            if (!out && !tun_ && decrypted_broadcast(p.ip())) {
                count(GwCounter::DecryptedBroadcast);
                l.recycle[l.nrecycle++] = &p;
                continue;
            }
            if (!tun_ && decrypted_multicast(p.ip())) {  // whatever its hop, should it have one
                count(GwCounter::DecryptedMulticast);
                l.recycle[l.nrecycle++] = &p;
                continue;
            }
            // For a tun-mode interface, or the kernel's: its forwarding takes the hop, we
            // answer where the TTL runs out, as for the rest. A broadcast or a multicast
            // takes no hop here: the kernel delivers it to the gateway (a routing protocol
            // over the tunnel sends with TTL 1), and no ICMP error answers either.
            const bool via_tun = !out && tun_;
            if ((via_tun && (!ttl_ends(p) || decrypted_broadcast(p.ip()))) ||
                (tun_ && decrypted_multicast(p.ip()))) {
                l.tun[l.ntun++] = &p;
                continue;
            }
            if (!forward_hop(p)) {
                count(GwCounter::TtlExceeded);
                if (time_exceeded(p))
                    l.answers[l.nanswers++] = &p;
                else
                    l.recycle[l.nrecycle++] = &p;
                continue;
            }
        }
        if (!out) {  // bypass, unresolved, local, or not one of ours
            l.kernel[l.nkernel++] = &p;
            continue;
        }
        l.out[l.nout] = {&p, hop, out};
        l.nout++;
    }
}

// p, or its fragments when it is too big for the hop's link and may be fragmented, with the
// Ethernet header written, into its port's queue. False: nothing was queued (counted), and p
// is the caller's to recycle.
bool Gateway::queue_out(Port &rx, Pkt &p, const L2Hop &hop, Port &out)
{
    Pkt parts[8];
    uint32_t nparts = 1;
    parts[0] = p;
    if (p.len > hop.mtu) {
        uint32_t need = fragments_needed(p.ip(), p.len, hop.mtu);
        uint64_t addrs[7];
        if (need < 2 || need > 8) {
            count(GwCounter::TxTooBig);
            return false;
        }
        if (!pool_->alloc_all(addrs, need - 1)) {
            count(GwCounter::NoFrames);
            return false;
        }
        for (uint32_t f = 1; f < need; f++)
            parts[f] = Pkt{umem_->frame(addrs[f - 1]), kFrameSize, 0, 0};
        nparts = fragment(parts[0], hop.mtu, ++frag_ident_, parts + 1, need - 1);
        if (nparts != need) {
            pool_->free(addrs, need - 1);
            count(GwCounter::TxTooBig);
            return false;
        }
        count(GwCounter::Fragmented);
    }
    for (uint32_t f = 0; f < nparts; f++) {
        Pkt &q = parts[f];
        if (out.txq.size() == kTxQueue) {
            count(GwCounter::TxRingFull);
            rx.x.recycle(q);
            continue;
        }
        uint8_t *eth = q.ip() - wire::kEthLen;
        std::memcpy(eth, hop.dst.data(), 6);
        std::memcpy(eth + 6, hop.src.data(), 6);
        wire::put16(eth + 12, wire::ip_version(q.ip()) == 6 ? wire::kEthIpv6 : wire::kEthIpv4);
        q.l2_len = uint16_t(wire::kEthLen);
        out.txq.push_back(q);
    }
    return true;
}

// Every port's queue onto its TX ring, in one burst each.
void Gateway::flush_ports()
{
    for (auto &port : ports_) {
        auto &q = port->txq;
        if (q.empty())
            continue;
        size_t sent = port->x.tx_burst(q.data(), q.size());
        count(GwCounter::Tx, sent);
        if (sent < q.size()) {
            count(GwCounter::TxRingFull, q.size() - sent);
            port->x.recycle(q.data() + sent, q.size() - sent);
        }
        q.clear();
    }
}

void Gateway::transmit(Port &rx, Pkt *const *pkts, size_t n)
{
    TxLists l;
    while (n) {
        size_t k = n < kTxSort ? n : kTxSort;
        l.nrecycle = l.nkernel = l.nanswers = l.ntun = l.nout = 0;
        sort_tx(rx, pkts, k, l);
        for (size_t i = 0; i < l.nout; i++)
            if (!queue_out(rx, *l.out[i].p, *l.out[i].hop, *l.out[i].port))
                l.recycle[l.nrecycle++] = l.out[i].p;
        flush_ports();
        for (size_t i = 0; i < l.nkernel; i++)
            to_kernel(rx, *l.kernel[i]);
        if (l.ntun)
            tx_tun(l.tun, l.ntun);
        for (size_t i = 0; i < l.nrecycle; i++)
            rx.x.recycle(*l.recycle[i]);
        // Time exceeded for packets that came through a tunnel goes back through it: the
        // engine encrypts it as any packet from this side (or drops it, or leaves it to the
        // kernel, as the policies say). None of these is Decrypted: one level deep at most.
        if (l.nanswers) {
            engine_here(l.answers, nullptr, l.nanswers);
            transmit(rx, l.answers, l.nanswers);
        }
        pkts += k;
        n -= k;
    }
}

}  // namespace xesp
