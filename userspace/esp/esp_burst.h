// What encap.cpp and decap.cpp share: the burst loop and the outer header's length.
#pragma once

#include <cstddef>
#include <cstdint>

#include "userspace/base/ip_header.h"
#include "userspace/base/wire.h"
#include "userspace/esp/esp.h"

namespace xesp::esp_detail {

// The IP header's total length (IPv4: and its checksum) for a datagram of `total` bytes.
inline void set_ip_total(uint8_t *ip, uint32_t total)
{
    if (wire::ip_version(ip) == 4) {
        wire::put16(ip + 2, uint16_t(total));
        wire::ipv4_set_checksum(ip);
    } else {
        wire::put16(ip + 4, uint16_t(total - wire::kIpv6Len));
    }
}

// What does not fit in a burst any more is dropped, never passed: prepare() takes at most
// kMaxBurst - b.n packets and returns how many.
inline size_t burst_room(Pkt *const *pkts, size_t n, const EspBurst &b, Drop drop)
{
    size_t room = kMaxBurst - b.n;
    for (size_t i = room; i < n; i++)
        pkts[i]->set_drop(drop);
    return n < room ? n : room;
}

// The three steps on this thread, kMaxBurst packets at a time.
template <class Prepare, class Crypt, class Finish>
void run_bursts(Sa &sa, Pkt *const *pkts, size_t n, Prepare prepare, Crypt crypt, Finish finish)
{
    EspBurst b;
    while (n) {
        size_t k = n < kMaxBurst ? n : kMaxBurst;
        b.n = 0;
        prepare(sa, pkts, k, b);
        (sa.cipher().*crypt)(b.ops, b.n);
        finish(sa, b, 0, b.n);
        pkts += k;
        n -= k;
    }
}

}  // namespace xesp::esp_detail
