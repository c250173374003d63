// The intel-ipsec-mb backend.
//
// AES-GCM uses the direct API: one call per packet is the library's fastest path for a single
// buffer. AES-CBC/NULL + HMAC goes through the job API for the whole burst, so that the
// multi-buffer code hashes and ciphers several packets side by side in SIMD lanes. Whether a
// GCM call went through is read from the context it filled, where the library version allows
// (kGcmLengthInContext), not from the library's error variable: that takes a call per packet,
// and at 100,000 SAs the call through a pointer to the thread's copy (below) costs a fifth of
// the rate (`xesp bench pipeline --sas 100000`, one worker: about 3.0 against 3.7 Mpps).
//
// An IMB_MGR holds the state of those lanes and must not be used by two threads at once. It is
// about 200 KB, too much to keep one per SA and worker, so each thread has its own; a call
// submits its jobs and flushes them before returning, so nothing is left in a manager between
// calls. Keys are expanded once per SA; the layout of expanded keys depends only on the CPU
// features the manager picked, which are the same for every thread of the process.
//
// Each thread also runs a copy of the library of its own, where it can. Before version 1.4
// (Debian 12 has 1.3), every call of the library, the direct GCM API and the job API alike,
// writes 0 to one global error variable (intel-ipsec-mb issue 112): two threads on one copy
// that encrypt at once take that variable's cache line from each other at every packet, and
// together do 0.9 to 1.8 times the work of one, the less the farther apart their cores. A
// copy loaded with dlmopen() into a link-map namespace of its own has globals of its own, and
// a libc of its own, which the library calls for little more than its managers' memory: the
// threads then share only the keys, which they read, and two do twice the work of one.
// Managers come from, and go back to, their own copy; the functions called by name are taken
// from it (MbCopy), the others go through the manager's pointers, which are its copy's.
//
// glibc has room for about ten such namespaces. Past kMaxCopies, or once dlmopen() fails,
// threads share the linked copy. Copies are never unloaded: a thread that ends leaves its copy
// to the next. Sanitizer builds keep to the linked copy: their runtimes do not follow a second
// libc.
#include "userspace/crypto/crypto_ipsecmb.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include <intel-ipsec-mb.h>
#include <openssl/crypto.h>

namespace xesp {

namespace {

constexpr size_t kEspHeaderLen = 8;  // SPI + sequence number low half
constexpr size_t kAeadIvLen = 8;     // RFC 4106 3.1

// A copy of the library: the functions the program calls by name, from that copy.
struct MbCopy {
    decltype(&alloc_mb_mgr) alloc = alloc_mb_mgr;
    decltype(&init_mb_mgr_auto) init = init_mb_mgr_auto;
    decltype(&free_mb_mgr) free = free_mb_mgr;
    decltype(&imb_get_errno) get_errno = imb_get_errno;
    unsigned users = 0;  // threads
};

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
constexpr bool kSanitized = __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) ||
                            __has_feature(memory_sanitizer);
#else
constexpr bool kSanitized = false;
#endif

class MbCopies {
public:
    static constexpr size_t kMaxCopies = 8;  // the linked one included

