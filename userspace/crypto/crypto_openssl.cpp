// The OpenSSL 3 backend: the ciphers through EVP_CIPHER, HMAC through the SHA functions.
//
// Algorithms are fetched and contexts keyed once, in make_openssl_cipher(). Per packet a cipher
// context is only re-initialised with the packet's IV: a NULL cipher and key keep the fetched
// algorithm and the expanded key. HMAC starts from hash states keyed once and copied by value
// per packet. Encryption and decryption have a context each so neither re-keys the other.
#include "userspace/crypto/crypto_openssl.h"

#include <array>
#include <climits>
#include <cstring>
#include <string>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/sha.h>

#ifdef OPENSSL_NO_DEPRECATED_3_0
#error "the OpenSSL backend needs SHA*_Init/Update/Final, which this OpenSSL was built without"
#endif

namespace xesp {

namespace {

constexpr size_t kEspHeaderLen = 8;  // SPI + sequence number low half
constexpr size_t kAeadIvLen = 8;     // RFC 4106 3.1, RFC 4543 3.1, RFC 7634 2
constexpr size_t kNonceLen = 12;     // salt || IV

struct CipherFree {
    void operator()(EVP_CIPHER *p) const { EVP_CIPHER_free(p); }
};
struct CipherCtxFree {
    void operator()(EVP_CIPHER_CTX *p) const { EVP_CIPHER_CTX_free(p); }
};
using CipherPtr = std::unique_ptr<EVP_CIPHER, CipherFree>;
using CipherCtxPtr = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

Error openssl_error(const std::string &what)
{
    char reason[256] = "no detail from OpenSSL";
    if (unsigned long e = ERR_get_error())
        ERR_error_string_n(e, reason, sizeof reason);
    ERR_clear_error();
    return make_error("crypto (openssl): " + what + ": " + reason);
}

void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = uint8_t(v >> 24);
    p[1] = uint8_t(v >> 16);
    p[2] = uint8_t(v >> 8);
    p[3] = uint8_t(v);
}

const char *cipher_name(const Transform &xf)
{
    const size_t k = xf.enc_key.size();
    switch (xf.aead) {
    case AeadAlg::AesGcm:
    case AeadAlg::AesGmac:
        return k == 16 ? "AES-128-GCM" : k == 24 ? "AES-192-GCM" : "AES-256-GCM";
    case AeadAlg::ChaCha20Poly1305:
        return "ChaCha20-Poly1305";
    case AeadAlg::None:
        break;
    }
    return k == 16 ? "AES-128-CBC" : k == 24 ? "AES-192-CBC" : "AES-256-CBC";
}

Result<CipherPtr> fetch_cipher(const char *name)
{
    CipherPtr c(EVP_CIPHER_fetch(nullptr, name, nullptr));
    if (!c)
        return openssl_error(std::string("fetching ") + name);
    return c;
}

// A context bound to the cipher and key for one direction; packets then only bring an IV.
Result<CipherCtxPtr> keyed_context(const EVP_CIPHER *cipher, const KeyBytes &key, bool encrypt)
{
    CipherCtxPtr ctx(EVP_CIPHER_CTX_new());
    if (!ctx ||
        EVP_CipherInit_ex(ctx.get(), cipher, nullptr, key.data(), nullptr, encrypt ? 1 : 0) != 1)
        return openssl_error(std::string("keying ") + EVP_CIPHER_get0_name(cipher));
    if (EVP_CIPHER_CTX_get_key_length(ctx.get()) != int(key.size()))
        return make_error("crypto (openssl): key length does not fit " +
                          std::string(EVP_CIPHER_get0_name(cipher)));
    return ctx;
}

bool fits_int(uint32_t n)
{
    return n <= uint32_t(INT_MAX) - 64;
}

// AES-GCM (RFC 4106), AES-GMAC (RFC 4543) and ChaCha20-Poly1305 (RFC 7634). All three are one
// AEAD call with nonce = salt || IV; GMAC encrypts nothing and authenticates the IV and payload
// as additional data.
class EvpAead final : public SaCipher {
public:
    EvpAead(CipherPtr cipher, CipherCtxPtr enc, CipherCtxPtr dec, const Transform &xf, bool esn)
            : SaCipher(sizeof(EvpAead)), cipher_(std::move(cipher)), enc_(std::move(enc)),
              dec_(std::move(dec)), salt_(xf.salt), icv_len_(xf.icv_len),
              gmac_(xf.aead == AeadAlg::AesGmac), esn_(esn)
    {}
    ~EvpAead() override { OPENSSL_cleanse(salt_.data(), salt_.size()); }

