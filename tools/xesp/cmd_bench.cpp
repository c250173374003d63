// `xesp bench`: per transform and packet size, on one core, in one run: the backend's raw
// cipher throughput on the same buffers, then full ESP encapsulation and decapsulation
// (tunnel mode, in place, bursts of 32). The ratio ESP/raw is what the ESP code costs on top
// of the crypto.
#include <sched.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/xesp/bench_transforms.h"
#include "tools/xesp/commands.h"
#include "userspace/base/clock.h"
#include "userspace/esp/esp.h"
#include "userspace/esp/sa.h"
#include "userspace/base/wire.h"

namespace xesp::cli {

namespace {

constexpr size_t kBurst = 32;

struct BenchOptions {
    std::string crypto = "all";
    std::string sizes = "64,512,1400";
    std::string transforms = "aes128gcm,aes256gcm,chacha20poly1305,aes128cbc-sha1,aes256cbc-sha256";
    double seconds = 0.25;  // per measurement
    int cpu = -1;
    bool json = false;
};

std::vector<std::string> split_list(const std::string &s)
{
    std::vector<std::string> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ','))
        if (!item.empty())
            out.push_back(item);
    return out;
}

// A burst of frames holding an IPv4/UDP packet of `size` bytes each.
struct Frames {
    std::vector<uint8_t> mem;
    Pkt pkts[kBurst];
    Pkt *ptrs[kBurst];

    explicit Frames(uint32_t size) : mem(kBurst * kFrameSize)
    {
        for (size_t i = 0; i < kBurst; i++) {
            uint8_t *f = mem.data() + i * kFrameSize;
            uint8_t *ip = f + kFrameHeadroom;
            for (uint32_t j = 0; j < size; j++)
                ip[j] = uint8_t(j);
            ip[0] = 0x45;
            ip[1] = 0;
            wire::put16(ip + 2, uint16_t(size));
            ip[8] = 64;
            ip[9] = wire::kProtoUdp;
            wire::ipv4_set_checksum(ip);
            wire::put16(ip + 24, uint16_t(size - 20));
            pkts[i] = Pkt{f, kFrameSize, kFrameHeadroom, size};
            ptrs[i] = &pkts[i];
        }
    }
};

struct Row {
    std::string transform, crypto;
    uint32_t size;
    double raw_enc, encap, raw_dec, decap;  // ns per packet
};

// Raw cipher: the same payload length ESP hands the cipher for this packet size. Encrypt and
// decrypt alternate on the same buffers, each timed on its own, so that every decrypt sees
// packets that authenticate (a backend may skip decryption when the ICV is wrong).
void measure_raw(SaCipher &cipher, const Transform &xf, uint32_t size, double seconds, Row &row)
{
    Frames fr(size);
    CryptoOp ops[kBurst];
    const uint32_t payload = wire::esp_padded_len(size, uint8_t(xf.block_size()));
    for (size_t i = 0; i < kBurst; i++)
        ops[i] = CryptoOp{fr.pkts[i].ip(), payload, 0, false};
    uint64_t n = 0;
    double t_enc = 0, t_dec = 0;
    uint64_t end = now_ns() + uint64_t(seconds * 2e9);
    while (now_ns() < end) {
        uint64_t t0 = now_ns();
        cipher.encrypt(ops, kBurst);
        uint64_t t1 = now_ns();
        cipher.decrypt(ops, kBurst);
        uint64_t t2 = now_ns();
        for (const CryptoOp &op : ops)
            if (!op.ok)
                throw Failure("bench: the cipher did not decrypt its own output");
        t_enc += double(t1 - t0);
        t_dec += double(t2 - t1);
        n += kBurst;
    }
    row.raw_enc = t_enc / double(n);
    row.raw_dec = t_dec / double(n);
}

// ESP: encapsulate a burst, decapsulate it again (which leaves the frames as they were), and
// time each half on its own.
bool measure_esp(const SaConfig &cfg, Backend backend, uint32_t size, double seconds, Row &row)
{
    auto out = Sa::create(cfg, backend);
    auto in = Sa::create(cfg, backend);
    if (!out || !in)
        throw Failure("bench: " + (out ? in.error() : out.error()).message);
    Frames fr(size);
    uint64_t n = 0;
    double t_enc = 0, t_dec = 0;
    uint64_t end = now_ns() + uint64_t(seconds * 2e9);
    while (now_ns() < end) {
        uint64_t t0 = now_ns();
        esp_encap_burst(**out, fr.ptrs, kBurst);
        uint64_t t1 = now_ns();
        for (auto &p : fr.pkts)
            p.l4 = wire::kIpv4Len;
        esp_decap_burst(**in, fr.ptrs, kBurst);
        uint64_t t2 = now_ns();
        t_enc += double(t1 - t0);
        t_dec += double(t2 - t1);
        n += kBurst;
        for (auto &p : fr.pkts)
            if (p.verdict != Verdict::Decrypted || p.l3 != kFrameHeadroom || p.len != size)
                return false;
    }
    row.encap = t_enc / double(n);
    row.decap = t_dec / double(n);
    return true;
}