    static MbCopies &get()
    {
        static MbCopies *copies = new MbCopies;  // thread_local destructors use it at exit
        return *copies;
    }
    bool private_copies() const { return private_; }
    // A copy no other thread uses, loading one if it must; else the linked copy, shared.
    MbCopy *take()
    {
        std::lock_guard lock(mu_);
        for (auto &c : copies_)
            if (c.users == 0) {
                c.users++;
                return &c;
            }
        if (private_ && !failed_ && copies_.size() < kMaxCopies)
            if (MbCopy *c = load()) {
                c->users++;
                return c;
            }
        copies_.front().users++;
        return &copies_.front();
    }
    void give_back(MbCopy *c)
    {
        std::lock_guard lock(mu_);
        c->users--;
    }

private:
    MbCopies() : private_(!kSanitized && imb_get_version() < IMB_VERSION(1, 4, 0))
    {
        copies_.emplace_back();
    }
    MbCopy *load()
    {
        // The very file the program is linked with, wherever it was found.
        Dl_info linked;
        if (!dladdr(reinterpret_cast<void *>(alloc_mb_mgr), &linked) || !linked.dli_fname)
            return nullptr;
        void *h = dlmopen(LM_ID_NEWLM, linked.dli_fname, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            failed_ = true;  // out of namespaces or static TLS: later threads share
            return nullptr;
        }
        MbCopy c;
        c.alloc = reinterpret_cast<decltype(c.alloc)>(dlsym(h, "alloc_mb_mgr"));
        c.init = reinterpret_cast<decltype(c.init)>(dlsym(h, "init_mb_mgr_auto"));
        c.free = reinterpret_cast<decltype(c.free)>(dlsym(h, "free_mb_mgr"));
        c.get_errno = reinterpret_cast<decltype(c.get_errno)>(dlsym(h, "imb_get_errno"));
        if (!c.alloc || !c.init || !c.free || !c.get_errno) {
            failed_ = true;  // left loaded: unloading a namespace with a libc is seldom done
            return nullptr;
        }
        return &copies_.emplace_back(c);
    }

    std::mutex mu_;
    std::deque<MbCopy> copies_;  // the linked copy first; addresses stay
    const bool private_;
    bool failed_ = false;  // a load failed: none is tried again
};

// The calling thread's copy of the library and manager.
struct ThreadMb {
    MbCopy *copy = nullptr;
    IMB_MGR *mgr = nullptr;
    ~ThreadMb()
    {
        if (mgr)
            copy->free(mgr);
        if (copy)
            MbCopies::get().give_back(copy);
        mgr = nullptr;
        copy = nullptr;
    }
};

// The calling thread's manager and copy of the library; mgr is nullptr if it cannot be set up
// (out of memory).
ThreadMb &thread_mb()
{
    thread_local ThreadMb t;
    if (!t.mgr) {
        if (!t.copy)
            t.copy = MbCopies::get().take();
        t.mgr = t.copy->alloc(0);
        if (t.mgr) {
            t.copy->init(t.mgr, nullptr);
            if (t.copy->get_errno(t.mgr) != 0) {
                t.copy->free(t.mgr);
                t.mgr = nullptr;
            }
        }
    }
    return t;
}

IMB_MGR *thread_mgr()
{
    return thread_mb().mgr;
}

// Whether every GCM call that goes through leaves the payload's length in its context: up to
// 1.5, every path runs the library's init, update and finalize steps on the context, and a
// call it refuses (it checks pointers and lengths first) does not touch it. 2.0 has a path for
// payloads of up to 256 bytes that leaves the context alone: there, the error variable says.
const bool kGcmLengthInContext = imb_get_version() < IMB_VERSION(2, 0, 0);

Error mgr_error()
{
    return make_error("crypto (ipsecmb): cannot allocate or initialise the multi-buffer manager");
}

void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = uint8_t(v >> 24);
    p[1] = uint8_t(v >> 16);
    p[2] = uint8_t(v >> 8);
    p[3] = uint8_t(v);
}

// AES-GCM (RFC 4106): nonce = salt || IV, AAD = SPI || [seq high ||] seq low.
class MbGcm final : public SaCipher {
public:
    MbGcm(IMB_MGR *mgr, const Transform &xf, bool esn)
            : SaCipher(sizeof(MbGcm)), salt_(xf.salt), icv_len_(xf.icv_len), esn_(esn)
    {
        switch (xf.enc_key.size()) {
        case 16:
            IMB_AES128_GCM_PRE(mgr, xf.enc_key.data(), &key_);
            break;
        case 24:
            IMB_AES192_GCM_PRE(mgr, xf.enc_key.data(), &key_);
            break;
        default:
            IMB_AES256_GCM_PRE(mgr, xf.enc_key.data(), &key_);
            break;
        }
        key_bytes_ = uint8_t(xf.enc_key.size());
    }
    ~MbGcm() override
    {
        OPENSSL_cleanse(&key_, sizeof key_);
        OPENSSL_cleanse(salt_.data(), salt_.size());
    }

