// `xesp bench keys`: what the cipher alone loses when each packet of a burst has keys of its
// own. With traffic spread over many SAs, a packet's expanded keys (and, with AES-GCM, the
// hash key's powers) are seldom in cache: each SA's are read from memory once a packet. This
// is the floor under `bench pipeline --sas N`, which adds the engine's own lookups on top.
//
// The packets are --size bytes, in a burst of 32 frames that stay in cache; a burst's ops go
// to crypt_burst() with the ciphers of the next 32 SAs in turn (round robin, as `bench
// pipeline` spreads its traffic), made in that order as the engine makes them. Each round
// measures every --keys count in turn, the first included, so that their ratios come from
// the same minute; the figure of each is its median over the rounds. Only encryption is timed:
// each burst is then decrypted with the same keys, untimed, to check every SA's cipher, and
// a decryption timed there would find the keys the encryption just read.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <openssl/crypto.h>

#include <nlohmann/json.hpp>

#include "tools/xesp/bench_transforms.h"
#include "tools/xesp/commands.h"
#include "userspace/base/clock.h"
#include "userspace/base/packet.h"
#include "userspace/base/wire.h"
#include "userspace/crypto/crypto.h"

namespace xesp::cli {

namespace {

constexpr size_t kBurst = 32;
constexpr size_t kMaxKeys = 100000;

struct KeysOptions {
    std::string keys = "1,10000,100000";
    uint32_t size = 1400;
    std::string transform = "aes128gcm";
    std::string crypto = "auto";
    double seconds = 0.5;  // per count and round
    unsigned rounds = 3;
    bool json = false;
};

struct Count {
    size_t keys;
    std::vector<double> enc;  // ns per packet, one per round
};

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Encrypt a burst (timed) and decrypt it again, each packet with its own SA's cipher both
// times; the next burst takes the next SAs.
void measure(const std::vector<std::unique_ptr<SaCipher>> &all, size_t keys, uint32_t payload,
             std::vector<uint8_t> &mem, double seconds, Count &c)
{
    CryptoOp ops[kBurst];
    SaCipher *ciphers[kBurst];
    for (size_t i = 0; i < kBurst; i++)
        ops[i] = CryptoOp{mem.data() + i * kFrameSize + kFrameHeadroom, payload, 0, false};
    size_t next = 0;
    uint64_t n = 0;
    double t_enc = 0;
    const uint64_t end = now_ns() + uint64_t(seconds * 1e9);
    while (now_ns() < end) {
        for (size_t i = 0; i < kBurst; i++) {
            ciphers[i] = all[next].get();
            next = next + 1 == keys ? 0 : next + 1;
        }
        uint64_t t0 = now_ns();
        crypt_burst(ciphers, ops, kBurst, true);
        uint64_t t1 = now_ns();
        crypt_burst(ciphers, ops, kBurst, false);
        for (const CryptoOp &op : ops)
            if (!op.ok)
                throw Failure("bench keys: a cipher did not decrypt its own output");
        t_enc += double(t1 - t0);
        n += kBurst;
    }
    c.enc.push_back(t_enc / double(n));
}

void run_keys(const KeysOptions &o)
{
    const NamedTransform *t = find_transform(o.transform);
    if (!t)
        throw Failure("bench keys: unknown --transform '" + o.transform + "'");
    auto backend = parse_backend(o.crypto);
    if (!backend)
        throw Failure("bench keys: unknown --crypto '" + o.crypto + "' (auto, openssl, ipsecmb)");
    if (o.size < 28 || o.size > 3500)
        throw Failure("bench keys: --size " + std::to_string(o.size) +
                      " out of range (28..3500 bytes)");
    if (o.rounds < 1)
        throw Failure("bench keys: --rounds must be at least 1");
    if (!(o.seconds > 0))
        throw Failure("bench keys: --seconds must be above 0");
    std::vector<Count> counts;
    std::stringstream ss(o.keys);
    for (std::string item; std::getline(ss, item, ',');) {
        char *end = nullptr;
        unsigned long k = std::strtoul(item.c_str(), &end, 10);
        if (item.empty() || *end || k < 1 || k > kMaxKeys)
            throw Failure("bench keys: --keys: '" + item + "' is not a count from 1 to 100000");
        counts.push_back(Count{k, {}});
    }
    if (counts.empty())
        throw Failure("bench keys: --keys names no count");
    size_t most = 0;
    for (const Count &c : counts)
        most = std::max(most, c.keys);

    SaConfig cfg = bench_sa(*t);
    const Backend b = resolve_backend(*backend, cfg.xf);
    std::vector<std::unique_ptr<SaCipher>> all;
    all.reserve(most);
    for (size_t i = 0; i < most; i++) {
        // Keys of their own: the SA's index in the first four bytes.
        uint8_t key[KeyBytes::kMax];
        std::memcpy(key, cfg.xf.enc_key.data(), cfg.xf.enc_key.size());
        wire::put32(key, uint32_t(i));
        cfg.xf.enc_key.assign(key, cfg.xf.enc_key.size());
        OPENSSL_cleanse(key, sizeof(key));
        auto c = make_cipher(b, cfg.xf, false);
        if (!c)
            throw Failure("bench keys: " + c.error().message);
        all.push_back(std::move(*c));
    }
    const uint32_t payload = wire::esp_padded_len(o.size, uint8_t(cfg.xf.block_size()));
    std::vector<uint8_t> mem(kBurst * kFrameSize);
    for (size_t i = 0; i < mem.size(); i++)
        mem[i] = uint8_t(i * 13);
    for (unsigned r = 0; r < o.rounds; r++)
        for (Count &c : counts)
            measure(all, c.keys, payload, mem, o.seconds, c);

    const double base = median(counts[0].enc);
    const size_t hot = all[0]->hot().len;
    if (o.json) {
        nlohmann::json rows = nlohmann::json::array();
        for (const Count &c : counts) {
            double enc = median(c.enc);
            rows.push_back({{"keys", c.keys},
                            {"encrypt_ns", enc},
                            {"encrypt_mpps", 1e3 / enc},
                            {"ratio", base / enc}});
        }
        nlohmann::json j = {{"transform", o.transform}, {"crypto", backend_name(b)},
                            {"size", o.size},           {"rounds", o.rounds},
                            {"key_state_bytes", hot},   {"counts", rows}};
        std::printf("%s\n", j.dump(2).c_str());
        return;
    }
    std::printf("%s (%s), %u B packets, bursts of %zu, each packet with the keys of the next SA; "
                "each SA's cipher state %zu B; medians of %u rounds\n",
                o.transform.c_str(), std::string(backend_name(b)).c_str(), o.size, kBurst, hot,
                o.rounds);
    std::printf("%8s %12s %7s %6s\n", "keys", "encrypt ns", "Mpps", "ratio");
    for (const Count &c : counts) {
        double enc = median(c.enc);
        std::printf("%8zu %12.1f %7.2f %6.2f\n", c.keys, enc, 1e3 / enc, base / enc);
    }
}

}  // namespace

void register_bench_keys_command(CLI::App &bench)
{
    auto o = std::make_shared<KeysOptions>();
    CLI::App *c = bench.add_subcommand(
        "keys", "The cipher alone with each packet's keys those of another SA: what spreading "
                "traffic over many SAs costs the crypto, before any lookup");
    c->add_option("--keys", o->keys,
                  "SA counts, comma separated (1..100000); ratios are to the first");
    c->add_option("--size", o->size, "Inner packet size in bytes");
    c->add_option("--transform", o->transform, "aes128gcm, aes256gcm, ...");
    c->add_option("--crypto", o->crypto, "auto, openssl or ipsecmb");
    c->add_option("--seconds", o->seconds, "Time per count and round");
    c->add_option("--rounds", o->rounds, "Rounds; each measures every count in turn");
    c->add_flag("--json", o->json, "Results as one JSON object");
    c->callback([o] { run_keys(*o); });
}

}  // namespace xesp::cli