    void encrypt(CryptoOp *ops, size_t n) override
    {
        for (size_t i = 0; i < n; i++)
            ops[i].ok = run(enc_.get(), ops[i], true);
    }
    void decrypt(CryptoOp *ops, size_t n) override
    {
        for (size_t i = 0; i < n; i++)
            ops[i].ok = run(dec_.get(), ops[i], false);
    }
    Backend backend() const override { return Backend::OpenSsl; }

private:
    bool run(EVP_CIPHER_CTX *ctx, const CryptoOp &op, bool encrypt);
    bool add_aad(EVP_CIPHER_CTX *ctx, const CryptoOp &op, bool encrypt);

    CipherPtr cipher_;
    CipherCtxPtr enc_;
    CipherCtxPtr dec_;
    std::array<uint8_t, 4> salt_;
    uint8_t icv_len_;
    bool gmac_;
    bool esn_;
};

// AAD = SPI || [seq high ||] seq low (RFC 4106 5), and for GMAC the IV and payload after it
// (RFC 4543 3.3).
bool EvpAead::add_aad(EVP_CIPHER_CTX *ctx, const CryptoOp &op, bool encrypt)
{
    auto update = encrypt ? EVP_EncryptUpdate : EVP_DecryptUpdate;
    int n = 0;
    if (esn_) {
        uint8_t head[12];
        std::memcpy(head, op.esp, 4);
        put_be32(head + 4, op.seq_hi);
        std::memcpy(head + 8, op.esp + 4, 4);
        if (update(ctx, nullptr, &n, head, sizeof head) != 1)
            return false;
    } else if (update(ctx, nullptr, &n, op.esp, kEspHeaderLen) != 1) {
        return false;
    }
    if (!gmac_)
        return true;
    return update(ctx, nullptr, &n, op.esp + kEspHeaderLen, int(kAeadIvLen + op.payload_len)) == 1;
}

bool EvpAead::run(EVP_CIPHER_CTX *ctx, const CryptoOp &op, bool encrypt)
{
    if (!fits_int(op.payload_len))
        return false;
    uint8_t *iv = op.esp + kEspHeaderLen;
    uint8_t *payload = iv + kAeadIvLen;
    uint8_t *icv = payload + op.payload_len;
    uint8_t nonce[kNonceLen];
    std::memcpy(nonce, salt_.data(), 4);
    std::memcpy(nonce + 4, iv, kAeadIvLen);

    // The tag travels as a provider parameter directly: EVP_CIPHER_CTX_ctrl() would build
    // the same parameter and costs more than the AES work on a small packet.
    OSSL_PARAM tag[] = {
        OSSL_PARAM_construct_octet_string(OSSL_CIPHER_PARAM_AEAD_TAG, icv, icv_len_),
        OSSL_PARAM_construct_end(),
    };
    int n = 0;
    uint8_t tail[16];
    if (encrypt) {
        if (EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) != 1 ||
            !add_aad(ctx, op, true))
            return false;
        if (!gmac_ && op.payload_len != 0 &&
            EVP_EncryptUpdate(ctx, payload, &n, payload, int(op.payload_len)) != 1)
            return false;
        return EVP_EncryptFinal_ex(ctx, tail, &n) == 1 && EVP_CIPHER_CTX_get_params(ctx, tag) == 1;
    }
    // The expected tag goes in first; EVP_DecryptFinal_ex() compares it in constant time.
    if (EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) != 1 ||
        EVP_CIPHER_CTX_set_params(ctx, tag) != 1 || !add_aad(ctx, op, false))
        return false;
    if (!gmac_ && op.payload_len != 0 &&
        EVP_DecryptUpdate(ctx, payload, &n, payload, int(op.payload_len)) != 1)
        return false;
    return EVP_DecryptFinal_ex(ctx, tail, &n) == 1;
}

