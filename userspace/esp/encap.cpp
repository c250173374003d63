#include "userspace/esp/esp.h"

#include <openssl/rand.h>

#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

namespace {

// The outer header template, copied with fixed sizes: a variable-length memcpy becomes a
// `rep movs` whose start-up cost is a good part of a small packet's budget.
inline void copy_outer(uint8_t *dst, const Sa &sa)
{
    const uint8_t *t = sa.outer_template();
    switch (sa.outer_len()) {
    case kIpv4Len:
        std::memcpy(dst, t, kIpv4Len);
        break;
    case kIpv4Len + kUdpLen:
        std::memcpy(dst, t, kIpv4Len + kUdpLen);
        break;
    case kIpv6Len:
        std::memcpy(dst, t, kIpv6Len);
        break;
    default:
        std::memcpy(dst, t, kIpv6Len + kUdpLen);
        break;
    }
}

// The IP header of a plaintext packet, checked as far as the mode needs it: the lengths, and
// for transport mode the IPv6 extension headers ESP goes behind (h->chain_len).
bool parse_plain(const uint8_t *ip, uint32_t len, bool transport, IpHeader *h)
{
    IpParse st = parse_ip(ip, len, h);
    return transport ? chain_ok(st) : lengths_ok(st);
}

void set_ip_total(uint8_t *ip, uint32_t total)
{
    if (ip_version(ip) == 4) {
        put16(ip + 2, uint16_t(total));
        ipv4_set_checksum(ip);
    } else {
        put16(ip + 4, uint16_t(total - kIpv6Len));
    }
}

// UDP over IPv6 must carry a checksum (RFC 8200 8.1); it covers the ciphertext, so it is
// computed after encryption. Over IPv4 NAT-T sends zero (RFC 3948 2.1).
void udp6_checksum(uint8_t *ip, uint8_t *udp, uint32_t udp_len)
{
    uint32_t sum = csum_add(0, ip + 8, 32);
    sum += udp_len + kProtoUdp;
    put16(udp + 6, 0);
    sum = csum_add(sum, udp, udp_len);
    uint16_t c = uint16_t(~csum_fold(sum));
    put16(udp + 6, c ? c : 0xffff);
}

// Plaintext + padding + trailer (RFC 4303 2.4, 2.5): padding bytes 1, 2, 3, ...
uint32_t write_trailer(uint8_t *end, uint32_t plain_len, uint8_t block, uint8_t next_header)
{
    // block is 4 or 16: a power of two
    uint32_t padded = (plain_len + kEspTrailerLen + block - 1) & ~uint32_t(block - 1);
    uint32_t pad = padded - plain_len - kEspTrailerLen;
    for (uint32_t i = 0; i < pad; i++)
        end[i] = uint8_t(i + 1);
    end[pad] = uint8_t(pad);
    end[pad + 1] = next_header;
    return padded;
}

} // namespace

int ecn_decapsulate(uint8_t outer, uint8_t inner)
{
    if (outer == kEcnCe)
        return inner == kEcnNotEct ? -1 : kEcnCe;
    if (outer == kEcnEct1 && inner == kEcnEct0)
        return kEcnEct1;
    return inner;
}

void flow_from_header(const IpHeader &h, FlowKey *key)
{
    key->src = h.src();
    key->dst = h.dst();
    key->proto = h.proto;
    // Fragments are classified without ports: a non-first one has none, and every fragment
    // of a datagram must get the same treatment.
    key->fragment = h.fragment;
    key->sport = key->dport = 0;
    bool ports = h.proto == kProtoTcp || h.proto == kProtoUdp || h.proto == kProtoSctp ||
                 h.proto == kProtoUdpLite;
    if (ports && !h.fragment && h.l4_off + 4 <= h.total) {
        key->sport = get16(h.ip + h.l4_off);
        key->dport = get16(h.ip + h.l4_off + 2);
    }
}

bool parse_flow(const uint8_t *ip, uint32_t len, FlowKey *key)
{
    IpHeader h;
    if (parse_ip(ip, len, &h) != IpParse::Ok)
        return false;
    flow_from_header(h, key);
    return true;
}

// ---------------------------------------------------------------------------------------------
// Encapsulation

