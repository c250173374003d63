// `xesp pcap`: a capture through the gateway's code, frame by frame, in bursts.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tools/xesp/commands.h"
#include "userspace/config/config.h"
#include "userspace/esp/engine.h"
#include "userspace/pcap/pcap_io.h"
#include "userspace/control/report.h"
#include "userspace/base/clock.h"
#include "userspace/base/huge_pages.h"
#include "userspace/base/wire.h"

namespace xesp::cli {

namespace {

struct PcapOptions {
    std::string batch, in, out, crypto = "auto";
    bool json = false;
    uint32_t mtu = 0;
    std::vector<std::string> icmp_src;
    std::vector<std::string> local;
};

constexpr size_t kBurst = 32;

// One burst of frames: each frame copied into a buffer with headroom, as AF_XDP RX gives it.
struct Slot {
    std::vector<uint8_t> frame = std::vector<uint8_t>(kFrameSize);
    uint8_t l2[32];
    uint32_t l2_len = 0;
    uint32_t orig_len = 0;
    bool ip = false;
    bool skip = false;
    Pkt pkt;
    struct timeval ts;
    std::vector<uint8_t> raw;  // frames that are not IP go out as they came
};

void run_pcap(const PcapOptions &o)
{
    const uint64_t t_start = now_ns();
    auto backend = parse_backend(o.crypto);
    if (!backend)
        throw Failure("pcap: unknown --crypto '" + o.crypto + "' (auto, openssl, ipsecmb)");
    auto config = load_batch_file(o.batch);
    if (!config)
        throw Failure(config.error().message);
    EngineOptions eo;
    eo.link_mtu = o.mtu;
    for (const auto &a : o.icmp_src) {
        auto addr = IpAddr::parse(a);
        if (!addr)
            throw Failure("pcap: --icmp-src '" + a + "' is not an IPv4 or IPv6 address");
        (addr->family == 4 ? eo.icmp_src4 : eo.icmp_src6) = *addr;
    }
    if (!o.local.empty()) {
        eo.local.emplace();
        for (const auto &a : o.local) {
            auto addr = IpAddr::parse(a);
            if (!addr)
                throw Failure("pcap: --local '" + a + "' is not an IPv4 or IPv6 address");
            eo.local->push_back(*addr);
        }
    }
    auto engine = Engine::create(*config, *backend, eo);
    if (!engine)
        throw Failure(o.batch + ": " + engine.error().message);
    nlohmann::json expires = nlohmann::json::array();
    (*engine)->on_expire([&](const Sa &sa, bool hard) {
        std::string what =
            std::string(hard ? "hard" : "soft") + " lifetime reached: " + sa_label(sa.config());
        if (!o.json)
            std::fprintf(stderr, "xesp: sa expire: %s\n", what.c_str());
        expires.push_back(what);
    });

    // The tables are loaded: from here on the packets read them (huge_pages.h).
    const HugePageAdvice huge = advise_huge_pages();

    auto reader = PcapReader::open(o.in);
    if (!reader)
        throw Failure("pcap: " + reader.error().message);
    int lt = reader->linktype();
    auto writer = PcapWriter::open(o.out, lt);
    if (!writer)
        throw Failure("pcap: " + writer.error().message);

    std::vector<Slot> slots(kBurst);
    Pkt *pkts[kBurst];
    uint64_t frames_in = 0, frames_out = 0, too_big = 0;
    // Where the time goes: the engine alone (classification and ESP), against the whole loop
    // that also reads and writes the captures.
    uint64_t engine_ns = 0, engine_pkts = 0;
    const uint64_t t_loop = now_ns();
    bool more = true;
    while (more) {
        size_t n = 0, nip = 0;
        const uint8_t *data;
        uint32_t len;
        while (n < kBurst && (more = reader->next(&data, &len, &slots[n].ts))) {
            Slot &s = slots[n++];
            frames_in++;
            uint32_t l3;
            s.ip = locate_ip(lt, data, len, &l3);
            s.skip = s.ip && (l3 > sizeof(s.l2) ||
                              len - l3 > kFrameSize - kFrameHeadroom - kMaxEspOverheadBack);
            if (s.skip) {
                too_big++;  // it might need protecting: never write it unprocessed
                continue;
            }
            if (!s.ip) {
                s.raw.assign(data, data + len);
                continue;
            }
            std::memcpy(s.l2, data, l3);
            s.l2_len = l3;
            std::memcpy(s.frame.data() + kFrameHeadroom, data + l3, len - l3);
            s.pkt = Pkt{s.frame.data(), kFrameSize, kFrameHeadroom, len - l3};
            s.orig_len = len - l3;
            std::memcpy(s.frame.data() + kFrameHeadroom - l3, data, l3);
            pkts[nip++] = &s.pkt;
        }
        const uint64_t t0 = now_ns();
        (*engine)->process(pkts, nip);
        engine_ns += now_ns() - t0;
        engine_pkts += nip;
        for (size_t i = 0; i < n; i++) {
            Slot &s = slots[i];
            if (s.skip)
                continue;
            if (!s.ip) {
                writer->write(s.raw.data(), uint32_t(s.raw.size()), s.ts);
                frames_out++;
                continue;
            }
            if (s.pkt.verdict == Verdict::Drop)
                continue;
            if (s.pkt.verdict == Verdict::Pass) {  // as it came, link-layer padding too
                writer->write(s.pkt.frame + kFrameHeadroom - s.l2_len, s.l2_len + s.orig_len, s.ts);
                frames_out++;
                continue;
            }
            // The IP packet keeps its Ethernet header, written just in front of it.
            uint8_t *l2 = s.pkt.ip() - s.l2_len;
            std::memcpy(l2, s.l2, s.l2_len);
            if (lt == DLT_EN10MB) {
                set_ethertype(l2, s.l2_len, wire::ip_version(s.pkt.ip()));
                if (s.pkt.verdict == Verdict::TooBig)  // goes back to where it came from
                    for (int b = 0; b < 6; b++)
                        std::swap(l2[b], l2[6 + b]);
            }
            writer->write(l2, s.l2_len + s.pkt.len, s.ts);
            frames_out++;
        }
    }

    const uint64_t t_end = now_ns();
    if (o.json) {
        nlohmann::json j = engine_json(**engine);
        j["frames_in"] = frames_in;
        j["frames_out"] = frames_out;
        j["frames_too_big"] = too_big;
        j["expires"] = expires;
        // Seconds: loading the config and making the engine, the frame loop, and the
        // engine's share of that loop; the engine's rate counts the IP packets it was given.
        j["timing"] = {
            {"setup_s", double(t_loop - t_start) / kSecondNs},
            {"loop_s", double(t_end - t_loop) / kSecondNs},
            {"engine_s", double(engine_ns) / kSecondNs},
            {"engine_packets", engine_pkts},
            {"engine_pps", engine_ns ? double(engine_pkts) * kSecondNs / engine_ns : 0.0}};
        // The heap on huge pages (huge_pages.h), and why a collapse was refused.
        j["huge_pages"] = {{"advised_bytes", huge.advised},
                           {"collapsed_bytes", huge.collapsed},
                           {"collapse_error",
                            huge.collapse_error ? nlohmann::json(std::strerror(huge.collapse_error))
                                                : nlohmann::json(nullptr)}};
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::fprintf(stderr, "frames in %llu  out %llu\n%s", (unsigned long long)frames_in,
                     (unsigned long long)frames_out, engine_text(**engine).c_str());
    }
}

}  // namespace

void register_pcap_command(CLI::App &app)
{
    auto o = std::make_shared<PcapOptions>();
    CLI::App *c =
        app.add_subcommand("pcap", "Run every frame of a capture through the gateway's ESP code");
    c->add_option("-b,--batch", o->batch, "Config: a batch of 'sa add'/'policy add' lines")
        ->required();
    c->add_option("--in", o->in, "Input capture (Ethernet or raw IP)")->required();
    c->add_option("--out", o->out, "Output capture")->required();
    c->add_option("--crypto", o->crypto, "Crypto backend: auto, openssl, ipsecmb");
    c->add_flag("--json", o->json, "Counters as JSON on stdout");
    c->add_option("--mtu", o->mtu,
                  "MTU of the encrypted side: a packet that no longer fits and may not be "
                  "fragmented is answered with ICMP fragmentation needed / packet too big");
    c->add_option("--icmp-src", o->icmp_src,
                  "Source address of those ICMP errors (one per family; default: the SA's)");
    c->add_option("--local", o->local,
                  "The gateway's own addresses (repeatable): an SA without `dir` decrypts only "
                  "ESP to one of them (default: ESP to any SA's destination)");
    c->callback([o] { run_pcap(*o); });
}

}  // namespace xesp::cli
