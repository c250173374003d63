// ESP decapsulation (RFC 4303 3.4): ICV check and decryption in place, in bursts; the replay
// window, the inner header, ECN (RFC 6040), NAT-T fixups (RFC 3948) and the SA's selector.
#include "userspace/esp/esp.h"

#include <cstring>

#include "userspace/base/wire.h"
#include "userspace/esp/esp_burst.h"

namespace xesp {

using namespace wire;
using esp_detail::run_bursts;
using esp_detail::set_ip_total;

// ---------------------------------------------------------------------------------------------
// Decapsulation

void esp_decap_prepare(Sa &sa, Pkt *const *pkts, size_t n, EspBurst &b)
{
    n = esp_detail::burst_room(pkts, n, b, Drop::InCryptoError);
    const uint32_t overhead = kEspHdrLen + sa.iv_len() + sa.icv_len();
    for (size_t i = 0; i < n; i++) {
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
        b.cipher[b.n] = &sa.cipher();
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
        return;  // no checksum to fix
    const uint8_t *now = ip + (v4 ? 12 : 8);
    size_t n = v4 ? 4 : 16;
    static const uint8_t unspecified[16] = {};
    if (std::memcmp(oa.b.data(), unspecified, n) == 0)  // 0.0.0.0 / ::: no NAT-OA known
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
        sa.window_moved();
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
    if (sa.has_selector()) {
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

void esp_decap_finish(Sa &sa, EspBurst &b, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        decap_one(sa, *b.pkts[i], b.ops[i], b.seq[i]);
}

void esp_decap_burst(Sa &sa, Pkt *const *pkts, size_t n)
{
    run_bursts(sa, pkts, n, esp_decap_prepare, &SaCipher::decrypt, esp_decap_finish);
}

}  // namespace xesp
