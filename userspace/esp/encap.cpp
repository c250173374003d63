// ESP encapsulation (RFC 4303 3.1): plaintext into ESP in place, in bursts: prepare (checks,
// sequence numbers, CBC's IVs; transport mode's headers), write (tunnel mode's headers and
// trailer, on the crypto's thread), one crypto call, finish (lifetimes; NAT-T's UDP checksum
// over IPv6).
#include "userspace/esp/esp.h"

#include <openssl/rand.h>

#include <cstring>

#include "userspace/base/wire.h"
#include "userspace/esp/esp_burst.h"

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

// The padding, bytes 1, 2, 3, ..., and the trailer behind the plaintext.
void write_trailer(uint8_t *end, uint32_t plain_len, uint32_t padded, uint8_t next_header)
{
    uint32_t pad = padded - plain_len - kEspTrailerLen;
    for (uint32_t i = 0; i < pad; i++)
        end[i] = uint8_t(i + 1);
    end[pad] = uint8_t(pad);
    end[pad + 1] = next_header;
}

// Random IVs for AES-CBC (RFC 3602 2.4: unpredictable), from a pool of the calling thread
// refilled by one RAND_bytes() call. A call per burst of one SA cost more than the packet
// (OpenSSL finds its generator and takes a lock each time), and with traffic spread over many
// SAs a burst of one SA is often one packet.
bool random_ivs(uint8_t *out, size_t n)
{
    thread_local struct {
        uint8_t bytes[4096];
        size_t used = sizeof bytes;
    } pool;
    if (n > sizeof pool.bytes)
        return RAND_bytes(out, int(n)) == 1;
    if (pool.used + n > sizeof pool.bytes) {
        if (RAND_bytes(pool.bytes, int(sizeof pool.bytes)) != 1)
            return false;
        pool.used = 0;
    }
    std::memcpy(out, pool.bytes + pool.used, n);
    pool.used += n;
    return true;
}

}  // namespace

using esp_detail::run_bursts;
using esp_detail::set_ip_total;

// ---------------------------------------------------------------------------------------------
// Encapsulation

// The ESP header, the IV, NAT-T's UDP header and the trailer, around the op's payload.
static void write_esp(const Sa &sa, const CryptoOp &op, uint32_t plain_len, uint8_t next_header,
                      const uint8_t *iv)
{
    uint8_t *esp = op.esp;
    uint8_t *payload = esp + kEspHdrLen + sa.iv_len();
    write_trailer(payload + plain_len, plain_len, op.payload_len, next_header);
    if (sa.natt()) {
        uint8_t *udp = esp - kUdpLen;
        if (!sa.tunnel()) {
            put16(udp, sa.config().encap->sport);
            put16(udp + 2, sa.config().encap->dport);
        }
        put16(udp + 4,
              uint16_t(kUdpLen + kEspHdrLen + sa.iv_len() + op.payload_len + sa.icv_len()));
        put16(udp + 6, 0);
    }
    uint32_t spi = sa.spi_be();
    std::memcpy(esp, &spi, 4);
    put32(esp + 4, op.seq_lo);
    // RFC 4106 3.1 / RFC 7634 2: the IV must never repeat for a key; the 64-bit sequence
    // number never does (next_seq() stops before it wraps). CBC needs unpredictable IVs.
    if (sa.aead())
        put64(esp + kEspHdrLen, uint64_t(op.seq_hi) << 32 | op.seq_lo);
    else if (sa.iv_len())
        std::memcpy(esp + kEspHdrLen, iv, sa.iv_len());
}

// The serial part: checks the packet and takes its sequence number (into the op); the packet's
// l3 and len become the ESP packet's. Transport mode writes its headers here too.
static bool encap_plan(Sa &sa, Pkt &p, const uint8_t *iv, CryptoOp *op)
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
    uint32_t keep = transport ? in.chain_len : 0;  // IP header bytes kept in front
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
    uint32_t padded = esp_padded_len(plain_len, sa.block());
    uint32_t total = front + keep + padded + sa.icv_len();
    *op = CryptoOp{
        ip + keep - sa.iv_len() - kEspHdrLen,         padded,       uint32_t(seq >> 32), false,
        uint8_t(padded - kEspTrailerLen - plain_len), uint32_t(seq)};
    p.l3 -= front;
    p.len = total;
    if (transport) {
        uint8_t *start = ip - front;
        uint8_t next_header = ip[in.nh_off];
        std::memmove(start, ip, keep);
        start[in.nh_off] = sa.natt() ? kProtoUdp : kProtoEsp;
        set_ip_total(start, total);
        write_esp(sa, *op, plain_len, next_header, iv);
    }
    return true;
}

