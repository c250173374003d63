#include "userspace/esp/seq_reserve.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

namespace xesp {

namespace {

std::string to_hex(const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    std::string s(n * 2, '0');
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = digits[p[i] >> 4];
        s[2 * i + 1] = digits[p[i] & 15];
    }
    return s;
}

template <size_t N> bool from_hex(const std::string &hex, std::array<uint8_t, N> &out)
{
    if (hex.size() != 2 * N)
        return false;
    auto nib = [](char c) -> int {
        if (c >= '0' && c <= '9')
            return c - '0';
        if (c >= 'a' && c <= 'f')
            return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
            return c - 'A' + 10;
        return -1;
    };
    std::array<uint8_t, N> tmp{};
    for (size_t i = 0; i < N; i++) {
        int hi = nib(hex[2 * i]), lo = nib(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        tmp[i] = uint8_t(hi << 4 | lo);
    }
    out = tmp;
    OPENSSL_cleanse(tmp.data(), tmp.size());
    return true;
}

}  // namespace

class SeqLedger::Keyed {
public:
    explicit Keyed(const std::array<uint8_t, 32> &secret)
    {
        std::array<uint8_t, 64> pad{};
        inner_ = start(secret, 0x36, pad);
        outer_ = start(secret, 0x5c, pad);
        OPENSSL_cleanse(pad.data(), pad.size());
    }
    ~Keyed()
    {
        EVP_MD_CTX_free(inner_);  // the providers' digest contexts are wiped when freed
        EVP_MD_CTX_free(outer_);
    }
    Keyed(const Keyed &) = delete;
    Keyed &operator=(const Keyed &) = delete;

    KeyFingerprint mac(const uint8_t *m, size_t n) const
    {
        KeyFingerprint in{}, out{};
        unsigned len = 0;
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        if (!c || !EVP_MD_CTX_copy_ex(c, inner_) || !EVP_DigestUpdate(c, m, n) ||
            !EVP_DigestFinal_ex(c, in.data(), &len) || !EVP_MD_CTX_copy_ex(c, outer_) ||
            !EVP_DigestUpdate(c, in.data(), in.size()) || !EVP_DigestFinal_ex(c, out.data(), &len))
            std::abort();  // out of memory in the digest: no fingerprint can be trusted
        EVP_MD_CTX_free(c);
        OPENSSL_cleanse(in.data(), in.size());
        return out;
    }

private:
    // SHA-256 over the 64-byte block of the key XOR `x` (the key is shorter than a block).
    static EVP_MD_CTX *start(const std::array<uint8_t, 32> &key, uint8_t x,
                             std::array<uint8_t, 64> &pad)
    {
        pad.fill(x);
        for (size_t i = 0; i < key.size(); i++)
            pad[i] = uint8_t(key[i] ^ x);
        EVP_MD_CTX *c = EVP_MD_CTX_new();
        if (!c || !EVP_DigestInit_ex(c, EVP_sha256(), nullptr) ||
            !EVP_DigestUpdate(c, pad.data(), pad.size()))
            std::abort();
        return c;
    }

    EVP_MD_CTX *inner_ = nullptr, *outer_ = nullptr;
};

SeqLedger::SeqLedger()
{
    if (RAND_bytes(secret_.data(), int(secret_.size())) != 1)
        std::abort();  // no randomness: nothing about keys can be done safely
    key_hmac();
}

void SeqLedger::key_hmac()
{
    hmac_ = std::make_shared<const Keyed>(secret_);
}

SeqLedger::~SeqLedger()
{
    OPENSSL_cleanse(secret_.data(), secret_.size());
}

KeyFingerprint SeqLedger::fingerprint(const Transform &xf) const
{
    // Length-prefixed, so that no two key layouts give the same bytes. The algorithm is left
    // out on purpose: the same AES key and salt under GCM and GMAC share the nonce space.
    std::vector<uint8_t> m;
    m.reserve(3 + xf.enc_key.size() + xf.salt.size() + xf.auth_key.size());
    m.push_back(uint8_t(xf.enc_key.size()));
    m.insert(m.end(), xf.enc_key.data(), xf.enc_key.data() + xf.enc_key.size());
    m.push_back(uint8_t(xf.is_aead() ? xf.salt.size() : 0));
    if (xf.is_aead())
        m.insert(m.end(), xf.salt.begin(), xf.salt.end());
    m.push_back(uint8_t(xf.auth_key.size()));
    m.insert(m.end(), xf.auth_key.data(), xf.auth_key.data() + xf.auth_key.size());
    KeyFingerprint fp = hmac_->mac(m.data(), m.size());
    OPENSSL_cleanse(m.data(), m.size());
    return fp;
}

uint64_t SeqLedger::floor(const KeyFingerprint &fp) const
{
    auto it = records_.find(fp);
    return it == records_.end() ? 0 : it->second.last;
}

void SeqLedger::record(const KeyFingerprint &fp, uint64_t last)
{
    Record &r = records_[fp];
    r.last = std::max(r.last, last);
    r.round = round_;
}

void SeqLedger::forget_oldest(size_t keep)
{
    if (records_.size() <= keep)
        return;
    std::vector<std::pair<uint64_t, KeyFingerprint>> old;
    for (const auto &[fp, r] : records_)
        if (r.round < round_)
            old.emplace_back(r.round, fp);
    std::sort(old.begin(), old.end());
    for (size_t i = 0; i < old.size() && records_.size() > keep; i++)
        records_.erase(old[i].second);
}

std::string SeqLedger::secret_hex() const
{
    return to_hex(secret_.data(), secret_.size());
}

bool SeqLedger::set_secret_hex(const std::string &hex)
{
    if (!from_hex(hex, secret_))
        return false;
    key_hmac();
    return true;
}

bool SeqLedger::add_record_hex(const std::string &fp_hex, uint64_t last, uint64_t round)
{
    KeyFingerprint fp{};
    if (!from_hex(fp_hex, fp))
        return false;
    Record &r = records_[fp];
    r.last = std::max(r.last, last);
    r.round = std::max(r.round, round);
    return true;
}

uint64_t reservation_target(uint64_t oseq, uint64_t rate, uint64_t limit, const ReservePolicy &p)
{
    // rate * ahead_ns / 1e9 without overflow for any rate a link can carry
    uint64_t by_rate = rate / 1000 * (p.ahead_ns / 1'000'000);
    uint64_t ahead = std::max(p.min_ahead, by_rate);
    return oseq >= limit || ahead > limit - oseq ? limit : oseq + ahead;
}

uint64_t reservation_low_water(uint64_t oseq, uint64_t last, uint64_t rate, uint64_t limit,
                               const ReservePolicy &p)
{
    if (last >= limit)
        return UINT64_MAX;
    uint64_t keep = std::max(p.min_ahead / 2, rate / 1000 * (p.refill_ns / 1'000'000));
    uint64_t left = last > oseq ? last - oseq : 0;
    return left > keep ? last - keep : oseq + left / 2;
}

bool shares_nonce_key(const SaConfig &a, const SaConfig &b)
{
    return a.xf.is_aead() && b.xf.is_aead() && a.xf.enc_key.size() &&
           a.xf.enc_key == b.xf.enc_key &&
           CRYPTO_memcmp(a.xf.salt.data(), b.xf.salt.data(), a.xf.salt.size()) == 0;
}

namespace {

// FNV-1a of key and salt, kept in memory only; 0 for an SA without AEAD key.
uint64_t nonce_key_hash(const Transform &xf)
{
    if (!xf.is_aead() || !xf.enc_key.size())
        return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t k = 0; k < xf.enc_key.size(); k++)
        h = (h ^ xf.enc_key.data()[k]) * 0x100000001b3ull;
    for (uint8_t b : xf.salt)
        h = (h ^ b) * 0x100000001b3ull;
    return h | 1;
}

std::string shared_line(const SaConfig &b, const SaConfig &a)
{
    return "warning: " + describe_sa(b.dst, b.spi) + " has the same key and salt as " +
           describe_sa(a.dst, a.spi) +
           ": nonce-reuse risk (each counts its own sequence numbers, the IVs); give each "
           "SA its own key\n";
}

}  // namespace

