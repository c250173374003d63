// The control part of an SA and of a policy: what the operator configured, in the words of
// `ip xfrm state` / `ip xfrm policy`. The runtime part (sequence numbers, replay window,
// prepared cipher contexts, counters) lives in sa.h.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <openssl/crypto.h>

#include "userspace/base/ip.h"
#include "userspace/esp/keyed_list.h"

namespace xesp {

// Key material. Fixed storage (no heap copy to forget about) that is wiped when it dies.
class KeyBytes {
public:
    static constexpr size_t kMax = 128;

    KeyBytes() = default;
    KeyBytes(const uint8_t *p, size_t n) { assign(p, n); }
    KeyBytes(const KeyBytes &o) { assign(o.data(), o.size()); }
    KeyBytes &operator=(const KeyBytes &o)
    {
        if (this != &o)
            assign(o.data(), o.size());
        return *this;
    }
    ~KeyBytes() { wipe(); }

    bool assign(const uint8_t *p, size_t n)
    {
        wipe();
        if (n > kMax)
            return false;
        if (n)
            std::memcpy(b_.data(), p, n);
        n_ = n;
        return true;
    }
    void wipe()
    {
        OPENSSL_cleanse(b_.data(), b_.size());
        n_ = 0;
    }
    const uint8_t *data() const { return b_.data(); }
    size_t size() const { return n_; }
    bool operator==(const KeyBytes &o) const
    {
        return n_ == o.n_ && CRYPTO_memcmp(b_.data(), o.b_.data(), n_) == 0;
    }

private:
    std::array<uint8_t, kMax> b_{};
    size_t n_ = 0;
};

// The 4-byte nonce salt of an AEAD (RFC 4106 4, RFC 4543 3.2, RFC 7634 2): the last bytes of
// the key material, secret like the key, so wiped like KeyBytes when it dies. An array
// otherwise: `salt = {1, 2, 3, 4}`, data(), ==.
struct Salt : std::array<uint8_t, 4> {
    ~Salt() { OPENSSL_cleanse(data(), size()); }
};

enum class AeadAlg : uint8_t { None, AesGcm, AesGmac, ChaCha20Poly1305 };
enum class EncAlg : uint8_t { None, Null, AesCbc };
enum class AuthAlg : uint8_t { None, HmacSha1, HmacSha256, HmacSha384, HmacSha512 };

// One ESP transform: either an AEAD (aead != None) or enc + auth (encrypt-then-MAC).
struct Transform {
    AeadAlg aead = AeadAlg::None;
    EncAlg enc = EncAlg::None;
    AuthAlg auth = AuthAlg::None;
    KeyBytes enc_key;     // cipher key; for an AEAD without the 4-byte salt
    Salt salt{};          // AEAD only
    KeyBytes auth_key;    // HMAC key
    uint8_t icv_len = 0;  // ICV bytes on the wire (AEAD ICV bits / 8, auth-trunc)

    bool is_aead() const { return aead != AeadAlg::None; }
    // IV bytes on the wire: 8 for the AEADs, 16 for AES-CBC, 0 for NULL.
    uint8_t iv_len() const
    {
        if (is_aead())
            return 8;
        return enc == EncAlg::AesCbc ? 16 : 0;
    }
    // The payload (plaintext + padding + 2 trailer bytes) is a multiple of this (RFC 4303 2.4).
    uint8_t block_size() const { return enc == EncAlg::AesCbc && !is_aead() ? 16 : 4; }
    std::string name() const;  // e.g. "rfc4106(gcm(aes)) 128 ICV 128"
};

enum class Mode : uint8_t { Transport, Tunnel };
enum class Dir : uint8_t { Unspec, In, Out, Fwd };

struct NatTEncap {  // `encap espinudp SPORT DPORT OADDR` (RFC 3948)
    uint16_t sport = 0;
    uint16_t dport = 0;
    IpAddr oaddr;
};

// `limit WHAT N`, as ip xfrm: byte-soft|byte-hard|packet-soft|packet-hard count what the SA
// carried; time-soft|time-hard are seconds since the SA was added, time-use-soft|time-use-hard
// seconds since it first carried a packet. UINT64_MAX: no limit.
struct Lifetime {
    uint64_t soft_bytes = UINT64_MAX;
    uint64_t hard_bytes = UINT64_MAX;
    uint64_t soft_packets = UINT64_MAX;
    uint64_t hard_packets = UINT64_MAX;
    uint64_t soft_add_s = UINT64_MAX;
    uint64_t hard_add_s = UINT64_MAX;
    uint64_t soft_use_s = UINT64_MAX;
    uint64_t hard_use_s = UINT64_MAX;