// The hash functions under HMAC. Their contexts are plain structs that copy by value, which the
// per-packet HMAC below relies on: in OpenSSL 3.0 every EVP route to a keyed HMAC state
// (EVP_MAC_init() with a NULL key, HMAC_Init_ex(), EVP_MD_CTX_copy_ex()) duplicates provider
// contexts on the heap. These functions are deprecated since 3.0 but present, so the warning is
// silenced for these wrappers only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct Sha1 {
    using Ctx = SHA_CTX;
    static constexpr size_t kBlock = SHA_CBLOCK, kDigest = SHA_DIGEST_LENGTH;
    static bool init(Ctx *c) { return SHA1_Init(c) == 1; }
    static bool update(Ctx *c, const void *p, size_t n) { return SHA1_Update(c, p, n) == 1; }
    static bool finish(uint8_t *md, Ctx *c) { return SHA1_Final(md, c) == 1; }
};
struct Sha256 {
    using Ctx = SHA256_CTX;
    static constexpr size_t kBlock = SHA256_CBLOCK, kDigest = SHA256_DIGEST_LENGTH;
    static bool init(Ctx *c) { return SHA256_Init(c) == 1; }
    static bool update(Ctx *c, const void *p, size_t n) { return SHA256_Update(c, p, n) == 1; }
    static bool finish(uint8_t *md, Ctx *c) { return SHA256_Final(md, c) == 1; }
};
struct Sha384 {
    using Ctx = SHA512_CTX;
    static constexpr size_t kBlock = SHA512_CBLOCK, kDigest = SHA384_DIGEST_LENGTH;
    static bool init(Ctx *c) { return SHA384_Init(c) == 1; }
    static bool update(Ctx *c, const void *p, size_t n) { return SHA384_Update(c, p, n) == 1; }
    static bool finish(uint8_t *md, Ctx *c) { return SHA384_Final(md, c) == 1; }
};
struct Sha512 {
    using Ctx = SHA512_CTX;
    static constexpr size_t kBlock = SHA512_CBLOCK, kDigest = SHA512_DIGEST_LENGTH;
    static bool init(Ctx *c) { return SHA512_Init(c) == 1; }
    static bool update(Ctx *c, const void *p, size_t n) { return SHA512_Update(c, p, n) == 1; }
    static bool finish(uint8_t *md, Ctx *c) { return SHA512_Final(md, c) == 1; }
};
#pragma GCC diagnostic pop

// HMAC(K, m) = H((K ^ opad) || H((K ^ ipad) || m)) (RFC 2104). The hash states after the first
// block of each half depend on the key alone: set_key() computes them once, and mac() starts
// from copies of them. Those two states are as good as the key and are wiped with the object;
// a per-packet copy ends finished, holding only the digest it produced.
template <class H> class HmacStates {
public:
    HmacStates() = default;
    HmacStates(const HmacStates &) = delete;
    HmacStates &operator=(const HmacStates &) = delete;
    ~HmacStates()
    {
        OPENSSL_cleanse(&inner_, sizeof inner_);
        OPENSSL_cleanse(&outer_, sizeof outer_);
    }

    bool set_key(const KeyBytes &key)
    {
        uint8_t k[H::kBlock] = {};  // K padded with zeros to the block, hashed first if longer
        bool ok = true;
        if (key.size() > H::kBlock) {
            typename H::Ctx c;
            ok = H::init(&c) && H::update(&c, key.data(), key.size()) && H::finish(k, &c);
            OPENSSL_cleanse(&c, sizeof c);
        } else if (key.size() != 0) {
            std::memcpy(k, key.data(), key.size());
        }
        uint8_t block[H::kBlock];
        for (size_t i = 0; i < H::kBlock; i++)
            block[i] = k[i] ^ 0x36;
        ok = ok && H::init(&inner_) && H::update(&inner_, block, H::kBlock);
        for (size_t i = 0; i < H::kBlock; i++)
            block[i] = k[i] ^ 0x5c;
        ok = ok && H::init(&outer_) && H::update(&outer_, block, H::kBlock);
        OPENSSL_cleanse(k, sizeof k);
        OPENSSL_cleanse(block, sizeof block);
        return ok;
    }

    // HMAC over msg || tail.
    bool mac(const uint8_t *msg, size_t len, const uint8_t *tail, size_t tail_len,
             uint8_t (&digest)[H::kDigest]) const
    {
        typename H::Ctx c = inner_;
        uint8_t inner[H::kDigest];
        if (!H::update(&c, msg, len) || (tail_len != 0 && !H::update(&c, tail, tail_len)) ||
            !H::finish(inner, &c)) {
            OPENSSL_cleanse(&c, sizeof c);
            return false;
        }
        c = outer_;
        if (!H::update(&c, inner, sizeof inner) || !H::finish(digest, &c)) {
            OPENSSL_cleanse(&c, sizeof c);
            return false;
        }
        return true;
    }

private:
    typename H::Ctx inner_{};
    typename H::Ctx outer_{};
};