static bool encap_one(Sa &sa, Pkt &p, const uint8_t *iv_random, CryptoOp *op)
{
    uint8_t *ip = p.ip();
    bool transport = !sa.tunnel();
    IpHeader in;
    if (!parse_plain(ip, p.len, transport, &in)) {
        p.set_drop(Drop::OutBadInner);
        return false;
    }
    if (transport && in.version != sa.outer_family()) {
        p.set_drop(Drop::OutModeMismatch);
        return false;
    }
    // Transport mode protects whole datagrams only (RFC 4303 3.3.4): its payload is the
    // transport segment, and a fragment's would leave the receiver a piece of one, checked
    // against its policy without ports. Fragments reach us when the sender or a router on the
    // protected side split a packet; they are not reassembled here.
    if (transport && in.fragment) {
        p.set_drop(Drop::OutTransportFragment);
        return false;
    }
    uint32_t keep = transport ? in.chain_len : 0;        // IP header bytes kept in front
    uint32_t plain_len = in.total - keep;
    uint32_t udp_len = sa.natt() ? kUdpLen : 0;
    uint32_t front = (transport ? udp_len : sa.outer_len()) + kEspHdrLen + sa.iv_len();
    uint32_t max_back = sa.block() - 1 + kEspTrailerLen + sa.icv_len();
    if (p.l3 < front || p.l3 + in.total + max_back > p.frame_len) {
        p.set_drop(Drop::OutNoHeadroom);
        return false;
    }
    if (sa.over_hard(in.total)) {
        p.set_drop(Drop::OutExpired);
        return false;
    }
    uint64_t seq;
    if (!sa.next_seq(&seq)) {
        p.set_drop(sa.seq_exhausted() ? Drop::OutSeqExhausted : Drop::OutSeqUnreserved);
        return false;
    }

    uint8_t next_header;
    uint8_t *start = ip - front;
    if (transport) {
        next_header = ip[in.nh_off];
        std::memmove(start, ip, keep);
        start[in.nh_off] = sa.natt() ? kProtoUdp : kProtoEsp;
    } else {
        next_header = in.version == 4 ? kProtoIpIp : kProtoIpv6;
        copy_outer(start, sa);
    }
    uint8_t *payload = ip + keep;
    uint32_t padded = write_trailer(payload + plain_len, plain_len, sa.block(), next_header);
    uint32_t esp_len = kEspHdrLen + sa.iv_len() + padded + sa.icv_len();
    uint32_t total = front + keep + padded + sa.icv_len();
    uint8_t *outer = start;
    uint8_t *esp = payload - sa.iv_len() - kEspHdrLen;

    if (!transport) {
        // RFC 6040 normal mode: DSCP and ECN are copied from the inner header. DF is copied
        // from an IPv4 inner header (RFC 4301 8.1).
        uint8_t tos = ip_tos(ip);
        if (ip_version(outer) == 4) {
            uint16_t id = uint16_t(seq);        // unique enough per SA and SA lifetime
            uint16_t frag = in.dont_fragment ? kIpv4Df : 0;
            outer[1] = tos;
            put16(outer + 2, uint16_t(total));
            put16(outer + 4, id);
            put16(outer + 6, frag);
            // The rest of the header is the template's: add the four words that change to
            // its precomputed sum instead of reading the header back.
            uint32_t sum = sa.outer_csum_base() + (0x4500u | tos) + total + id + frag;
            put16(outer + 10, uint16_t(~csum_fold(sum)));
        } else {
            outer[0] = uint8_t(0x60 | tos >> 4);
            outer[1] = uint8_t((tos & 0x0f) << 4);
            put16(outer + 4, uint16_t(total - kIpv6Len));
        }
    } else {
        set_ip_total(outer, total);
    }
    if (sa.natt()) {
        uint8_t *udp = esp - kUdpLen;
        if (transport) {
            put16(udp, sa.config().encap->sport);
            put16(udp + 2, sa.config().encap->dport);
        }
        put16(udp + 4, uint16_t(kUdpLen + esp_len));
        put16(udp + 6, 0);
    }
    uint32_t spi = sa.spi_be();
    std::memcpy(esp, &spi, 4);
    put32(esp + 4, uint32_t(seq));
    // RFC 4106 3.1 / RFC 7634 2: the IV must never repeat for a key; the 64-bit sequence
    // number never does (next_seq() stops before it wraps). CBC needs unpredictable IVs.
    if (sa.config().xf.is_aead())
        put64(esp + kEspHdrLen, seq);
    else if (sa.iv_len())
        std::memcpy(esp + kEspHdrLen, iv_random, sa.iv_len());

    p.l3 -= front;
    p.len = total;
    *op = CryptoOp{esp, padded, uint32_t(seq >> 32), false};
    return true;
}

void esp_encap_prepare(Sa &sa, Pkt *const *pkts, size_t n, EspBurst &b)
{
    b.n = 0;
    n = n < kMaxBurst ? n : kMaxBurst;
    uint8_t ivs[kMaxBurst * 16];
    bool random_iv = !sa.config().xf.is_aead() && sa.iv_len();
    if (random_iv && RAND_bytes(ivs, int(n * sa.iv_len())) != 1) {
        for (size_t i = 0; i < n; i++)
            pkts[i]->set_drop(Drop::OutCryptoError);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *pkts[i];
        uint32_t inner_len = p.len;
        if (!encap_one(sa, p, ivs + i * sa.iv_len(), &b.ops[b.n]))
            continue;
        b.pkts[b.n] = &p;
        b.seq[b.n] = inner_len;    // finish() charges the inner length to the lifetime
        b.n++;
    }
}

