// Protocol constants and wire helpers for IPv4, IPv6, UDP and ESP, in one place
// (WireGuard's messages.h). Fields are read and written with explicit byte order.
#pragma once

#include <cstdint>
#include <cstring>

#include <arpa/inet.h>

namespace xesp::wire {

constexpr uint8_t kProtoIcmp = 1;
constexpr uint8_t kProtoIpIp = 4;
constexpr uint8_t kProtoTcp = 6;
constexpr uint8_t kProtoUdp = 17;
constexpr uint8_t kProtoIpv6 = 41;
constexpr uint8_t kProtoIpv6Route = 43;
constexpr uint8_t kProtoIpv6Frag = 44;
constexpr uint8_t kProtoEsp = 50;
constexpr uint8_t kProtoIcmpv6 = 58;
constexpr uint8_t kProtoNone = 59;  // RFC 4303 2.6: dummy packet
constexpr uint8_t kProtoIpv6Opts = 60;
constexpr uint8_t kProtoIpv6HopByHop = 0;
constexpr uint8_t kProtoSctp = 132;
constexpr uint8_t kProtoUdpLite = 136;
constexpr uint8_t kProtoDccp = 33;

// IPv4 flags and fragment offset (the 16 bits at byte 6 of the header).
constexpr uint16_t kIpv4Df = 0x4000;
constexpr uint16_t kIpv4Mf = 0x2000;
constexpr uint16_t kIpv4OffsetMask = 0x1fff;

constexpr uint16_t kEthIpv4 = 0x0800;
constexpr uint16_t kEthIpv6 = 0x86dd;
constexpr uint16_t kEthVlan = 0x8100;
constexpr uint16_t kEthQinQ = 0x88a8;

constexpr uint16_t kNatTPort = 4500;  // RFC 3948
constexpr size_t kEthLen = 14;
constexpr size_t kIpv4Len = 20;
constexpr size_t kIpv6Len = 40;
constexpr size_t kIpv6FragHdrLen = 8;
constexpr size_t kUdpLen = 8;
constexpr size_t kEspHdrLen = 8;      // SPI + sequence number
constexpr size_t kEspTrailerLen = 2;  // pad length + next header

// Plaintext + padding + trailer (RFC 4303 2.4, 2.5): its length, a multiple of the block
// (4 or 16: a power of two).
inline uint32_t esp_padded_len(uint32_t plain_len, uint8_t block)
{
    return (plain_len + kEspTrailerLen + block - 1) & ~uint32_t(block - 1);
}

// The version nibble. Enough to tell the family of a header already checked; to read an
// unchecked one, parse_ip() (ip_header.h).
inline uint8_t ip_version(const uint8_t *ip)
{
    return ip[0] >> 4;
}
// IPv4 header length from IHL, unchecked.
inline uint32_t ipv4_hdr_len(const uint8_t *ip)
{
    return uint32_t(ip[0] & 0x0f) * 4;
}

inline uint16_t get16(const uint8_t *p)
{
    return uint16_t(p[0] << 8 | p[1]);
}
inline uint32_t get32(const uint8_t *p)
{
    return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}
inline void put16(uint8_t *p, uint16_t v)
{
    p[0] = uint8_t(v >> 8);
    p[1] = uint8_t(v);
}
inline void put32(uint8_t *p, uint32_t v)
{
    p[0] = uint8_t(v >> 24);
    p[1] = uint8_t(v >> 16);
    p[2] = uint8_t(v >> 8);
    p[3] = uint8_t(v);
}
inline void put64(uint8_t *p, uint64_t v)
{
    put32(p, uint32_t(v >> 32));
    put32(p + 4, uint32_t(v));
}

// Internet checksum (RFC 1071) of a buffer, folded, not inverted.
inline uint32_t csum_add(uint32_t sum, const uint8_t *p, size_t n)
{
    for (; n >= 2; p += 2, n -= 2)
        sum += get16(p);
    if (n)
        sum += uint32_t(p[0]) << 8;
    return sum;
}
inline uint16_t csum_fold(uint32_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return uint16_t(sum);
}
inline void ipv4_set_checksum(uint8_t *ip)
{
    size_t ihl = ipv4_hdr_len(ip);
    put16(ip + 10, 0);
    put16(ip + 10, uint16_t(~csum_fold(csum_add(0, ip, ihl))));
}
// RFC 1624 incremental update when one 16-bit word changes from old to new.
inline void csum_replace16(uint8_t *csum, uint16_t old_word, uint16_t new_word)
{
    uint32_t sum = uint16_t(~get16(csum)) + uint16_t(~old_word) + new_word;
    put16(csum, uint16_t(~csum_fold(sum)));
}

// Traffic class (DSCP + ECN) of an IP header, and setting it in place.
inline uint8_t ip_tos(const uint8_t *ip)
{
    if (ip_version(ip) == 4)
        return ip[1];
    return uint8_t((ip[0] & 0x0f) << 4 | ip[1] >> 4);
}
inline void ip_set_tos(uint8_t *ip, uint8_t tos)
{
    if (ip_version(ip) == 4) {
        uint16_t old = get16(ip);
        ip[1] = tos;
        csum_replace16(ip + 10, old, get16(ip));
    } else {
        ip[0] = uint8_t((ip[0] & 0xf0) | tos >> 4);
        ip[1] = uint8_t((ip[1] & 0x0f) | (tos & 0x0f) << 4);
    }
}

constexpr uint8_t kEcnMask = 0x03;
constexpr uint8_t kEcnNotEct = 0, kEcnEct1 = 1, kEcnEct0 = 2, kEcnCe = 3;

}  // namespace xesp::wire
