#include "userspace/esp/fragment.h"

#include <algorithm>
#include <cstring>

#include "userspace/base/ip_header.h"
#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

namespace {

constexpr uint8_t kIpv4OptEol = 0;
constexpr uint8_t kIpv4OptNop = 1;
constexpr uint8_t kIpv4OptCopied = 0x80;

// How a packet is cut. The fragmentable part is what follows `front` (IPv4: the header with
// its options; IPv6: the unfragmentable part); fragment 0 carries first_chunk bytes of it,
// the others rest_chunk bytes, the last what is left.
struct Plan {
    bool v4;
    uint32_t total;  // the packet's length, from its header
    uint32_t front;
    uint32_t first_hdr;  // header bytes of fragment 0 (IPv6: with the Fragment header)
    uint32_t rest_hdr;   // header bytes of the others (IPv4: only the copied options)
    uint32_t first_chunk, rest_chunk;
    uint32_t count;
    uint32_t nh_off;  // IPv6: the next-header byte that comes to name the Fragment header
    uint16_t frag;    // IPv4: the packet's flags and offset field
};

// RFC 791 3.1: the options of later fragments are those with the copied flag. Packs them
// into out (if not null), padded with End of Options to a multiple of 4; returns their
// length, or -1 if an option runs past the header.
int ipv4_copied_options(const uint8_t *opt, uint32_t len, uint8_t *out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < len && opt[i] != kIpv4OptEol;) {
        if (opt[i] == kIpv4OptNop) {
            i++;
            continue;
        }
        if (i + 2 > len || opt[i + 1] < 2 || i + opt[i + 1] > len)
            return -1;
        uint32_t olen = opt[i + 1];
        if ((opt[i] & kIpv4OptCopied) && out)
            std::memcpy(out + n, opt + i, olen);
        n += (opt[i] & kIpv4OptCopied) ? olen : 0;
        i += olen;
    }
    uint32_t padded = (n + 3) & ~3u;
    if (out)
        std::memset(out + n, kIpv4OptEol, padded - n);
    return int(padded);
}

// Chunk sizes and the number of fragments once the header sizes are known.
uint32_t finish_plan(Plan *pl, uint32_t mtu)
{
    uint32_t body = pl->total - pl->front;
    pl->first_chunk = (mtu - pl->first_hdr) & ~7u;
    pl->rest_chunk = (mtu - pl->rest_hdr) & ~7u;
    pl->count = 1 + (body - pl->first_chunk + pl->rest_chunk - 1) / pl->rest_chunk;
    return pl->count;
}

uint32_t plan_ipv4(const IpHeader &h, IpParse st, uint32_t mtu, Plan *pl)
{
    if (st != IpParse::Ok)
        return 0;
    if (h.total <= mtu)
        return 1;
    int copied = ipv4_copied_options(h.ip + kIpv4Len, h.hdr_len - kIpv4Len, nullptr);
    // The offsets of the new fragments must still fit the 13-bit field.
    bool offsets_fit = h.frag_offset + (h.total - h.hdr_len) <= 0xffff;
    if (h.dont_fragment || mtu < kIpv4MinMtu || copied < 0 || !offsets_fit)
        return 0;
    uint16_t frag = get16(h.ip + 6);
    *pl = Plan{true, h.total, h.hdr_len, h.hdr_len, uint32_t(kIpv4Len + copied), 0, 0, 0, 0, frag};
    return finish_plan(pl, mtu);
}

// RFC 8200 4.5: the unfragmentable part is the IPv6 header and the extension headers that
// nodes on the way process: hop-by-hop and routing headers, and destination options in front
// of a routing header. Destination options behind the last routing header are for the
// destination and travel in the fragments.
uint32_t plan_ipv6(const IpHeader &h, IpParse st, uint32_t mtu, Plan *pl)
{
    if (!lengths_ok(st))
        return 0;
    if (h.total <= mtu)
        return 1;
    if (!chain_ok(st) || h.fragment || mtu < kIpv6MinMtu)
        return 0;
    // The chain is parse_ip()'s, already bounds-checked: only where its last routing or
    // hop-by-hop header ends is looked for.
    const uint8_t *ip = h.ip;
    uint32_t front = kIpv6Len, nh_off = 6;
    for (uint32_t off = kIpv6Len, type = ip[6]; off < h.chain_len;) {
        uint32_t ext = (uint32_t(ip[off + 1]) + 1) * 8;
        if (type != kProtoIpv6Opts) {
            front = off + ext;
            nh_off = off;
        }
        type = ip[off];
        off += ext;
    }
    uint32_t hdr = front + kIpv6FragHdrLen;
    if (hdr + 8 > mtu)
        return 0;
    *pl = Plan{false, h.total, front, hdr, hdr, 0, 0, 0, nh_off, 0};
    return finish_plan(pl, mtu);
}

uint32_t make_plan(const uint8_t *ip, uint32_t len, uint32_t mtu, Plan *pl)
{
    IpHeader h;
    IpParse st = parse_ip(ip, len, &h);
    if (h.version == 4)
        return plan_ipv4(h, st, mtu, pl);
    if (h.version == 6)
        return plan_ipv6(h, st, mtu, pl);
    return 0;
}