    void encrypt(CryptoOp *ops, size_t n) override { run(ops, n, true); }
    void decrypt(CryptoOp *ops, size_t n) override { run(ops, n, false); }
    Backend backend() const override { return Backend::IpsecMb; }

private:
    void run(CryptoOp *ops, size_t n, bool encrypt);
    aes_gcm_enc_dec_t function(const IMB_MGR *mgr, bool encrypt) const;

    // What run() reads besides the keys, on the object's first line with the vtable pointer.
    std::array<uint8_t, 4> salt_;
    uint8_t key_bytes_ = 0;
    uint8_t icv_len_;
    bool esn_;
    // Round keys and GHASH key powers. The header aligns the type only when LINUX is defined;
    // the vector code needs the alignment regardless.
    alignas(64) gcm_key_data key_;
};

aes_gcm_enc_dec_t MbGcm::function(const IMB_MGR *mgr, bool encrypt) const
{
    switch (key_bytes_) {
    case 16:
        return encrypt ? mgr->gcm128_enc : mgr->gcm128_dec;
    case 24:
        return encrypt ? mgr->gcm192_enc : mgr->gcm192_dec;
    default:
        return encrypt ? mgr->gcm256_enc : mgr->gcm256_dec;
    }
}

void MbGcm::run(CryptoOp *ops, size_t n, bool encrypt)
{
    ThreadMb &t = thread_mb();
    IMB_MGR *mgr = t.mgr;
    if (!mgr) {
        for (size_t i = 0; i < n; i++)
            ops[i].ok = false;
        return;
    }
    const aes_gcm_enc_dec_t gcm = function(mgr, encrypt);
    for (size_t i = 0; i < n; i++) {
        CryptoOp &op = ops[i];
        uint8_t *iv = op.esp + kEspHeaderLen;
        uint8_t *payload = iv + kAeadIvLen;
        uint8_t *icv = payload + op.payload_len;

        uint8_t nonce[IMB_GCM_IV_DATA_LEN];
        std::memcpy(nonce, salt_.data(), 4);
        std::memcpy(nonce + 4, iv, kAeadIvLen);
        uint8_t aad[12];
        size_t aad_len = kEspHeaderLen;
        const uint8_t *aad_ptr = op.esp;
        if (esn_) {
            std::memcpy(aad, op.esp, 4);
            put_be32(aad + 4, op.seq_hi);
            std::memcpy(aad + 8, op.esp + 4, 4);
            aad_ptr = aad;
            aad_len = sizeof aad;
        }

        // A call the library refused has left the payload as it was: in clear, for an
        // encryption.
        alignas(64) gcm_context_data ctx;
        ctx.in_length = UINT64_MAX;
        uint8_t tag[16];
        gcm(&key_, &ctx, payload, payload, op.payload_len, nonce, aad_ptr, aad_len,
            encrypt ? icv : tag, icv_len_);
        if (kGcmLengthInContext ? ctx.in_length != op.payload_len : t.copy->get_errno(mgr) != 0)
            op.ok = false;
        else
            op.ok = encrypt || CRYPTO_memcmp(tag, icv, icv_len_) == 0;
    }
}

struct HashInfo {
    IMB_HASH_ALG alg;
    size_t block;  // HMAC block size B (RFC 2104)
    size_t digest;
};

HashInfo hash_info(AuthAlg a)
{
    switch (a) {
    case AuthAlg::HmacSha1:
        return {IMB_AUTH_HMAC_SHA_1, 64, 20};
    case AuthAlg::HmacSha256:
        return {IMB_AUTH_HMAC_SHA_256, 64, 32};
    case AuthAlg::HmacSha384:
        return {IMB_AUTH_HMAC_SHA_384, 128, 48};
    case AuthAlg::HmacSha512:
    case AuthAlg::None:
        break;
    }
    return {IMB_AUTH_HMAC_SHA_512, 128, 64};
}

