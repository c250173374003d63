// ESP encapsulation and decapsulation (RFC 4303), tunnel and transport mode, IPv4 and IPv6
// inside and outside, NAT-T (RFC 3948). Works on a burst of packets of one SA, in place:
//
//   1. serial step, in packet order: checks, sequence number or replay pre-check, one
//      CryptoOp per packet (transport-mode encap writes its headers and padding here);
//   2. one call into the crypto backend for the whole burst, after tunnel-mode encap has
//      written the headers and padding (esp_encap_write());
//   3. serial step, in packet order: verdicts, replay window update, trailer checks,
//      lifetimes and counters.
//
// The pipeline (userspace/pipeline/) runs step 2 on worker cores; steps 1 and 3 stay per SA
// and in order, which is why they are separate functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "userspace/crypto/crypto.h"
#include "userspace/base/ip_header.h"
#include "userspace/base/packet.h"
#include "userspace/esp/sa.h"

namespace xesp {

constexpr size_t kMaxBurst = 64;

// Per-burst scratch: the crypto ops and what the serial steps carry between them. prepare()
// appends from n on, so that one burst may carry the packets of several SAs to the cipher
// (crypt_burst()); finish() takes back one SA's range [from, to).
struct EspBurst {
    CryptoOp ops[kMaxBurst];
    SaCipher *cipher[kMaxBurst];  // each op's: its SA's
    Pkt *pkts[kMaxBurst];
    uint64_t seq[kMaxBurst];
    uint8_t iv[kMaxBurst][16];  // encap: the random IVs of CBC
    size_t n = 0;
};

// Encapsulation. prepare() takes plaintext IP packets (l3/len) and adds to b the ones that go
// to the cipher (the others get verdict Drop with a reason; so do those that no longer fit in
// b). It decides everything, sequence numbers included, and sets each packet's l3 and len to
// the ESP packet's. In tunnel mode it writes nothing in the frames: write() puts the headers
// and trailer of [from, to) in on the thread that encrypts them next, from the inner header
// and the op, so that the frame's lines stay in that thread's cache until it is done
// (prepare() runs on the one thread that owns the SA's sequence numbers). Transport mode
// writes in prepare(). finish() runs after encrypt().
void esp_encap_prepare(Sa &sa, Pkt *const *pkts, size_t n, EspBurst &b);
void esp_encap_write(const Sa &sa, EspBurst &b, size_t from, size_t to);
void esp_encap_finish(Sa &sa, EspBurst &b, size_t from, size_t to);

// Decapsulation. Each packet's l4 is the offset of its ESP header (behind UDP for NAT-T);
// the IP header has already been checked by the classifier and len trimmed to it.
void esp_decap_prepare(Sa &sa, Pkt *const *pkts, size_t n, EspBurst &b);
void esp_decap_finish(Sa &sa, EspBurst &b, size_t from, size_t to);

// Both steps and the crypto call in one, on the calling thread.
void esp_encap_burst(Sa &sa, Pkt *const *pkts, size_t n);
void esp_decap_burst(Sa &sa, Pkt *const *pkts, size_t n);

// The 5-tuple of an IP packet (after IPv6 extension headers), for selectors and policies.
struct FlowKey {
    IpAddr src, dst;
    uint8_t proto = 0;
    uint16_t sport = 0, dport = 0;
    bool fragment = false;       // ports unknown: see Spd::lookup
    bool proto_unknown = false;  // a fragment whose protocol is not known either (IpHeader)
};
// From a header parse_ip() found Ok, or from the packet at ip (false if it is not Ok).
void flow_from_header(const IpHeader &h, FlowKey *key);
bool parse_flow(const uint8_t *ip, uint32_t len, FlowKey *key);

// RFC 6040 section 4.2: the ECN field of the inner header after decapsulation, or -1 to drop.
int ecn_decapsulate(uint8_t outer_ecn, uint8_t inner_ecn);

}  // namespace xesp
