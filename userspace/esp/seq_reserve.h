// Output sequence numbers that never repeat under one key, across configuration changes and
// restarts. Two parts, both kept by the daemon in its state file:
//
// The reservation. An SA sends only numbers up to the last one the state file durably holds
// for it (Sa::reserve_to()). The daemon raises that bound ahead of the counter, by enough for
// a few seconds at the SA's own rate (never less than ReservePolicy::min_ahead), so that the
// file is rewritten about once a second under load and an SA never waits for it; if the file
// cannot be written the SA stops at its bound and counts out-seq-unreserved. After a crash a
// restarted SA starts at its bound: above anything it can have sent.
//
// The ledger. The highest number reserved under each key (AEAD key and salt, or cipher and
// authentication keys), across restarts, for every running SA's key and the
// kLedgerRetiredKeys keys retired most recently, by a fingerprint: HMAC-SHA-256 of the key
// material under a random secret kept in the state file. A new SA (an `sa update`
// that changes its limits, a delete and re-add, a flush, a restart with a config file naming
// an older counter) starts at the higher of its configured counter and the ledger's record
// for its key. The ledger holds no key: deleting an SA still wipes its key everywhere.
#pragma once

#include <array>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "userspace/esp/sa_config.h"

namespace xesp {

using KeyFingerprint = std::array<uint8_t, 32>;
// A fingerprint is an HMAC output: its first bytes are already a good hash.
struct KeyFingerprintHash {
    size_t operator()(const KeyFingerprint &fp) const
    {
        size_t h;
        std::memcpy(&h, fp.data(), sizeof(h));
        return h;
    }
};

// Keys no SA uses any more stay in the ledger until this many newer ones have left.
inline constexpr size_t kLedgerRetiredKeys = 65536;

class SeqLedger {
public:
    struct Record {
        uint64_t last = 0;   // the highest number reserved under the key
        uint64_t round = 0;  // the last round (new_round()) that recorded it
    };

    using Records = std::unordered_map<KeyFingerprint, Record, KeyFingerprintHash>;

    // A ledger with a fresh random secret and no records.
    SeqLedger();
    ~SeqLedger();
    SeqLedger(const SeqLedger &) = default;
    SeqLedger &operator=(const SeqLedger &) = default;

    KeyFingerprint fingerprint(const Transform &xf) const;
    // The highest number recorded under fp; 0 when none.
    uint64_t floor(const KeyFingerprint &fp) const;
    // Records that numbers up to `last` may have been used under fp (keeps the highest).
    void record(const KeyFingerprint &fp, uint64_t last);

    // The owner records every running SA's key once per round. forget_oldest() then drops
    // the keys left unrecorded longest, down to `keep` records; this round's are never
    // dropped. A key dropped this way and configured again starts from its configured
    // counter: keep is generous (the running SAs plus kLedgerRetiredKeys).
    void new_round() { round_++; }
    void forget_oldest(size_t keep);

    // The state file's form: the secret and the records as hex. set_secret_hex and
    // add_record_hex return false on malformed input, changing nothing.
    std::string secret_hex() const;
    bool set_secret_hex(const std::string &hex);
    const Records &records() const { return records_; }
    bool add_record_hex(const std::string &fp_hex, uint64_t last, uint64_t round);
    uint64_t round() const { return round_; }
    void set_round(uint64_t r) { round_ = r; }

private:
    // HMAC-SHA-256 under the secret with its two key blocks hashed once (RFC 2104: the
    // inner and outer states), shared by copies of the ledger: a fingerprint costs two
    // SHA-256 blocks rather than a new HMAC context. Wiped when freed.
    class Keyed;
    void key_hmac();

    std::array<uint8_t, 32> secret_{};
    std::shared_ptr<const Keyed> hmac_;
    Records records_;
    uint64_t round_ = 0;
};

// How far ahead of its counter an SA's reservation goes.
struct ReservePolicy {
    uint64_t min_ahead = uint64_t(1) << 20;  // numbers, whatever the rate
    uint64_t ahead_ns = 4'000'000'000;       // the SA's rate for this long
    uint64_t refill_ns = 2'000'000'000;      // rewritten when less than this is left
};

// The new bound for an SA at counter `oseq` sending `rate` numbers a second: oseq plus
// max(min_ahead, rate for ahead_ns), at most `limit` (the last number of the sequence space).
uint64_t reservation_target(uint64_t oseq, uint64_t rate, uint64_t limit, const ReservePolicy &p);
// Where an SA at `oseq` given the bound `last` asks for the next one (Sa::reserve_to's
// low_water): when what is left falls to refill_ns at its rate, or half of min_ahead, or half
// of what it has; never once the bound is the end of the space (`limit`).
uint64_t reservation_low_water(uint64_t oseq, uint64_t last, uint64_t rate, uint64_t limit,
                               const ReservePolicy &p);

// Two SAs share a key and salt: their nonces (RFC 4106 salt + IV = sequence number) collide
// when both send the same sequence number. True for AEAD SAs with equal key and salt.
bool shares_nonce_key(const SaConfig &a, const SaConfig &b);
// For each SA of cfg that shares its key and salt with an earlier one, the index of that
// earlier one; SIZE_MAX for the others. (Sorted by a hash of the key: fast for many SAs.)
std::vector<size_t> nonce_key_twins(const Config &cfg);
// "warning: ..." lines, one for each SA sharing its key and salt with another; with `only`,
// just the lines about the SA with only's destination and SPI.
std::string shared_key_warnings(const Config &cfg, const SaConfig *only = nullptr);

// The same, kept up to date as the configuration changes, at the cost of each change: the
// AEAD SAs by a hash of key and salt (in memory only).
class NonceKeys {
public:
    void add(const SaConfig &c);
    void remove(const SaConfig &c);
    // The warning line about sa (in cfg) and the first other SA of cfg sharing its key and
    // salt; "" when none does.
    std::string warning_for(const SaConfig &sa, const Config &cfg) const;

private:
    std::unordered_map<uint64_t, std::vector<SaKey>> by_key_;
};

}  // namespace xesp
