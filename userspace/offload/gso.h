// Super-packets in and out of the protected side, as a TUN device with vnet headers
// (IFF_VNET_HDR, TUNSETOFFLOAD) hands them over and takes them back: the kernel's TSO and GRO
// done here, so that the hosts behind the gateway keep theirs.
//
// Out (gso_split): a packet of up to 64 KB that the kernel wrote with a virtio-net header is
// cut into packets that fit the tunnel, each written whole into a frame of its own, ready to
// be encrypted in place:
//   - TCP (TCPV4, TCPV6): each piece the IP and TCP headers of the original with its own
//     length, IPv4 id (the original's plus the piece's index, as the kernel's TSO), sequence
//     number and flags (CWR on the first piece only, FIN and PSH on the last only), and its
//     checksums complete;
//   - UDP (UDP_L4, the kernel's USO): each piece a datagram with its own UDP header;
//   - anything else: one packet, its checksum completed where the header asks for it
//     (VIRTIO_NET_HDR_F_NEEDS_CSUM: the host left it to the device).
// TCP segments are at most the header's gso_size, and smaller where the tunnel's inner MTU
// asks, but for IPv4 without DF: cut smaller, its pieces would take ids the host gives its
// next packets, so they keep the host's size (unless no frame holds it) and are fragmented
// on the way. UDP datagrams that would not fit are refused (TooBig), as is a packet not to cut.
//
// In (Gro): the decrypted packets of a burst, in order, are looked at for TCP segments of one
// flow that follow each other, as the kernel's inet_gro_receive and tcp_gro_receive join
// them: the same addresses, ports, IP fields (but the length, id and checksum), TCP options,
// window and acknowledgement; IPv4 ids that go up by one from the first's, or that all are
// the first's with DF set (the second packet says which: inet_gro_flush); no flag but ACK
// (PSH ends a run), sequence numbers that follow on, every payload of the first's size (a
// smaller one ends the run), at most 64 KB in all, and each checksum right, the IPv4
// header's and the TCP one (a joined packet's are made anew, here and by the kernel, which
// would hide a bad one: a packet with a bad one stays alone, for the kernel to drop).
// Where the device takes USO (Linux 6.2 on), UDP datagrams of one flow are joined too, as
// udp_gro_receive_segment joins them for forwarding: the same rules but for those of TCP,
// and each datagram with a checksum (none: it stays alone, as the kernel leaves it).
// Any other packet between the same addresses ends the run (a TCP segment or UDP datagram:
// only a run on its ports): nothing of a connection passes another of its packets.
// A run is written as one packet, with the first's IP header, and a vnet header that has the
// kernel cut it again where it must (gso_size: the first's payload). Cut again, its IPv4 ids
// go up by one from the first's: a vnet header has no word for fixed ids
// (SKB_GSO_TCP_FIXEDID), and with DF set an id means nothing (RFC 6864). gather() gives the
// run as pieces where they are (its headers in a small buffer, then each payload in its
// frame), for one writev() with no copy; write() puts the pieces together in a buffer.
//
// Nothing here allocates: the caller has the frames and the buffer.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace xesp {

// struct virtio_net_hdr (linux/virtio_net.h), in the byte order of the host as a TUN device
// without TUNSETVNETBE/LE has it on a little-endian machine.
struct VnetHdr {
    static constexpr uint8_t kNeedsCsum = 1;  // VIRTIO_NET_HDR_F_NEEDS_CSUM
    static constexpr uint8_t kDataValid = 2;  // VIRTIO_NET_HDR_F_DATA_VALID
    static constexpr uint8_t kGsoNone = 0, kGsoTcpv4 = 1, kGsoUdp = 3, kGsoTcpv6 = 4, kGsoUdpL4 = 5,
                             kGsoEcn = 0x80;
    uint8_t flags = 0;
    uint8_t gso_type = kGsoNone;
    uint16_t hdr_len = 0;      // the headers, up to the payload
    uint16_t gso_size = 0;     // payload per segment
    uint16_t csum_start = 0;   // where the checksum's sum starts (the L4 header)
    uint16_t csum_offset = 0;  // and where in it the checksum goes
};
static_assert(sizeof(VnetHdr) == 10);

// Why a super-packet was not cut (each a counter of the caller's).
enum class GsoError : uint8_t {
    None,
    BadHeader,  // the vnet header does not fit the packet (lengths, offsets, types)
    BadPacket,  // the IP or L4 header is not what the vnet header says
    TooBig,     // would not fit the tunnel: a packet not to cut, a UDP datagram (USO's are the
                // sender's messages, not to be cut smaller), or headers with no room for data
    TooMany,    // more pieces than the caller has frames for
};

// For a packet not to cut whose vnet header asks for its checksum (kNeedsCsum): the sum
// from csum_start on, written at csum_start + csum_offset (the pseudo-header's sum is there
// already). False, nothing written, if those offsets do not fit len.
bool complete_csum(const VnetHdr &h, uint8_t *pkt, size_t len);

// Cuts pkt (len bytes from its IP header) as h says into pieces of at most inner_mtu bytes,
// each written at out[i] (room bytes there); out_len[i] is its length. At most max_out
// pieces. *n is the number written.
GsoError gso_split(const VnetHdr &h, const uint8_t *pkt, size_t len, uint32_t inner_mtu,
                   uint8_t *const *out, uint32_t room, uint32_t *out_len, size_t max_out,
                   size_t *n);

// The joining of TCP segments (and UDP datagrams), over one burst of decrypted packets at a
// time.
class Gro {
public:
    static constexpr size_t kMaxLen = 65535;  // an IP packet's total length
    static constexpr size_t kMaxRun = 64;     // packets in one run (kMaxBurst)

    // The packets (each from its IP header) in the order they came: run_of[i] is the index
    // of the first packet of i's run (i itself when it starts one or stays alone). Packets
    // of other flows may come between those of a run; a run keeps its flow's order. udp:
    // UDP datagrams may be joined (the device takes USO).
    static void plan(const uint8_t *const *pkts, const uint32_t *lens, size_t n, bool udp,
                     uint16_t *run_of);
    // The run that starts at `first` (packets first and every later i with run_of[i] ==
    // first) as one packet, in pieces to be written one after the other: iov[0] the run's
    // IP and L4 headers, made in hdr (room for kMaxHdrs bytes), then each packet's payload
    // where it is; *niov of them, at most kMaxRun + 1. A packet alone (nothing to cut) is
    // one piece, itself. *h says how to cut it. Returns its length.
    // IPv6 (40) and TCP with options (60): no run has IPv4 options or IPv6 extension
    // headers.
    static constexpr size_t kMaxHdrs = 128;
    static uint32_t gather(const uint8_t *const *pkts, const uint32_t *lens, size_t n,
                           const uint16_t *run_of, size_t first, uint8_t *hdr, iovec *iov,
                           size_t *niov, VnetHdr *h);
    // The same run written into out (room for kMaxLen bytes) as one packet.
    static uint32_t write(const uint8_t *const *pkts, const uint32_t *lens, size_t n,
                          const uint16_t *run_of, size_t first, uint8_t *out, VnetHdr *h);
};

}  // namespace xesp