void print_table(const std::vector<Row> &rows)
{
    std::printf("%-18s %-8s %5s | %8s %8s %6s %6s %5s | %8s %8s %6s %6s %5s\n", "transform",
                "crypto", "size", "raw ns", "encap ns", "Mpps", "Gbps", "ratio", "raw ns",
                "decap ns", "Mpps", "Gbps", "ratio");
    for (const Row &r : rows) {
        auto gbps = [&](double ns) { return r.size * 8.0 / ns; };
        std::printf("%-18s %-8s %5u | %8.1f %8.1f %6.2f %6.2f %5.2f | %8.1f %8.1f %6.2f %6.2f "
                    "%5.2f\n",
                    r.transform.c_str(), r.crypto.c_str(), r.size, r.raw_enc, r.encap,
                    1e3 / r.encap, gbps(r.encap), r.raw_enc / r.encap, r.raw_dec, r.decap,
                    1e3 / r.decap, gbps(r.decap), r.raw_dec / r.decap);
    }
}

void print_speedups(const std::vector<Row> &rows)
{
    // ipsec-mb against OpenSSL per packet, same transform and size.
    std::map<std::pair<std::string, uint32_t>, std::map<std::string, const Row *>> by;
    for (const Row &r : rows)
        by[{r.transform, r.size}][r.crypto] = &r;
    for (auto &[k, m] : by) {
        if (!m.count("ipsecmb") || !m.count("openssl"))
            continue;
        const Row &a = *m["ipsecmb"], &b = *m["openssl"];
        std::printf("%s %u B: ipsecmb/openssl per packet: raw %.2fx, encap %.2fx, decap %.2fx\n",
                    k.first.c_str(), k.second, b.raw_enc / a.raw_enc, b.encap / a.encap,
                    b.decap / a.decap);
    }
}

void run_bench(const BenchOptions &o)
{
    if (o.cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(o.cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0)
            throw Failure("bench: cannot pin to CPU " + std::to_string(o.cpu));
    }
    std::vector<Backend> backends;
    if (o.crypto == "all") {
        backends = {Backend::IpsecMb, Backend::OpenSsl};
    } else {
        auto b = parse_backend(o.crypto);
        if (!b)
            throw Failure("bench: unknown --crypto '" + o.crypto +
                          "' (all, auto, openssl, ipsecmb)");
        backends = {*b};
    }
    std::vector<uint32_t> sizes;
    for (const auto &s : split_list(o.sizes)) {
        unsigned long v = std::strtoul(s.c_str(), nullptr, 10);
        if (v < 28 || v > 3500)
            throw Failure("bench: size '" + s + "' out of range (28..3500 bytes)");
        sizes.push_back(uint32_t(v));
    }
    std::vector<Row> rows;
    for (const auto &name : split_list(o.transforms)) {
        const NamedTransform *t = find_transform(name);
        if (!t) {
            std::string known;
            for (const auto &k : kTransforms)
                known += std::string(known.empty() ? "" : ", ") + k.name;
            throw Failure("bench: unknown transform '" + name + "' (" + known + ")");
        }
        SaConfig cfg = bench_sa(*t);
        for (Backend b : backends) {
            Backend r = resolve_backend(b, cfg.xf);
            if (!backend_supports(r, cfg.xf))
                continue;
            auto cipher = make_cipher(r, cfg.xf, false);
            if (!cipher)
                throw Failure("bench: " + cipher.error().message);
            for (uint32_t size : sizes) {
                Row row{name, std::string(backend_name(r)), size, 0, 0, 0, 0};
                measure_raw(**cipher, cfg.xf, size, o.seconds, row);
                if (!measure_esp(cfg, r, size, o.seconds, row))
                    throw Failure("bench: " + name + " did not round-trip; the ESP code is broken");
                rows.push_back(row);
            }
        }
    }
    if (o.json) {
        nlohmann::json j = nlohmann::json::array();
        for (const Row &r : rows)
            j.push_back({{"transform", r.transform},
                         {"crypto", r.crypto},
                         {"size", r.size},
                         {"raw_encrypt_ns", r.raw_enc},
                         {"encap_ns", r.encap},
                         {"encap_mpps", 1e3 / r.encap},
                         {"encap_gbps", r.size * 8.0 / r.encap},
                         {"encap_ratio", r.raw_enc / r.encap},
                         {"raw_decrypt_ns", r.raw_dec},
                         {"decap_ns", r.decap},
                         {"decap_mpps", 1e3 / r.decap},
                         {"decap_gbps", r.size * 8.0 / r.decap},
                         {"decap_ratio", r.raw_dec / r.decap}});
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    print_table(rows);
    print_speedups(rows);
}

}  // namespace

void register_bench_command(CLI::App &app)
{
    auto o = std::make_shared<BenchOptions>();
    CLI::App *c =
        app.add_subcommand("bench", "Raw crypto against full ESP, per transform and size");
    c->add_option("--crypto", o->crypto, "all, auto, openssl or ipsecmb");
    c->add_option("--sizes", o->sizes, "Inner packet sizes in bytes, comma separated");
    c->add_option("--transforms", o->transforms,
                  "aes128gcm, aes256gcm, aes128gmac, chacha20poly1305, aes128cbc-sha1, "
                  "aes128cbc-sha256, aes256cbc-sha256, aes256cbc-sha512, null-sha256");
    c->add_option("--seconds", o->seconds, "Time per measurement");
    c->add_option("--cpu", o->cpu, "Pin to this CPU");
    c->add_flag("--json", o->json, "Results as JSON");
    register_bench_pipeline_command(*c);
    register_bench_cpus_command(*c);
    register_bench_keys_command(*c);
    c->callback([o, c] {
        if (!c->got_subcommand("pipeline") && !c->got_subcommand("cpus") &&
            !c->got_subcommand("keys"))
            run_bench(*o);
    });
}

}  // namespace xesp::cli