// Where fragment i's data starts in the fragmentable part, and how many bytes it carries.
void piece(const Plan &pl, uint32_t i, uint32_t *off, uint32_t *size)
{
    *off = i ? pl.first_chunk + (i - 1) * pl.rest_chunk : 0;
    *size = std::min(i ? pl.rest_chunk : pl.first_chunk, pl.total - pl.front - *off);
}

// The IPv4 header of a fragment whose data starts at byte off of the fragmentable part.
void ipv4_fragment_header(uint8_t *ip, const Plan &pl, uint32_t hdr_len, uint32_t off,
                          uint32_t size, bool last)
{
    // The last fragment keeps the packet's MF: it may itself have been a fragment.
    uint16_t mf = last ? uint16_t(pl.frag & kIpv4Mf) : kIpv4Mf;
    uint16_t keep = uint16_t(pl.frag & ~(kIpv4Mf | kIpv4OffsetMask));
    put16(ip + 2, uint16_t(hdr_len + size));
    put16(ip + 6, uint16_t(keep | mf | ((pl.frag & kIpv4OffsetMask) + off / 8)));
    ipv4_set_checksum(ip);
}

// The IPv6 Fragment header behind the unfragmentable part at ip, whose last next-header byte
// comes to name it; nh is what that byte named before.
void ipv6_fragment_header(uint8_t *ip, const Plan &pl, uint8_t nh, uint32_t off, uint32_t size,
                          bool last, uint32_t ident)
{
    uint8_t *fh = ip + pl.front;
    ip[pl.nh_off] = kProtoIpv6Frag;
    put16(ip + 4, uint16_t(pl.first_hdr - kIpv6Len + size));
    fh[0] = nh;
    fh[1] = 0;
    put16(fh + 2, uint16_t(off | (last ? 0 : 1)));  // offset in 8-byte units, above res + M
    put32(fh + 4, ident);
}

void write_later(const Pkt &p, const Plan &pl, uint32_t i, uint32_t ident, Pkt &x)
{
    const uint8_t *ip = p.ip();
    uint32_t off, size;
    piece(pl, i, &off, &size);
    bool last = i + 1 == pl.count;
    uint8_t *dst = x.frame + kFrameHeadroom;
    if (pl.v4) {
        std::memcpy(dst, ip, kIpv4Len);
        ipv4_copied_options(ip + kIpv4Len, pl.front - kIpv4Len, dst + kIpv4Len);
        dst[0] = uint8_t(0x40 | pl.rest_hdr / 4);
        ipv4_fragment_header(dst, pl, pl.rest_hdr, off, size, last);
    } else {
        std::memcpy(dst, ip, pl.front);
        ipv6_fragment_header(dst, pl, ip[pl.nh_off], off, size, last, ident);
    }
    std::memcpy(dst + pl.rest_hdr, ip + pl.front + off, size);
    x.l3 = kFrameHeadroom;
    x.len = pl.rest_hdr + size;
    x.l2_len = 0;
    x.l4 = 0;
    x.verdict = p.verdict;
    x.drop = p.drop;
}

// Fragment 0 is the packet cut short. For IPv6 the unfragmentable part moves 8 bytes into the
// headroom (over the link-layer header, if any) to make room for the Fragment header.
void write_first(Pkt &p, const Plan &pl, uint32_t ident)
{
    uint8_t *ip = p.ip();
    if (pl.v4) {
        ipv4_fragment_header(ip, pl, pl.first_hdr, 0, pl.first_chunk, false);
    } else {
        uint8_t nh = ip[pl.nh_off];
        std::memmove(ip - kIpv6FragHdrLen, ip, pl.front);
        ipv6_fragment_header(ip - kIpv6FragHdrLen, pl, nh, 0, pl.first_chunk, false, ident);
        p.l3 -= kIpv6FragHdrLen;
        p.l2_len = 0;
        if (p.l4 >= pl.front)
            p.l4 = uint16_t(p.l4 + kIpv6FragHdrLen);
    }
    p.len = pl.first_hdr + pl.first_chunk;
}

}  // namespace

uint32_t fragments_needed(const uint8_t *ip, uint32_t len, uint32_t mtu)
{
    Plan pl;
    return make_plan(ip, len, mtu, &pl);
}

uint32_t fragment(Pkt &p, uint32_t mtu, uint32_t ident, Pkt *extra, uint32_t n_extra)
{
    Plan pl;
    uint32_t n = make_plan(p.ip(), p.len, mtu, &pl);
    if (n <= 1)
        return n;
    if (n - 1 > n_extra || (!pl.v4 && p.l3 < kIpv6FragHdrLen))
        return 0;
    for (uint32_t i = 1; i < n; i++) {
        uint32_t off, size;
        piece(pl, i, &off, &size);
        if (!extra[i - 1].frame || extra[i - 1].frame_len < kFrameHeadroom + pl.rest_hdr + size)
            return 0;
    }
    // The later fragments first: they copy from the headers that fragment 0 rewrites.
    for (uint32_t i = 1; i < n; i++)
        write_later(p, pl, i, ident, extra[i - 1]);
    write_first(p, pl, ident);
    return n;
}

}  // namespace xesp
