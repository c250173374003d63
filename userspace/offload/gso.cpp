#include "userspace/offload/gso.h"

#include <cstring>

#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

namespace {

constexpr uint8_t kTcpFin = 0x01, kTcpPsh = 0x08, kTcpAck = 0x10, kTcpCwr = 0x80;
constexpr size_t kTcpLen = 20;

// The pseudo-header's sum (RFC 793, RFC 8200 8.1) for an L4 segment of l4_len bytes.
uint32_t pseudo_sum(const uint8_t *ip, uint8_t proto, uint32_t l4_len)
{
    if (ip_version(ip) == 4)
        return csum_add(0, ip + 12, 8) + proto + l4_len;
    return csum_add(0, ip + 8, 32) + (l4_len >> 16) + (l4_len & 0xffff) + proto;
}

// The checksum of an L4 segment whose checksum field (at csum_at) is zero.
uint16_t l4_checksum(const uint8_t *ip, uint8_t proto, const uint8_t *l4, uint32_t l4_len)
{
    uint16_t c = uint16_t(~csum_fold(csum_add(pseudo_sum(ip, proto, l4_len), l4, l4_len)));
    return proto == kProtoUdp && c == 0 ? 0xffff : c;  // RFC 768: 0 is "none"
}

void set_ip_len(uint8_t *ip, uint32_t total)
{
    if (ip_version(ip) == 4) {
        put16(ip + 2, uint16_t(total));
        ipv4_set_checksum(ip);
    } else {
        put16(ip + 4, uint16_t(total - kIpv6Len));
    }
}

// The IP header of a packet h describes, up to l4: its L4 protocol, checked against the
// packet's length. 0: not one to cut.
uint8_t l4_proto(const uint8_t *ip, size_t len, size_t l4)
{
    if (len < kIpv4Len)
        return 0;
    if (ip_version(ip) == 4) {
        if (l4 != ipv4_hdr_len(ip) || l4 < kIpv4Len || get16(ip + 2) != len ||
            (get16(ip + 6) & (kIpv4Mf | kIpv4OffsetMask)))
            return 0;
        return ip[9];
    }
    // IPv6: hop-by-hop and destination options headers may come before L4 (a socket's
    // IPV6_HOPOPTS or IPV6_DSTOPTS), and each piece carries them as they are. Not a routing
    // header: the checksum's pseudo-header would name its last address, not the header's.
    if (ip_version(ip) != 6 || len < kIpv6Len || get16(ip + 4) != len - kIpv6Len)
        return 0;
    size_t off = kIpv6Len;
    uint8_t nh = ip[6];
    while (off < l4 && (nh == kProtoIpv6HopByHop || nh == kProtoIpv6Opts) && off + 8 <= len) {
        nh = ip[off];
        off += (size_t(ip[off + 1]) + 1) * 8;
    }
    return off == l4 ? nh : 0;
}

}  // namespace

bool complete_csum(const VnetHdr &h, uint8_t *pkt, size_t len)
{
    if (h.csum_start >= len || h.csum_offset + 2u > len - h.csum_start)
        return false;
    uint16_t c = uint16_t(~csum_fold(csum_add(0, pkt + h.csum_start, len - h.csum_start)));
    put16(pkt + h.csum_start + h.csum_offset, c ? c : 0xffff);
    return true;
}

