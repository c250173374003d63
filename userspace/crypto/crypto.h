// The crypto backends behind one interface. An SaCipher is prepared once per SA and worker
// (keys expanded, contexts allocated); encrypt()/decrypt() then run a burst of packets in
// place without allocating.
//
// Every op describes one ESP packet laid out contiguously as on the wire (RFC 4303 2):
//
//   esp -> | SPI (4) | seq low (4) | IV (iv_len) | payload (payload_len) | ICV (icv_len) |
//
// payload is plaintext + padding + pad length + next header and is encrypted in place.
// What each transform authenticates:
//   AES-GCM / ChaCha20-Poly1305 (RFC 4106, RFC 7634): nonce = salt || IV,
//       AAD = SPI || seq low, or SPI || seq high || seq low with ESN (RFC 4106 5).
//   AES-GMAC (RFC 4543): nothing encrypted; AAD = SPI || [seq high ||] seq low || IV || payload.
//   enc + HMAC (RFC 4303 2.8, 3.3.2.1): ICV = trunc(HMAC(SPI || seq low || IV || payload
//       [|| seq high with ESN])), computed over the ciphertext (encrypt-then-MAC).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"

namespace xesp {

enum class Backend : uint8_t { Auto, OpenSsl, IpsecMb };

std::string_view backend_name(Backend b);
std::optional<Backend> parse_backend(std::string_view name);  // "auto", "openssl", "ipsecmb"

struct CryptoOp {
    uint8_t *esp;          // start of the ESP header
    uint32_t payload_len;  // bytes between the IV and the ICV
    uint32_t seq_hi;       // ESN high half (host order); the cipher's only when ESN is on
    bool ok;               // out: encrypt done / decrypt authenticated and decrypted
    // Encap, for esp_encap_write() (not the cipher's): the padding's length, and the sequence
    // number's low half.
    uint8_t pad;
    uint32_t seq_lo;
};

class SaCipher {
public:
    virtual ~SaCipher() = default;
    // Encrypt each op's payload in place and write its ICV. ok=false only on a backend failure.
    virtual void encrypt(CryptoOp *ops, size_t n) = 0;
    // Verify each op's ICV (constant time) and, if good, decrypt the payload in place.
    // ok=false means the ICV did not verify (or the backend failed); the payload is then
    // unspecified and must not be used.
    virtual void decrypt(CryptoOp *ops, size_t n) = 0;
    virtual Backend backend() const = 0;
    // Whether several threads may run encrypt() and decrypt() at once: intel-ipsec-mb keeps
    // a call's state in a manager per thread and only reads the SA's expanded keys; an
    // OpenSSL EVP context carries the call's state, one per SA.
    bool thread_safe() const { return backend() == Backend::IpsecMb; }

    // The bytes encrypt() and decrypt() read for every op, for an SA to prefetch: with many
    // SAs they are seldom in cache. They are the object (with intel-ipsec-mb, expanded keys
    // and hash states included; OpenSSL's key schedules are out of reach). Its size is a field
    // of the object, not the answer of a virtual call, which would load the vtable's entry
    // after the object's first line and call it before the size was known.
    struct Hot {
        const void *p;
        size_t len;
    };
    Hot hot() const { return {this, hot_len_}; }

    // For crypt_burst(): runs ops[0, k) with ciphers[0, k) for the longest run from the start
    // that this cipher's backend takes in one go (ciphers[0] is this cipher) and returns k.
    // This one takes the ops of ciphers[0] alone, as encrypt() or decrypt().
    virtual size_t run_many(SaCipher *const *ciphers, CryptoOp *ops, size_t n, bool encrypt);
    // Ciphers with the same non-null lane group have a run_many() that takes any of them.
    const void *lane_group() const { return lane_group_; }

protected:
    explicit SaCipher(uint32_t hot_len) : hot_len_(hot_len) {}  // the backend's sizeof
    const void *lane_group_ = nullptr;

private:
    const uint32_t hot_len_;
};

// The ops of many SAs in one call: ops[i] with ciphers[i], as each cipher's encrypt() or
// decrypt() would. A backend that works on several packets side by side (intel-ipsec-mb's job
// API, for AES-CBC and HMAC) fills its lanes with packets of different SAs: with traffic spread
// over many SAs, one SA's packets in a burst are few.
void crypt_burst(SaCipher *const *ciphers, CryptoOp *ops, size_t n, bool encrypt);

// Whether a backend implements a transform (key sizes and ICV length included).
bool backend_supports(Backend backend, const Transform &xf);

// Auto picks intel-ipsec-mb where it supports the transform, else OpenSSL.
Backend resolve_backend(Backend requested, const Transform &xf);

// Prepares a cipher for one SA. esn selects whether seq_hi is authenticated.
Result<std::unique_ptr<SaCipher>> make_cipher(Backend backend, const Transform &xf, bool esn);

}  // namespace xesp