// Tunnel mode's outer header, ESP header and trailer, on the crypto's thread: the lengths and
// sequence number from the op, DSCP, ECN and DF from the inner header (which prepare()
// checked).
static void encap_write_tunnel(const Sa &sa, const CryptoOp &op, const uint8_t *iv)
{
    const uint8_t *ip = op.esp + kEspHdrLen + sa.iv_len();
    const bool v4 = ip_version(ip) == 4;
    const uint32_t plain_len = op.payload_len - kEspTrailerLen - op.pad;
    const uint32_t front = sa.outer_len() + kEspHdrLen + sa.iv_len();
    const uint32_t total = front + op.payload_len + sa.icv_len();
    // RFC 6040 normal mode: DSCP and ECN are copied from the inner header. DF is copied from
    // an IPv4 inner header (RFC 4301 8.1), and always set for IPv6, which routers never cut
    // (IpHeader::dont_fragment).
    const uint8_t tos = ip_tos(ip);
    const uint16_t frag = !v4 || (get16(ip + 6) & kIpv4Df) ? kIpv4Df : 0;
    uint8_t *outer = op.esp + kEspHdrLen + sa.iv_len() - front;
    copy_outer(outer, sa);
    if (ip_version(outer) == 4) {
        uint16_t id = uint16_t(op.seq_lo);  // unique enough per SA and SA lifetime
        outer[1] = tos;
        put16(outer + 2, uint16_t(total));
        put16(outer + 4, id);
        put16(outer + 6, frag);
        // The rest of the header is the template's: add the four words that change to its
        // precomputed sum instead of reading the header back.
        uint32_t sum = sa.outer_csum_base() + (0x4500u | tos) + total + id + frag;
        put16(outer + 10, uint16_t(~csum_fold(sum)));
    } else {
        outer[0] = uint8_t(0x60 | tos >> 4);
        outer[1] = uint8_t((tos & 0x0f) << 4);
        put16(outer + 4, uint16_t(total - kIpv6Len));
    }
    write_esp(sa, op, plain_len, v4 ? kProtoIpIp : kProtoIpv6, iv);
}

void esp_encap_prepare(Sa &sa, Pkt *const *pkts, size_t n, EspBurst &b)
{
    n = esp_detail::burst_room(pkts, n, b, Drop::OutCryptoError);
    // CBC's IVs drawn here, where a failure can still drop the packets.
    bool random_iv = !sa.aead() && sa.iv_len();
    if (random_iv && n && !random_ivs(b.iv[b.n], n * sizeof b.iv[0])) {
        for (size_t i = 0; i < n; i++)
            pkts[i]->set_drop(Drop::OutCryptoError);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *pkts[i];
        uint32_t inner_len = p.len;
        if (!encap_plan(sa, p, b.iv[b.n], &b.ops[b.n]))
            continue;
        b.pkts[b.n] = &p;
        b.cipher[b.n] = &sa.cipher();
        b.seq[b.n] = inner_len;  // finish() charges the inner length to the lifetime
        b.n++;
    }
}

void esp_encap_write(const Sa &sa, EspBurst &b, size_t from, size_t to)
{
    if (sa.tunnel())
        for (size_t i = from; i < to; i++)
            encap_write_tunnel(sa, b.ops[i], b.iv[i]);
}

void esp_encap_finish(Sa &sa, EspBurst &b, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
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

void esp_encap_burst(Sa &sa, Pkt *const *pkts, size_t n)
{
    auto prepare = [](Sa &s, Pkt *const *p, size_t k, EspBurst &b) {
        esp_encap_prepare(s, p, k, b);
        esp_encap_write(s, b, 0, b.n);
    };
    run_bursts(sa, pkts, n, prepare, &SaCipher::encrypt, esp_encap_finish);
}
}  // namespace xesp