GsoError gso_split(const VnetHdr &h, const uint8_t *pkt, size_t len, uint32_t inner_mtu,
                   uint8_t *const *out, uint32_t room, uint32_t *out_len, size_t max_out, size_t *n)
{
    *n = 0;
    const uint8_t type = h.gso_type & ~VnetHdr::kGsoEcn;
    const bool csum = h.flags & VnetHdr::kNeedsCsum;
    if (csum && (h.csum_start >= len || h.csum_offset + 2u > len - h.csum_start))
        return GsoError::BadHeader;
    if (type == VnetHdr::kGsoNone) {
        if (max_out < 1)
            return GsoError::TooMany;
        if (len > room || len > inner_mtu)
            return GsoError::TooBig;
        std::memcpy(out[0], pkt, len);
        if (csum)
            (void)complete_csum(h, out[0], len);  // its offsets were checked above
        out_len[0] = uint32_t(len);
        *n = 1;
        return GsoError::None;
    }
    if (!csum || h.gso_size == 0 ||
        (type != VnetHdr::kGsoTcpv4 && type != VnetHdr::kGsoTcpv6 && type != VnetHdr::kGsoUdpL4))
        return GsoError::BadHeader;
    const size_t l4 = h.csum_start;
    const uint8_t proto = l4_proto(pkt, len, l4);
    const bool tcp = type != VnetHdr::kGsoUdpL4;
    if (proto != (tcp ? kProtoTcp : kProtoUdp) ||
        (tcp && (type == VnetHdr::kGsoTcpv4) != (ip_version(pkt) == 4)))
        return GsoError::BadPacket;
    size_t hdrs;
    if (tcp) {
        if (l4 + kTcpLen > len)
            return GsoError::BadPacket;
        hdrs = l4 + size_t(pkt[l4 + 12] >> 4) * 4;
        if (hdrs < l4 + kTcpLen || hdrs > len || h.csum_offset != 16)
            return GsoError::BadPacket;
    } else {
        hdrs = l4 + kUdpLen;
        if (hdrs > len || h.csum_offset != 6)
            return GsoError::BadPacket;
    }
    const size_t limit = inner_mtu < room ? inner_mtu : room;
    if (hdrs >= limit)
        return GsoError::TooBig;
    size_t seg = h.gso_size;
    // IPv4 without DF: the host gave its segments the ids id to id + n - 1 and its next
    // packet id + n. More pieces would take that packet's ids, which its fragments on the way
    // would share (RFC 6864 4.1). So they are cut as the host planned, if a frame holds them,
    // and are fragmented further on, as a router would.
    const bool keep_ids = ip_version(pkt) == 4 && !(get16(pkt + 6) & kIpv4Df);
    if (hdrs + seg > limit && !(tcp && keep_ids && hdrs + seg <= room)) {
        if (!tcp)
            return GsoError::TooBig;
        seg = limit - hdrs;
    }
    const size_t payload = len - hdrs;
    const size_t pieces = payload ? (payload + seg - 1) / seg : 1;
    if (pieces > max_out)
        return GsoError::TooMany;

    const uint16_t id = ip_version(pkt) == 4 ? get16(pkt + 4) : 0;
    const uint32_t seq = tcp ? get32(pkt + l4 + 4) : 0;
    const uint8_t flags = tcp ? pkt[l4 + 13] : 0;
    for (size_t i = 0; i < pieces; i++) {
        const size_t off = i * seg;
        const size_t part = payload - off < seg ? payload - off : seg;
        uint8_t *o = out[i];
        std::memcpy(o, pkt, hdrs);
        std::memcpy(o + hdrs, pkt + hdrs + off, part);
        const uint32_t total = uint32_t(hdrs + part);
        if (ip_version(o) == 4)
            put16(o + 4, uint16_t(id + i));
        set_ip_len(o, total);
        uint8_t *l4h = o + l4;
        if (tcp) {
            put32(l4h + 4, uint32_t(seq + off));
            uint8_t f = flags;
            if (i != 0)
                f &= uint8_t(~kTcpCwr);
            if (i + 1 != pieces)
                f &= uint8_t(~(kTcpFin | kTcpPsh));
            l4h[13] = f;
            put16(l4h + 16, 0);
            put16(l4h + 16, l4_checksum(o, kProtoTcp, l4h, uint32_t(total - l4)));
        } else {
            put16(l4h + 4, uint16_t(kUdpLen + part));
            put16(l4h + 6, 0);
            put16(l4h + 6, l4_checksum(o, kProtoUdp, l4h, uint32_t(total - l4)));
        }
        out_len[i] = total;
    }
    *n = pieces;
    return GsoError::None;
}