// AES-CBC (RFC 3602) or NULL encryption (RFC 2410) with a truncated HMAC over
// SPI || seq low || IV || ciphertext [|| seq high] (RFC 4303 3.3.2.1): encrypt, then MAC; on the
// way in, verify the MAC before decrypting anything.
template <class H> class EvpEncAuth final : public SaCipher {
public:
    EvpEncAuth(CipherPtr cipher, CipherCtxPtr enc, CipherCtxPtr dec, const Transform &xf, bool esn)
            : SaCipher(sizeof(EvpEncAuth)), cipher_(std::move(cipher)), enc_(std::move(enc)),
              dec_(std::move(dec)), iv_len_(xf.iv_len()), icv_len_(xf.icv_len), esn_(esn)
    {}
    bool key_hmac(const KeyBytes &key) { return hmac_.set_key(key); }

    void encrypt(CryptoOp *ops, size_t n) override
    {
        for (size_t i = 0; i < n; i++)
            ops[i].ok = seal(ops[i]);
    }
    void decrypt(CryptoOp *ops, size_t n) override
    {
        for (size_t i = 0; i < n; i++)
            ops[i].ok = open(ops[i]);
    }
    Backend backend() const override { return Backend::OpenSsl; }

private:
    bool seal(const CryptoOp &op);
    bool open(const CryptoOp &op);
    bool cbc(EVP_CIPHER_CTX *ctx, const CryptoOp &op, bool encrypt);
    bool hmac(const CryptoOp &op, uint8_t (&digest)[H::kDigest]) const;

    CipherPtr cipher_;  // all three null for NULL encryption
    CipherCtxPtr enc_;
    CipherCtxPtr dec_;
    HmacStates<H> hmac_;
    uint8_t iv_len_;
    uint8_t icv_len_;
    bool esn_;
};

template <class H> bool EvpEncAuth<H>::cbc(EVP_CIPHER_CTX *ctx, const CryptoOp &op, bool encrypt)
{
    if (!ctx)
        return true;
    // CBC works on whole blocks, and ESP padding (RFC 4303 2.4) makes every payload whole.
    if (op.payload_len == 0 || op.payload_len % 16 != 0 || !fits_int(op.payload_len))
        return false;
    const uint8_t *iv = op.esp + kEspHeaderLen;
    uint8_t *payload = op.esp + kEspHeaderLen + iv_len_;
    int n = 0;
    if (encrypt)
        return EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv) == 1 &&
               EVP_EncryptUpdate(ctx, payload, &n, payload, int(op.payload_len)) == 1 &&
               n == int(op.payload_len);
    return EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, iv) == 1 &&
           EVP_DecryptUpdate(ctx, payload, &n, payload, int(op.payload_len)) == 1 &&
           n == int(op.payload_len);
}

template <class H> bool EvpEncAuth<H>::hmac(const CryptoOp &op, uint8_t (&digest)[H::kDigest]) const
{
    uint8_t seq_hi[4];
    if (esn_)
        put_be32(seq_hi, op.seq_hi);
    return hmac_.mac(op.esp, kEspHeaderLen + iv_len_ + op.payload_len, seq_hi,
                     esn_ ? sizeof seq_hi : 0, digest);
}