// AES-CBC (RFC 3602) or NULL encryption with a truncated HMAC over
// SPI || seq low || IV || ciphertext [|| seq high] (RFC 4303 3.3.2.1), one job per packet.
//
// The library hashes one contiguous range, so with ESN the 4 bytes of seq high are written where
// the ICV goes, right after the payload, and hashed with it; the digest goes to a scratch slot
// and the ICV is written (or compared with the saved received ICV) when the job completes. The
// full digest is requested, which the library accepts for every hash, and truncated here.
class MbEncAuth final : public SaCipher {
public:
    MbEncAuth(IMB_MGR *mgr, const Transform &xf, bool esn);
    ~MbEncAuth() override
    {
        OPENSSL_cleanse(enc_keys_.data(), sizeof enc_keys_);
        OPENSSL_cleanse(dec_keys_.data(), sizeof dec_keys_);
        OPENSSL_cleanse(ipad_.data(), ipad_.size());
        OPENSSL_cleanse(opad_.data(), opad_.size());
    }

    void encrypt(CryptoOp *ops, size_t n) override { run_jobs(nullptr, this, ops, n, true); }
    void decrypt(CryptoOp *ops, size_t n) override { run_jobs(nullptr, this, ops, n, false); }
    Backend backend() const override { return Backend::IpsecMb; }
    // Every MbEncAuth: each job carries its own keys, so the lanes fill across SAs.
    size_t run_many(SaCipher *const *ciphers, CryptoOp *ops, size_t n, bool encrypt) override
    {
        size_t k = 1;
        while (k < n && ciphers[k]->lane_group() == lane_group_)
            k++;
        run_jobs(ciphers, this, ops, k, encrypt);
        return k;
    }

private:
    // Jobs in flight per round, each with a slot for its digest: scratch of the calling
    // thread (a manager's jobs are all completed before a call returns), not 8 KB per SA.
    static constexpr size_t kSlots = 64;
    struct Slot {
        alignas(16) uint8_t digest[64];
        uint8_t received_icv[64];
        const MbEncAuth *owner;
    };
    static Slot *thread_slots()
    {
        thread_local std::array<Slot, kSlots> slots;
        return slots.data();
    }
    static const char kLaneGroup;

    void precompute_hmac(IMB_MGR *mgr, const KeyBytes &key);
    // ops[i] with ciphers[i], or all with `one` when ciphers is null.
    static void run_jobs(SaCipher *const *ciphers, MbEncAuth *one, CryptoOp *ops, size_t n,
                         bool encrypt);
    void submit(IMB_MGR *mgr, CryptoOp &op, Slot &slot, bool encrypt) const;
    static void complete(const IMB_JOB *job);
    uint8_t *icv_of(const CryptoOp &op) const
    {
        return op.esp + kEspHeaderLen + iv_len_ + op.payload_len;
    }

    alignas(16) std::array<uint32_t, 60> enc_keys_{};  // up to 15 round keys (AES-256)
    alignas(16) std::array<uint32_t, 60> dec_keys_{};
    alignas(16) std::array<uint8_t, 64> ipad_{};  // hash state after key ^ ipad
    alignas(16) std::array<uint8_t, 64> opad_{};  // hash state after key ^ opad
    IMB_CIPHER_MODE cipher_mode_;
    IMB_KEY_SIZE_BYTES key_size_ = IMB_KEY_128_BYTES;
    HashInfo hash_;
    uint8_t iv_len_;
    uint8_t icv_len_;
    bool esn_;
};