void esp_encap_finish(Sa &sa, EspBurst &b)
{
    for (size_t i = 0; i < b.n; i++) {
        Pkt &p = *b.pkts[i];
        if (!b.ops[i].ok) {
            p.set_drop(Drop::OutCryptoError);
            continue;
        }
        uint8_t *ip = p.ip();
        if (sa.natt() && ip_version(ip) == 6) {
            uint8_t *udp = b.ops[i].esp - kUdpLen;
            udp6_checksum(ip, udp, uint32_t(p.len - (udp - ip)));
        }
        sa.charge(b.seq[i]);
        p.verdict = Verdict::Encrypted;
    }
}

// The three steps on this thread, kMaxBurst packets at a time.
template <class Prepare, class Crypt, class Finish>
static void run_bursts(Sa &sa, Pkt *const *pkts, size_t n, Prepare prepare, Crypt crypt,
                       Finish finish)
{
    EspBurst b;
    while (n) {
        size_t k = n < kMaxBurst ? n : kMaxBurst;
        prepare(sa, pkts, k, b);
        (sa.cipher().*crypt)(b.ops, b.n);
        finish(sa, b);
        pkts += k;
        n -= k;
    }
}

void esp_encap_burst(Sa &sa, Pkt *const *pkts, size_t n)
{
    run_bursts(sa, pkts, n, esp_encap_prepare, &SaCipher::encrypt, esp_encap_finish);
}

// ---------------------------------------------------------------------------------------------
// Decapsulation

void esp_decap_prepare(Sa &sa, Pkt *const *pkts, size_t n, EspBurst &b)
{
    b.n = 0;
    const uint32_t overhead = kEspHdrLen + sa.iv_len() + sa.icv_len();
    for (size_t i = 0; i < n && i < kMaxBurst; i++) {
        Pkt &p = *pkts[i];
        if (p.l4 + kEspHdrLen > p.len) {
            p.set_drop(Drop::InTruncated);
            continue;
        }
        uint32_t esp_len = p.len - p.l4;
        if (esp_len < overhead) {
            p.set_drop(Drop::InShortIcv);
            continue;
        }
        uint32_t payload_len = esp_len - overhead;
        if (payload_len < kEspTrailerLen || payload_len % sa.block()) {
            p.set_drop(Drop::InBadBlockSize);
            continue;
        }
        uint8_t *esp = p.ip() + p.l4;
        uint64_t seq;
        switch (sa.replay().check(get32(esp + 4), &seq)) {
        case ReplayWindow::Verdict::Ok:
            break;
        case ReplayWindow::Verdict::Replay:
            p.set_drop(Drop::InReplay);
            continue;
        case ReplayWindow::Verdict::TooOld:
            p.set_drop(Drop::InTooOld);
            continue;
        }
        if (sa.over_hard(payload_len)) {
            p.set_drop(Drop::InExpired);
            continue;
        }
        b.ops[b.n] = CryptoOp{esp, payload_len, uint32_t(seq >> 32), false};
        b.pkts[b.n] = &p;
        b.seq[b.n] = seq;
        b.n++;
    }
}

// RFC 3948 3.1.2: in transport mode a peer behind a NAT computed its TCP/UDP checksum over its
// own address (NAT-OA, the SA's `encap ... OADDR`); the packet now carries the address the NAT
// gave it. Update the checksum incrementally for that one address (RFC 1624).
static void nat_oa_fixup(uint8_t *ip, uint32_t l4_off, uint32_t len, uint8_t proto,
                         const IpAddr &oa)
{
    bool v4 = ip_version(ip) == 4;
    if (oa.family != (v4 ? 4 : 6) || (proto != kProtoTcp && proto != kProtoUdp))
        return;
    uint32_t csum_off = l4_off + (proto == kProtoTcp ? 16 : 6);
    if (csum_off + 2 > len)
        return;
    uint8_t *csum = ip + csum_off;
    if (proto == kProtoUdp && v4 && get16(csum) == 0)
        return;                         // no checksum to fix
    const uint8_t *now = ip + (v4 ? 12 : 8);
    size_t n = v4 ? 4 : 16;
    static const uint8_t unspecified[16] = {};
    if (std::memcmp(oa.b.data(), unspecified, n) == 0)   // 0.0.0.0 / ::: no NAT-OA known
        return;
    if (std::memcmp(now, oa.b.data(), n) == 0)
        return;
    uint32_t sum = uint16_t(~get16(csum));
    for (size_t i = 0; i < n; i += 2)
        sum += uint16_t(~get16(oa.b.data() + i)) + get16(now + i);
    uint16_t c = uint16_t(~csum_fold(sum));
    put16(csum, proto == kProtoUdp && c == 0 ? 0xffff : c);
}