template <class H> bool EvpEncAuth<H>::seal(const CryptoOp &op)
{
    uint8_t digest[H::kDigest];
    if (!cbc(enc_.get(), op, true) || !hmac(op, digest))
        return false;
    std::memcpy(op.esp + kEspHeaderLen + iv_len_ + op.payload_len, digest, icv_len_);
    return true;
}

template <class H> bool EvpEncAuth<H>::open(const CryptoOp &op)
{
    uint8_t digest[H::kDigest];
    if (!hmac(op, digest))
        return false;
    const uint8_t *icv = op.esp + kEspHeaderLen + iv_len_ + op.payload_len;
    if (CRYPTO_memcmp(digest, icv, icv_len_) != 0)
        return false;
    return cbc(dec_.get(), op, false);
}

Result<std::unique_ptr<SaCipher>> make_aead(const Transform &xf, bool esn)
{
    auto cipher = fetch_cipher(cipher_name(xf));
    if (!cipher)
        return cipher.error();
    auto enc = keyed_context(cipher->get(), xf.enc_key, true);
    if (!enc)
        return enc.error();
    auto dec = keyed_context(cipher->get(), xf.enc_key, false);
    if (!dec)
        return dec.error();
    return std::unique_ptr<SaCipher>(
        std::make_unique<EvpAead>(std::move(*cipher), std::move(*enc), std::move(*dec), xf, esn));
}

template <class H>
Result<std::unique_ptr<SaCipher>> make_enc_auth_with(CipherPtr cipher, CipherCtxPtr enc,
                                                     CipherCtxPtr dec, const Transform &xf,
                                                     bool esn)
{
    if (xf.icv_len > H::kDigest)
        return make_error("crypto (openssl): ICV longer than the HMAC digest");
    auto c =
        std::make_unique<EvpEncAuth<H>>(std::move(cipher), std::move(enc), std::move(dec), xf, esn);
    if (!c->key_hmac(xf.auth_key))
        return openssl_error("keying HMAC");
    return std::unique_ptr<SaCipher>(std::move(c));
}

Result<std::unique_ptr<SaCipher>> make_enc_auth(const Transform &xf, bool esn)
{
    CipherPtr cipher;
    CipherCtxPtr enc, dec;
    if (xf.enc == EncAlg::AesCbc) {
        auto c = fetch_cipher(cipher_name(xf));
        if (!c)
            return c.error();
        auto e = keyed_context(c->get(), xf.enc_key, true);
        if (!e)
            return e.error();
        auto d = keyed_context(c->get(), xf.enc_key, false);
        if (!d)
            return d.error();
        // ESP pads the payload itself (RFC 4303 2.4); OpenSSL must not add PKCS#7 padding.
        if (EVP_CIPHER_CTX_set_padding(e->get(), 0) != 1 ||
            EVP_CIPHER_CTX_set_padding(d->get(), 0) != 1)
            return openssl_error("disabling CBC padding");
        cipher = std::move(*c);
        enc = std::move(*e);
        dec = std::move(*d);
    }
    switch (xf.auth) {
    case AuthAlg::HmacSha1:
        return make_enc_auth_with<Sha1>(std::move(cipher), std::move(enc), std::move(dec), xf, esn);
    case AuthAlg::HmacSha256:
        return make_enc_auth_with<Sha256>(std::move(cipher), std::move(enc), std::move(dec), xf,
                                          esn);
    case AuthAlg::HmacSha384:
        return make_enc_auth_with<Sha384>(std::move(cipher), std::move(enc), std::move(dec), xf,
                                          esn);
    case AuthAlg::HmacSha512:
        return make_enc_auth_with<Sha512>(std::move(cipher), std::move(enc), std::move(dec), xf,
                                          esn);
    case AuthAlg::None:
        break;
    }
    return make_error("crypto (openssl): encryption without HMAC");
}

}  // namespace

Result<std::unique_ptr<SaCipher>> make_openssl_cipher(const Transform &xf, bool esn)
{
    if (!backend_supports(Backend::OpenSsl, xf))
        return make_error("crypto (openssl): transform not supported");
    return xf.is_aead() ? make_aead(xf, esn) : make_enc_auth(xf, esn);
}

}  // namespace xesp