void NonceKeys::add(const SaConfig &c)
{
    if (uint64_t h = nonce_key_hash(c.xf))
        by_key_[h].push_back(SaKey{c.dst, c.spi});
}

void NonceKeys::remove(const SaConfig &c)
{
    uint64_t h = nonce_key_hash(c.xf);
    auto it = by_key_.find(h);
    if (!h || it == by_key_.end())
        return;
    std::erase(it->second, SaKey{c.dst, c.spi});
    if (it->second.empty())
        by_key_.erase(it);
}

std::string NonceKeys::warning_for(const SaConfig &sa, const Config &cfg) const
{
    auto it = by_key_.find(nonce_key_hash(sa.xf));
    if (it == by_key_.end())
        return "";
    for (const SaKey &k : it->second) {
        const SaConfig *other = cfg.sas.find(k);
        if (other && !(k == SaKey{sa.dst, sa.spi}) && shares_nonce_key(*other, sa))
            return shared_line(sa, *other);
    }
    return "";
}

std::vector<size_t> nonce_key_twins(const Config &cfg)
{
    std::vector<const SaConfig *> sas;
    for (const SaConfig &c : cfg.sas)
        sas.push_back(&c);
    std::vector<std::pair<uint64_t, size_t>> by_key;
    for (size_t i = 0; i < sas.size(); i++) {
        const Transform &xf = sas[i]->xf;
        if (!xf.is_aead() || !xf.enc_key.size())
            continue;
        uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of key and salt, kept in memory only
        for (size_t k = 0; k < xf.enc_key.size(); k++)
            h = (h ^ xf.enc_key.data()[k]) * 0x100000001b3ull;
        for (uint8_t b : xf.salt)
            h = (h ^ b) * 0x100000001b3ull;
        by_key.emplace_back(h, i);
    }
    std::sort(by_key.begin(), by_key.end());
    std::vector<size_t> twin(cfg.sas.size(), SIZE_MAX);
    for (size_t a = 0; a < by_key.size(); a++)
        for (size_t b = a + 1; b < by_key.size() && by_key[b].first == by_key[a].first; b++) {
            size_t i = by_key[a].second, j = by_key[b].second;  // i < j: sorted by index too
            if (twin[j] == SIZE_MAX && shares_nonce_key(*sas[i], *sas[j]))
                twin[j] = i;
        }
    return twin;
}

std::string shared_key_warnings(const Config &cfg, const SaConfig *only)
{
    std::vector<size_t> twin = nonce_key_twins(cfg);
    std::vector<const SaConfig *> sas;
    for (const SaConfig &c : cfg.sas)
        sas.push_back(&c);
    std::string out;
    for (size_t j = 0; j < twin.size(); j++) {
        if (twin[j] == SIZE_MAX)
            continue;
        const SaConfig &a = *sas[twin[j]], &b = *sas[j];
        auto is_only = [&](const SaConfig &s) { return s.dst == only->dst && s.spi == only->spi; };
        if (only && !is_only(a) && !is_only(b))
            continue;
        out += shared_line(b, a);
    }
    return out;
}

}  // namespace xesp
