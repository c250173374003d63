// The driver of test_fragment.sh: runs fragment() over every IP packet of a capture.
//
//   fragment_tool IN.pcap OUT.pcap MTU [IDENT]
//
// Each packet's fragments go to OUT.pcap in order, each behind a copy of the packet's
// link-layer header (ethertype set to its IP version). One line a packet on stdout: the number
// of fragments, 0 where fragment() refused it (nothing written). IPv6 fragments of the i-th
// packet (from 0) carry the identification IDENT + i, as a per-SA counter would give them.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "userspace/esp/fragment.h"
#include "userspace/pcap/pcap_io.h"

using namespace xesp;

namespace {

constexpr uint32_t kPool = 64;  // extra frames: enough for 3800 bytes at MTU 68
constexpr uint32_t kMaxL2 = 64;

bool parse_u32(const char *s, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long v = std::strtoul(s, &end, 0);
    if (errno || *end || end == s || v > UINT32_MAX)
        return false;
    *out = uint32_t(v);
    return true;
}

// Writes an IP packet behind the saved link-layer header, in the headroom before it.
void write_ip(PcapWriter &w, int linktype, const Pkt &p, const uint8_t *l2, uint32_t l2_len,
              const struct timeval &ts)
{
    uint8_t *start = p.frame + p.l3 - l2_len;
    std::memcpy(start, l2, l2_len);
    if (linktype == DLT_EN10MB)
        set_ethertype(start, l2_len, p.ip()[0] >> 4);
    w.write(start, l2_len + p.len, ts);
}

}  // namespace

int main(int argc, char **argv)
{
    uint32_t mtu, ident = 1;
    if ((argc != 4 && argc != 5) || !parse_u32(argv[3], &mtu) ||
        (argc == 5 && !parse_u32(argv[4], &ident))) {
        std::fprintf(stderr, "usage: fragment_tool IN.pcap OUT.pcap MTU [IDENT]\n");
        return 2;
    }
    auto reader = PcapReader::open(argv[1]);
    if (!reader) {
        std::fprintf(stderr, "fragment_tool: %s\n", reader.error().message.c_str());
        return 1;
    }
    int lt = reader->linktype();
    auto writer = PcapWriter::open(argv[2], lt);
    if (!writer) {
        std::fprintf(stderr, "fragment_tool: %s\n", writer.error().message.c_str());
        return 1;
    }
    std::vector<uint8_t> frame(kFrameSize), pool(size_t(kPool) * kFrameSize);
    std::vector<Pkt> extra(kPool);
    const uint8_t *data;
    uint32_t len;
    struct timeval ts;
    for (uint32_t i = 0; reader->next(&data, &len, &ts); i++) {
        uint32_t l3;
        if (!locate_ip(lt, data, len, &l3) || l3 > kMaxL2 ||
            len - l3 > kFrameSize - kFrameHeadroom) {
            std::fprintf(stderr, "fragment_tool: packet %u: no IP packet, or one too large\n", i);
            return 1;
        }
        uint8_t l2[kMaxL2];
        std::memcpy(l2, data, l3);
        std::memcpy(frame.data() + kFrameHeadroom, data + l3, len - l3);
        Pkt p{frame.data(), kFrameSize, kFrameHeadroom, len - l3};
        for (uint32_t k = 0; k < kPool; k++)
            extra[k] = Pkt{pool.data() + size_t(k) * kFrameSize, kFrameSize};
        uint32_t n = fragment(p, mtu, ident + i, extra.data(), kPool);
        std::printf("%u\n", n);
        if (n)
            write_ip(*writer, lt, p, l2, l3, ts);
        for (uint32_t k = 0; k + 1 < n; k++)
            write_ip(*writer, lt, extra[k], l2, l3, ts);
    }
    return 0;
}