MbEncAuth::MbEncAuth(IMB_MGR *mgr, const Transform &xf, bool esn)
        : SaCipher(sizeof(MbEncAuth)),
          cipher_mode_(xf.enc == EncAlg::AesCbc ? IMB_CIPHER_CBC : IMB_CIPHER_NULL),
          hash_(hash_info(xf.auth)), iv_len_(xf.iv_len()), icv_len_(xf.icv_len), esn_(esn)
{
    lane_group_ = &kLaneGroup;
    if (cipher_mode_ == IMB_CIPHER_CBC) {
        switch (xf.enc_key.size()) {
        case 16:
            IMB_AES_KEYEXP_128(mgr, xf.enc_key.data(), enc_keys_.data(), dec_keys_.data());
            key_size_ = IMB_KEY_128_BYTES;
            break;
        case 24:
            IMB_AES_KEYEXP_192(mgr, xf.enc_key.data(), enc_keys_.data(), dec_keys_.data());
            key_size_ = IMB_KEY_192_BYTES;
            break;
        default:
            IMB_AES_KEYEXP_256(mgr, xf.enc_key.data(), enc_keys_.data(), dec_keys_.data());
            key_size_ = IMB_KEY_256_BYTES;
            break;
        }
    }
    precompute_hmac(mgr, xf.auth_key);
}

// HMAC(K, m) = H((K ^ opad) || H((K ^ ipad) || m)) (RFC 2104): the state after the first block
// of each hash depends on the key alone, so it is computed once here.
void MbEncAuth::precompute_hmac(IMB_MGR *mgr, const KeyBytes &key)
{
    uint8_t k[128] = {};
    if (key.size() > hash_.block) {
        switch (hash_.alg) {
        case IMB_AUTH_HMAC_SHA_1:
            IMB_SHA1(mgr, key.data(), key.size(), k);
            break;
        case IMB_AUTH_HMAC_SHA_256:
            IMB_SHA256(mgr, key.data(), key.size(), k);
            break;
        case IMB_AUTH_HMAC_SHA_384:
            IMB_SHA384(mgr, key.data(), key.size(), k);
            break;
        default:
            IMB_SHA512(mgr, key.data(), key.size(), k);
            break;
        }
    } else {
        std::memcpy(k, key.data(), key.size());
    }
    uint8_t block[128];
    for (int pass = 0; pass < 2; pass++) {
        const uint8_t pad = pass == 0 ? 0x36 : 0x5c;
        uint8_t *state = pass == 0 ? ipad_.data() : opad_.data();
        for (size_t i = 0; i < hash_.block; i++)
            block[i] = k[i] ^ pad;
        switch (hash_.alg) {
        case IMB_AUTH_HMAC_SHA_1:
            IMB_SHA1_ONE_BLOCK(mgr, block, state);
            break;
        case IMB_AUTH_HMAC_SHA_256:
            IMB_SHA256_ONE_BLOCK(mgr, block, state);
            break;
        case IMB_AUTH_HMAC_SHA_384:
            IMB_SHA384_ONE_BLOCK(mgr, block, state);
            break;
        default:
            IMB_SHA512_ONE_BLOCK(mgr, block, state);
            break;
        }
    }
    OPENSSL_cleanse(k, sizeof k);
    OPENSSL_cleanse(block, sizeof block);
}

const char MbEncAuth::kLaneGroup = 0;

void MbEncAuth::run_jobs(SaCipher *const *ciphers, MbEncAuth *one, CryptoOp *ops, size_t n,
                         bool encrypt)
{
    IMB_MGR *mgr = thread_mgr();
    for (size_t i = 0; i < n; i++)
        ops[i].ok = false;
    if (!mgr)
        return;
    Slot *slots = thread_slots();
    for (size_t base = 0; base < n; base += kSlots) {
        const size_t count = std::min(kSlots, n - base);
        for (size_t i = 0; i < count; i++) {
            const MbEncAuth *c = ciphers ? static_cast<MbEncAuth *>(ciphers[base + i]) : one;
            c->submit(mgr, ops[base + i], slots[i], encrypt);
        }
        while (const IMB_JOB *job = IMB_FLUSH_JOB(mgr))
            complete(job);
    }
}

