// Backend names, the checks every backend shares, and the choice of backend for an SA.
#include "userspace/crypto/crypto.h"

#include <string>

#include "userspace/crypto/crypto_ipsecmb.h"
#include "userspace/crypto/crypto_openssl.h"

namespace xesp {

namespace {

bool aes_key_len_ok(size_t n)
{
    return n == 16 || n == 24 || n == 32;
}

size_t hmac_digest_len(AuthAlg a)
{
    switch (a) {
    case AuthAlg::HmacSha1:
        return 20;
    case AuthAlg::HmacSha256:
        return 32;
    case AuthAlg::HmacSha384:
        return 48;
    case AuthAlg::HmacSha512:
        return 64;
    case AuthAlg::None:
        break;
    }
    return 0;
}

// Why a transform is not one ESP can use, or nullptr. ICV lengths: RFC 4106 8.1 (8, 12, 16),
// RFC 4543 and RFC 7634 (16), truncated HMAC from 4 bytes up to the digest (RFC 2404 and
// RFC 4868 use half the digest; the kernel accepts other truncations).
const char *transform_problem(const Transform &xf)
{
    if (xf.is_aead()) {
        if (xf.enc != EncAlg::None || xf.auth != AuthAlg::None)
            return "an AEAD cannot be combined with a separate cipher or HMAC";
        switch (xf.aead) {
        case AeadAlg::AesGcm:
            if (!aes_key_len_ok(xf.enc_key.size()))
                return "AES-GCM needs a 128, 192 or 256-bit key (plus the 32-bit salt)";
            if (xf.icv_len != 8 && xf.icv_len != 12 && xf.icv_len != 16)
                return "AES-GCM needs an ICV of 64, 96 or 128 bits";
            return nullptr;
        case AeadAlg::AesGmac:
            if (!aes_key_len_ok(xf.enc_key.size()))
                return "AES-GMAC needs a 128, 192 or 256-bit key (plus the 32-bit salt)";
            return xf.icv_len == 16 ? nullptr : "AES-GMAC needs a 128-bit ICV";
        case AeadAlg::ChaCha20Poly1305:
            if (xf.enc_key.size() != 32)
                return "ChaCha20-Poly1305 needs a 256-bit key (plus the 32-bit salt)";
            return xf.icv_len == 16 ? nullptr : "ChaCha20-Poly1305 needs a 128-bit ICV";
        case AeadAlg::None:
            break;
        }
        return "unknown AEAD";
    }
    if (xf.enc == EncAlg::AesCbc && !aes_key_len_ok(xf.enc_key.size()))
        return "AES-CBC needs a 128, 192 or 256-bit key";
    if (xf.enc != EncAlg::AesCbc && xf.enc != EncAlg::Null)
        return "no cipher given (use NULL encryption explicitly)";
    const size_t digest = hmac_digest_len(xf.auth);
    if (digest == 0)
        return "encryption without integrity is not supported; add an HMAC";
    if (xf.auth_key.size() == 0)
        return "the HMAC key is empty";
    if (xf.icv_len < 4 || xf.icv_len > digest)
        return "the HMAC truncation must be between 32 bits and the digest size";
    return nullptr;
}

std::string describe(const Transform &xf)
{
    std::string s;
    switch (xf.aead) {
    case AeadAlg::AesGcm:
        s = "AES-GCM";
        break;
    case AeadAlg::AesGmac:
        s = "AES-GMAC";
        break;
    case AeadAlg::ChaCha20Poly1305:
        s = "ChaCha20-Poly1305";
        break;
    case AeadAlg::None:
        s = xf.enc == EncAlg::AesCbc ? "AES-CBC" : xf.enc == EncAlg::Null ? "NULL" : "no cipher";
        s += " + ";
        switch (xf.auth) {
        case AuthAlg::HmacSha1:
            s += "HMAC-SHA1";
            break;
        case AuthAlg::HmacSha256:
            s += "HMAC-SHA-256";
            break;
        case AuthAlg::HmacSha384:
            s += "HMAC-SHA-384";
            break;
        case AuthAlg::HmacSha512:
            s += "HMAC-SHA-512";
            break;
        case AuthAlg::None:
            s += "no HMAC";
            break;
        }
        break;
    }
    if (xf.enc_key.size() != 0)
        s += " key " + std::to_string(xf.enc_key.size() * 8);
    s += " ICV " + std::to_string(xf.icv_len * 8);
    return s;
}

}  // namespace

std::string_view backend_name(Backend b)
{
    switch (b) {
    case Backend::Auto:
        return "auto";
    case Backend::OpenSsl:
        return "openssl";
    case Backend::IpsecMb:
        return "ipsecmb";
    }
    return "unknown";
}

std::optional<Backend> parse_backend(std::string_view name)
{
    for (Backend b : {Backend::Auto, Backend::OpenSsl, Backend::IpsecMb})
        if (name == backend_name(b))
            return b;
    return std::nullopt;
}

bool backend_supports(Backend backend, const Transform &xf)
{
    if (transform_problem(xf) != nullptr)
        return false;
    switch (backend) {
    case Backend::Auto:
    case Backend::OpenSsl:
        return true;
    case Backend::IpsecMb:
        return ipsecmb_implements(xf);
    }
    return false;
}

Backend resolve_backend(Backend requested, const Transform &xf)
{
    if (requested != Backend::Auto)
        return requested;
    return backend_supports(Backend::IpsecMb, xf) ? Backend::IpsecMb : Backend::OpenSsl;
}

size_t SaCipher::run_many(SaCipher *const *ciphers, CryptoOp *ops, size_t n, bool encrypt)
{
    size_t k = 1;
    while (k < n && ciphers[k] == this)
        k++;
    if (encrypt)
        this->encrypt(ops, k);
    else
        decrypt(ops, k);
    return k;
}

void crypt_burst(SaCipher *const *ciphers, CryptoOp *ops, size_t n, bool encrypt)
{
    // With traffic spread over thousands of SAs, each op's keys (about 1 KB for AES-GCM) are
    // in no cache when the burst comes: a wait for memory at each op's first round key. So the
    // keys of every SA of the burst are asked for at once, with the hint for the second-level
    // cache, where a burst's keys fit (in the first level the last ones would push out the
    // first), and their misses overlap each other and the crypto. The keys of the op kAhead
    // places on are then asked for into the first level while the one before runs.
    constexpr size_t kAhead = 2;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || ciphers[i] != ciphers[i - 1]) {
            SaCipher::Hot h = ciphers[i]->hot();
            for (size_t off = 0; off < h.len; off += 64)
                __builtin_prefetch(static_cast<const char *>(h.p) + off, 0, 2);
        }
    }
    auto prefetch = [&](size_t i) {
        if (i < n && (i == 0 || ciphers[i] != ciphers[i - 1])) {
            SaCipher::Hot h = ciphers[i]->hot();
            for (size_t off = 0; off < h.len; off += 64)
                __builtin_prefetch(static_cast<const char *>(h.p) + off);
        }
    };
    for (size_t i = 0; i < kAhead; i++)
        prefetch(i);
    for (size_t i = 0; i < n;) {
        size_t k = ciphers[i]->run_many(ciphers + i, ops + i, n - i, encrypt);
        for (size_t j = i; j < i + k; j++)
            prefetch(j + kAhead);
        i += k;
    }
}

Result<std::unique_ptr<SaCipher>> make_cipher(Backend backend, const Transform &xf, bool esn)
{
    if (const char *why = transform_problem(xf))
        return make_error("crypto: cannot use " + describe(xf) + ": " + why);
    const Backend b = resolve_backend(backend, xf);
    if (!backend_supports(b, xf))
        return make_error("crypto: backend '" + std::string(backend_name(b)) +
                          "' does not implement " + describe(xf) +
                          "; choose backend 'auto' or 'openssl'");
    return b == Backend::IpsecMb ? make_ipsecmb_cipher(xf, esn) : make_openssl_cipher(xf, esn);
}

}  // namespace xesp