    bool has_time() const
    {
        return soft_add_s != UINT64_MAX || hard_add_s != UINT64_MAX || soft_use_s != UINT64_MAX ||
               hard_use_s != UINT64_MAX;
    }
    bool operator==(const Lifetime &) const = default;
};

struct SaConfig {
    IpAddr src;
    IpAddr dst;
    uint32_t spi = 0;  // host order
    uint32_t reqid = 0;
    Mode mode = Mode::Transport;  // ip xfrm's default
    Transform xf;
    bool esn = false;                // `flag esn`
    uint32_t replay_window = 0;      // packets; 0 disables anti-replay (as ip xfrm)
    uint32_t seq = 0, seq_hi = 0;    // highest received (replay-seq, replay-seq-hi)
    uint32_t oseq = 0, oseq_hi = 0;  // last sent (replay-oseq, replay-oseq-hi)
    std::optional<NatTEncap> encap;
    std::optional<Selector> sel;
    Lifetime lifetime;
    Dir dir = Dir::Unspec;  // optional `dir in|out`
};

enum class Action : uint8_t { Allow, Block };

struct PolicyTmpl {  // `tmpl src A dst B proto esp [spi S] [reqid R] mode M`
    IpAddr src;      // unset family = any (transport templates omit them)
    IpAddr dst;
    uint32_t spi = 0;    // 0 = any
    uint32_t reqid = 0;  // 0 = any
    Mode mode = Mode::Transport;
};

struct PolicyConfig {
    Selector sel;
    Dir dir = Dir::Out;
    uint32_t priority = 0;  // lower value wins, as in the kernel
    Action action = Action::Allow;
    std::optional<PolicyTmpl> tmpl;
};

// What names an SA (destination and SPI) and a policy (selector and direction), in `ip xfrm`
// and in every table of them.
struct SaKey {
    IpAddr dst;
    uint32_t spi;
    bool operator==(const SaKey &o) const = default;
};
struct PolicyKey {
    Selector sel;
    Dir dir;
    bool operator==(const PolicyKey &o) const = default;
};
struct ConfigKeyHash {
    size_t operator()(const SaKey &k) const;
    size_t operator()(const PolicyKey &k) const;
    SaKey operator()(const SaConfig &c) const { return SaKey{c.dst, c.spi}; }
    PolicyKey operator()(const PolicyConfig &p) const { return PolicyKey{p.sel, p.dir}; }
};

// The SAs and policies the operator configured, as an Engine is built from them, in the order
// they were added. config/config.h changes them by parsed `ip xfrm` commands and reads and
// writes batch files.
class Config {
public:
    KeyedList<SaConfig, SaKey, ConfigKeyHash, ConfigKeyHash> sas;
    KeyedList<PolicyConfig, PolicyKey, ConfigKeyHash, ConfigKeyHash> policies;

    const SaConfig *find_sa(const IpAddr &dst, uint32_t spi) const
    {
        return sas.find(SaKey{dst, spi});
    }
    const PolicyConfig *find_policy(const Selector &sel, Dir dir) const
    {
        return policies.find(PolicyKey{sel, dir});
    }

    bool operator==(const Config &o) const;
};

// One change to a configuration, net: at most one entry per SA and per policy.
struct ConfigChange {
    std::vector<SaConfig> put_sas;  // added, or replacing the SA of the same key
    std::vector<SaKey> del_sas;
    std::vector<PolicyConfig> put_policies;  // added, or replacing the policy of the same key
    std::vector<PolicyKey> del_policies;
    bool empty() const
    {
        return put_sas.empty() && del_sas.empty() && put_policies.empty() && del_policies.empty();
    }
};
// Applies ch to cfg (which must hold every key ch deletes).
void apply_change(Config &cfg, const ConfigChange &ch);
void apply_change(Config &cfg, ConfigChange &&ch);  // the same, the entries moved

// "SA dst 10.0.0.2 spi 0x00001000": how messages name one SA (a policy: describe_policy in
// config/xfrm_grammar.h).
std::string describe_sa(const IpAddr &dst, uint32_t spi);
std::string hex32(uint32_t v);  // "0x%08x"

// Field-by-field equality of configurations (keys compared in constant time).
bool same_sa(const SaConfig &a, const SaConfig &b);
bool same_policy(const PolicyConfig &a, const PolicyConfig &b);
// The same algorithms and key material (salt included): what a peer's packets under a can be
// replayed to b, and what shares b's nonces.
bool same_keys(const SaConfig &a, const SaConfig &b);

}  // namespace xesp