namespace {

// A TCP segment or UDP datagram that GRO may join, read from its headers.
struct Seg {
    uint32_t l4 = 0;    // offset of the TCP or UDP header
    uint32_t hdrs = 0;  // of the payload
    uint32_t payload = 0;
    uint32_t seq = 0;  // TCP
    uint8_t flags = 0;
    uint8_t proto = 0;  // kProtoTcp or kProtoUdp
};

// Whether p (len bytes) is a TCP segment (or, with udp, a UDP datagram) GRO may join, and its
// fields.
bool gro_seg(const uint8_t *p, uint32_t len, bool udp, Seg *s)
{
    if (len < kIpv4Len)
        return false;
    if (ip_version(p) == 4) {
        // No options, not a fragment, the length exact, the header's checksum right (as
        // inet_gro_receive: the joined packet's is made anew, which would hide a bad one).
        if (p[0] != 0x45 || get16(p + 2) != len || (get16(p + 6) & (kIpv4Mf | kIpv4OffsetMask)) ||
            csum_fold(csum_add(0, p, kIpv4Len)) != 0xffff)
            return false;
        s->proto = p[9];
        s->l4 = kIpv4Len;
    } else {
        if (ip_version(p) != 6 || len < kIpv6Len || get16(p + 4) != len - kIpv6Len)
            return false;
        s->proto = p[6];
        s->l4 = kIpv6Len;
    }
    if (s->proto == kProtoUdp && udp) {
        // The UDP length exact (nothing after the datagram), something in it, and a checksum:
        // the kernel's udp_gro_receive_segment joins none without one, as its USO makes one.
        s->hdrs = s->l4 + kUdpLen;
        if (s->hdrs >= len || get16(p + s->l4 + 4) != len - s->l4 || get16(p + s->l4 + 6) == 0)
            return false;
        s->payload = len - s->hdrs;
        s->seq = 0;
        s->flags = 0;
        return true;
    }
    if (s->proto != kProtoTcp || s->l4 + kTcpLen > len)
        return false;
    const uint8_t *t = p + s->l4;
    s->hdrs = s->l4 + uint32_t(t[12] >> 4) * 4;
    if (s->hdrs < s->l4 + kTcpLen || s->hdrs > len)
        return false;
    s->payload = len - s->hdrs;
    s->seq = get32(t + 4);
    s->flags = t[13];
    // ACK, and PSH on the last of a run; nothing else.
    return s->payload && (s->flags & ~kTcpPsh) == kTcpAck;
}

// Whether b may follow a in one packet, but for the sequence numbers and sizes: the same IP
// header but for the length, id and checksum (IPv4) or payload length (IPv6); the same ports,
// and for TCP the same acknowledgement, window and options.
bool same_flow(const uint8_t *a, const Seg &sa, const uint8_t *b, const Seg &sb)
{
    if (sa.hdrs != sb.hdrs || sa.l4 != sb.l4 || sa.proto != sb.proto)
        return false;
    if (ip_version(a) != ip_version(b))
        return false;
    if (ip_version(a) == 4) {
        // version/IHL, TOS; flags (DF); TTL, protocol; addresses
        if (std::memcmp(a, b, 2) != 0 || (a[6] & 0xe0) != (b[6] & 0xe0) ||
            std::memcmp(a + 8, b + 8, 2) != 0 || std::memcmp(a + 12, b + 12, 8) != 0)
            return false;
    } else {
        // version, traffic class, flow label; next header, hop limit; addresses
        if (std::memcmp(a, b, 4) != 0 || std::memcmp(a + 6, b + 6, 34) != 0)
            return false;
    }
    const uint8_t *ta = a + sa.l4, *tb = b + sb.l4;
    if (sa.proto == kProtoUdp)
        return std::memcmp(ta, tb, 4) == 0;  // ports
    // ports; acknowledgement; data offset; window; urgent pointer and options
    return std::memcmp(ta, tb, 4) == 0 && std::memcmp(ta + 8, tb + 8, 5) == 0 &&
           std::memcmp(ta + 14, tb + 14, 2) == 0 &&
           std::memcmp(ta + 18, tb + 18, sa.hdrs - sa.l4 - 18) == 0;
}

bool checksum_ok(const uint8_t *p, uint32_t len, const Seg &s)
{
    return csum_fold(csum_add(pseudo_sum(p, s.proto, len - s.l4), p + s.l4, len - s.l4)) == 0xffff;
}

// Whether b's IPv4 id may follow in the run that starts with a (count packets so far, its ids
// fixed or not), as inet_gro_flush (include/net/gro.h) has it: the first's id plus count
// (incrementing), or the first's (fixed: DF set, decided by the second packet). *fixed: what
// the run is with b in it. IPv6 has no id.
bool id_follows(const uint8_t *a, const uint8_t *b, size_t count, bool *fixed)
{
    if (ip_version(a) != 4)
        return true;
    const uint16_t offset = uint16_t(get16(b + 4) - get16(a + 4));
    *fixed = *fixed || (count == 1 && (get16(b + 6) & kIpv4Df) && offset == 0);
    return offset == (*fixed ? 0 : uint16_t(count));
}

// Whether b is of the connection whose run starts with a (its fields sa): the same addresses,
// and for a segment (seg: its fields) the same ports too. A packet of the connection that may
// not join the run ends it: nothing of the connection may pass another.
bool same_conn(const uint8_t *a, const Seg &sa, const uint8_t *b, uint32_t len, const Seg *seg)
{
    if (len < 1 || ip_version(a) != ip_version(b))
        return false;
    const bool v4 = ip_version(a) == 4;
    const size_t at = v4 ? 12 : 8, n = v4 ? 8 : 32;
    if (len < at + n || std::memcmp(a + at, b + at, n) != 0)
        return false;
    return !seg || std::memcmp(a + sa.l4, b + seg->l4, 4) == 0;
}

}  // namespace