// Tunnel mode: the inner packet is what is left of the payload; TFC padding (RFC 4303 2.7)
// after it is cut off by trusting the inner length field. Returns the inner length or 0.
static uint32_t tunnel_inner_len(const uint8_t *inner, uint32_t len, uint8_t next_header)
{
    IpHeader h;
    bool ok = lengths_ok(parse_ip(inner, len, &h));
    return ok && h.version == (next_header == kProtoIpIp ? 4 : 6) ? h.total : 0;
}

static bool decap_one(Sa &sa, Pkt &p, const CryptoOp &op, uint64_t seq)
{
    if (!op.ok) {
        p.set_drop(Drop::InIcvFail);
        return false;
    }
    // Only now, authenticated, may the packet move the window (RFC 4303 3.4.3).
    switch (sa.replay().update(seq)) {
    case ReplayWindow::Verdict::Ok:
        break;
    case ReplayWindow::Verdict::Replay:
        p.set_drop(Drop::InReplay);
        return false;
    case ReplayWindow::Verdict::TooOld:
        p.set_drop(Drop::InTooOld);
        return false;
    }
    uint8_t *payload = op.esp + kEspHdrLen + sa.iv_len();
    uint32_t pad = payload[op.payload_len - 2];
    uint8_t next_header = payload[op.payload_len - 1];
    if (pad + kEspTrailerLen > op.payload_len) {
        p.set_drop(Drop::InBadPadding);
        return false;
    }
    uint32_t plain_len = op.payload_len - kEspTrailerLen - pad;
    for (uint32_t i = 0; i < pad; i++) {
        if (payload[plain_len + i] != uint8_t(i + 1)) {
            p.set_drop(Drop::InBadPadding);
            return false;
        }
    }
    if (next_header == kProtoNone) {
        p.set_drop(Drop::InDummy);
        return false;
    }
    uint8_t *ip = p.ip();
    if (sa.tunnel()) {
        if (next_header != kProtoIpIp && next_header != kProtoIpv6) {
            p.set_drop(Drop::InBadNextHeader);
            return false;
        }
        uint32_t inner = tunnel_inner_len(payload, plain_len, next_header);
        if (!inner) {
            p.set_drop(Drop::InBadInner);
            return false;
        }
        int ecn = ecn_decapsulate(ip_tos(ip) & kEcnMask, ip_tos(payload) & kEcnMask);
        if (ecn < 0) {
            p.set_drop(Drop::InEcnDrop);
            return false;
        }
        uint8_t tos = ip_tos(payload);
        if ((tos & kEcnMask) != ecn)
            ip_set_tos(payload, uint8_t((tos & ~kEcnMask) | ecn));
        p.l3 = uint32_t(payload - p.frame);
        p.len = inner;
    } else {
        // Transport mode: the IP header (and IPv6 extension headers) moves up to the payload.
        uint32_t keep = p.l4 - (sa.natt() ? kUdpLen : 0);
        IpHeader outer;
        IpParse st = parse_ip(ip, p.len, &outer);
        if (outer.version == 6 && (!chain_ok(st) || outer.chain_len > keep)) {
            p.set_drop(Drop::InBadInner);
            return false;
        }
        uint32_t nh_off = outer.nh_off;
        uint8_t *start = payload - keep;
        std::memmove(start, ip, keep);
        start[nh_off] = next_header;
        set_ip_total(start, keep + plain_len);
        p.l3 = uint32_t(start - p.frame);
        p.len = keep + plain_len;
        if (sa.natt())
            nat_oa_fixup(start, keep, p.len, next_header, sa.config().encap->oaddr);
    }
    if (sa.config().sel) {
        FlowKey k;
        const Selector &sel = *sa.config().sel;
        if (!parse_flow(p.ip(), p.len, &k) ||
            !sel.matches(k.src, k.dst, k.proto, k.sport, k.dport)) {
            p.set_drop(Drop::InSelectorMismatch);
            return false;
        }
    }
    sa.charge(p.len);
    p.verdict = Verdict::Decrypted;
    return true;
}

void esp_decap_finish(Sa &sa, EspBurst &b)
{
    for (size_t i = 0; i < b.n; i++)
        decap_one(sa, *b.pkts[i], b.ops[i], b.seq[i]);
}

void esp_decap_burst(Sa &sa, Pkt *const *pkts, size_t n)
{
    run_bursts(sa, pkts, n, esp_decap_prepare, &SaCipher::decrypt, esp_decap_finish);
}

} // namespace xesp