void MbEncAuth::submit(IMB_MGR *mgr, CryptoOp &op, Slot &slot, bool encrypt) const
{
    // CBC works on whole blocks, and ESP padding (RFC 4303 2.4) makes every payload whole.
    if (cipher_mode_ == IMB_CIPHER_CBC && (op.payload_len == 0 || op.payload_len % 16 != 0))
        return;
    uint8_t *icv = icv_of(op);
    uint64_t hash_len = kEspHeaderLen + iv_len_ + op.payload_len;
    if (!encrypt)
        std::memcpy(slot.received_icv, icv, icv_len_);
    if (esn_) {
        put_be32(icv, op.seq_hi);
        hash_len += 4;
    }

    IMB_JOB *job = IMB_GET_NEXT_JOB(mgr);
    job->cipher_mode = cipher_mode_;
    job->cipher_direction = encrypt ? IMB_DIR_ENCRYPT : IMB_DIR_DECRYPT;
    job->chain_order = encrypt ? IMB_ORDER_CIPHER_HASH : IMB_ORDER_HASH_CIPHER;
    job->hash_alg = hash_.alg;
    job->enc_keys = enc_keys_.data();
    job->dec_keys = dec_keys_.data();
    job->key_len_in_bytes = key_size_;
    job->src = op.esp;
    job->dst = op.esp + kEspHeaderLen + iv_len_;
    job->cipher_start_src_offset_in_bytes = kEspHeaderLen + iv_len_;
    job->msg_len_to_cipher_in_bytes = op.payload_len;
    job->iv = op.esp + kEspHeaderLen;
    job->iv_len_in_bytes = iv_len_;
    job->hash_start_src_offset_in_bytes = 0;
    job->msg_len_to_hash_in_bytes = hash_len;
    job->auth_tag_output = slot.digest;
    job->auth_tag_output_len_in_bytes = hash_.digest;
    job->u.HMAC._hashed_auth_key_xor_ipad = ipad_.data();
    job->u.HMAC._hashed_auth_key_xor_opad = opad_.data();
    job->user_data = &op;
    job->user_data2 = &slot;
    slot.owner = this;

    for (const IMB_JOB *done = IMB_SUBMIT_JOB(mgr); done; done = IMB_GET_COMPLETED_JOB(mgr))
        complete(done);
}

void MbEncAuth::complete(const IMB_JOB *job)
{
    CryptoOp &op = *static_cast<CryptoOp *>(job->user_data);
    const Slot &slot = *static_cast<const Slot *>(job->user_data2);
    const MbEncAuth &c = *slot.owner;
    const uint8_t icv_len = c.icv_len_;
    uint8_t *icv = c.icv_of(op);
    const bool done = job->status == IMB_STATUS_COMPLETED;
    if (job->cipher_direction == IMB_DIR_ENCRYPT) {
        std::memcpy(icv, slot.digest, icv_len);
        op.ok = done;
        return;
    }
    op.ok = done && CRYPTO_memcmp(slot.digest, slot.received_icv, icv_len) == 0;
    if (c.esn_)
        std::memcpy(icv, slot.received_icv, icv_len);
}

}  // namespace

const void *ipsecmb_thread_code()
{
    IMB_MGR *mgr = thread_mgr();
    return mgr ? reinterpret_cast<const void *>(mgr->gcm128_enc) : nullptr;
}

bool ipsecmb_private_copies()
{
    return MbCopies::get().private_copies();
}

bool ipsecmb_implements(const Transform &xf)
{
    if (xf.is_aead())
        return xf.aead == AeadAlg::AesGcm;
    return xf.enc == EncAlg::AesCbc || xf.enc == EncAlg::Null;
}

Result<std::unique_ptr<SaCipher>> make_ipsecmb_cipher(const Transform &xf, bool esn)
{
    if (!backend_supports(Backend::IpsecMb, xf))
        return make_error("crypto (ipsecmb): transform not supported");
    IMB_MGR *mgr = thread_mgr();
    if (!mgr)
        return mgr_error();
    if (xf.is_aead())
        return std::unique_ptr<SaCipher>(std::make_unique<MbGcm>(mgr, xf, esn));
    return std::unique_ptr<SaCipher>(std::make_unique<MbEncAuth>(mgr, xf, esn));
}

}  // namespace xesp