void Gro::plan(const uint8_t *const *pkts, const uint32_t *lens, size_t n, bool udp,
               uint16_t *run_of)
{
    // The runs still open: each its first packet, its last, the next sequence number, and
    // its length so far.
    struct Open {
        size_t first, last;
        Seg head;
        uint32_t next_seq;
        size_t total, count;
        bool checked;   // the first's checksum
        bool fixed_id;  // IPv4: every packet the first's id (DF), not the first's plus its index
    };
    Open open[kMaxRun];
    size_t nopen = 0;
    for (size_t i = 0; i < n; i++) {
        run_of[i] = uint16_t(i);
        Seg s;
        const bool seg = gro_seg(pkts[i], lens[i], udp, &s);
        if (!seg) {
            // Not to join: it ends every run between its addresses (whatever its ports: it
            // may be of any of them).
            for (size_t o = 0; o < nopen;) {
                if (same_conn(pkts[open[o].first], open[o].head, pkts[i], lens[i], nullptr))
                    open[o] = open[--nopen];
                else
                    o++;
            }
            continue;
        }
        size_t o = 0;
        while (o < nopen && !same_conn(pkts[open[o].first], open[o].head, pkts[i], lens[i], &s))
            o++;
        if (o < nopen) {
            Open &r = open[o];
            bool fixed_id = r.fixed_id;
            const bool tcp = r.head.proto == kProtoTcp;
            bool join =
                same_flow(pkts[r.first], r.head, pkts[i], s) && (!tcp || s.seq == r.next_seq) &&
                id_follows(pkts[r.first], pkts[i], r.count, &fixed_id) &&
                s.payload <= r.head.payload && lens[r.last] - r.head.hdrs == r.head.payload &&
                !(tcp && (pkts[r.last][r.head.l4 + 13] & kTcpPsh)) &&
                r.total + s.payload <= kMaxLen && r.count < kMaxRun;
            if (join && !r.checked) {
                r.checked = true;
                join = checksum_ok(pkts[r.first], lens[r.first], r.head);
            }
            if (join && checksum_ok(pkts[i], lens[i], s)) {
                run_of[i] = uint16_t(r.first);
                r.last = i;
                r.next_seq = s.seq + s.payload;
                r.total += s.payload;
                r.count++;
                r.fixed_id = fixed_id;
                continue;
            }
            open[o] = open[--nopen];  // the run ends here
        }
        if (nopen < kMaxRun)
            open[nopen++] = Open{i, i, s, s.seq + s.payload, lens[i], 1, false, false};
    }
}

uint32_t Gro::gather(const uint8_t *const *pkts, const uint32_t *lens, size_t n,
                     const uint16_t *run_of, size_t first, uint8_t *hdr, iovec *iov, size_t *niov,
                     VnetHdr *h)
{
    *h = VnetHdr{};
    Seg s;
    size_t count = 0;
    for (size_t i = first; i < n; i++)
        count += run_of[i] == first;
    // gro_seg() takes neither IPv4 options nor IPv6 extension headers: the headers fit hdr.
    static_assert(kIpv6Len + 60 <= kMaxHdrs);
    if (count < 2 || !gro_seg(pkts[first], lens[first], true, &s)) {
        iov[0] = {const_cast<uint8_t *>(pkts[first]), lens[first]};
        *niov = 1;
        return lens[first];
    }
    const bool tcp = s.proto == kProtoTcp;
    std::memcpy(hdr, pkts[first], s.hdrs);
    iov[0] = {hdr, s.hdrs};
    size_t k = 1;
    uint32_t total = s.hdrs;
    uint8_t psh = 0;
    for (size_t i = first; i < n; i++) {
        if (run_of[i] != first)
            continue;
        iov[k++] = {const_cast<uint8_t *>(pkts[i] + s.hdrs), lens[i] - s.hdrs};
        total += lens[i] - s.hdrs;
        if (tcp)
            psh = pkts[i][s.l4 + 13] & kTcpPsh;
    }
    *niov = k;
    set_ip_len(hdr, total);
    uint8_t *l4h = hdr + s.l4;
    // Partial: the pseudo-header's sum in place, the rest the kernel's to add. UDP: the length
    // is the whole run's, which the kernel's USO takes each datagram's from (__udp_gso_segment).
    const uint32_t l4len = total - s.l4;
    h->flags = VnetHdr::kNeedsCsum;
    h->hdr_len = uint16_t(s.hdrs);
    h->gso_size = uint16_t(s.payload);
    h->csum_start = uint16_t(s.l4);
    if (tcp) {
        l4h[13] = uint8_t(l4h[13] | psh);
        put16(l4h + 16, csum_fold(pseudo_sum(hdr, kProtoTcp, l4len)));
        h->gso_type = ip_version(hdr) == 4 ? VnetHdr::kGsoTcpv4 : VnetHdr::kGsoTcpv6;
        h->csum_offset = 16;
    } else {
        put16(l4h + 4, uint16_t(l4len));
        put16(l4h + 6, csum_fold(pseudo_sum(hdr, kProtoUdp, l4len)));
        h->gso_type = VnetHdr::kGsoUdpL4;
        h->csum_offset = 6;
    }
    return total;
}

uint32_t Gro::write(const uint8_t *const *pkts, const uint32_t *lens, size_t n,
                    const uint16_t *run_of, size_t first, uint8_t *out, VnetHdr *h)
{
    uint8_t hdr[kMaxHdrs];
    iovec iov[kMaxRun + 1];
    size_t niov;
    const uint32_t total = gather(pkts, lens, n, run_of, first, hdr, iov, &niov, h);
    uint32_t at = 0;
    for (size_t i = 0; i < niov; i++) {
        std::memcpy(out + at, iov[i].iov_base, iov[i].iov_len);
        at += uint32_t(iov[i].iov_len);
    }
    return total;
}

}  // namespace xesp
