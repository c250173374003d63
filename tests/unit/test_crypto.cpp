// The crypto backends against published vectors laid out as ESP packets, against each other,
// and against tampering. Every case runs on every backend that claims to support it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "userspace/crypto/crypto.h"
#include "userspace/crypto/crypto_ipsecmb.h"

using namespace xesp;

namespace {

using Bytes = std::vector<uint8_t>;

Bytes hex(std::string_view s)
{
    Bytes out;
    int hi = -1;
    for (char c : s) {
        int v;
        if (c >= '0' && c <= '9')
            v = c - '0';
        else if (c >= 'a' && c <= 'f')
            v = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v = c - 'A' + 10;
        else
            continue;  // spaces and line breaks between groups
        if (hi < 0) {
            hi = v;
        } else {
            out.push_back(uint8_t(hi << 4 | v));
            hi = -1;
        }
    }
    REQUIRE(hi < 0);
    return out;
}

Bytes ascii(std::string_view s)
{
    return Bytes(s.begin(), s.end());
}

Bytes cat(std::initializer_list<Bytes> parts)
{
    Bytes out;
    for (const Bytes &p : parts)
        out.insert(out.end(), p.begin(), p.end());
    return out;
}

Bytes repeat(uint8_t b, size_t n)
{
    return Bytes(n, b);
}

KeyBytes key_of(const Bytes &b)
{
    return b.empty() ? KeyBytes() : KeyBytes(b.data(), b.size());
}

Transform aead(AeadAlg alg, const Bytes &key, const Bytes &salt, uint8_t icv_len)
{
    Transform xf;
    xf.aead = alg;
    xf.enc_key = key_of(key);
    REQUIRE(salt.size() == 4);
    std::memcpy(xf.salt.data(), salt.data(), 4);
    xf.icv_len = icv_len;
    return xf;
}

Transform enc_auth(EncAlg enc, const Bytes &enc_key, AuthAlg auth, const Bytes &auth_key,
                   uint8_t icv_len)
{
    Transform xf;
    xf.enc = enc;
    xf.enc_key = key_of(enc_key);
    xf.auth = auth;
    xf.auth_key = key_of(auth_key);
    xf.icv_len = icv_len;
    return xf;
}

std::vector<Backend> backends_for(const Transform &xf)
{
    std::vector<Backend> out;
    for (Backend b : {Backend::OpenSsl, Backend::IpsecMb})
        if (backend_supports(b, xf))
            out.push_back(b);
    return out;
}

std::unique_ptr<SaCipher> cipher(Backend b, const Transform &xf, bool esn)
{
    auto c = make_cipher(b, xf, esn);
    INFO((c ? std::string() : c.error().message));
    REQUIRE(c);
    REQUIRE((*c)->backend() == b);
    return std::move(*c);
}

// One ESP packet: header (SPI || seq low), IV, payload, room for the ICV.
struct Packet {
    Bytes bytes;
    uint32_t payload_len = 0;
    uint32_t seq_hi = 0;

    Packet(const Bytes &header, const Bytes &iv, const Bytes &payload, size_t icv_len,
           uint32_t hi = 0)
            : bytes(cat({header, iv, payload, Bytes(icv_len, 0)})),
              payload_len(uint32_t(payload.size())), seq_hi(hi)
    {
        REQUIRE(header.size() == 8);
    }
    CryptoOp op() { return CryptoOp{bytes.data(), payload_len, seq_hi, false}; }
};

bool encrypt_one(SaCipher &c, Packet &p)
{
    CryptoOp op = p.op();
    c.encrypt(&op, 1);
    return op.ok;
}

bool decrypt_one(SaCipher &c, Packet &p)
{
    CryptoOp op = p.op();
    c.decrypt(&op, 1);
    return op.ok;
}

Bytes hmac_oneshot(AuthAlg a, const Bytes &key, const Bytes &data)
{
    const EVP_MD *md = a == AuthAlg::HmacSha1     ? EVP_sha1()
                       : a == AuthAlg::HmacSha256 ? EVP_sha256()
                       : a == AuthAlg::HmacSha384 ? EVP_sha384()
                                                  : EVP_sha512();
    uint8_t out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    REQUIRE(HMAC(md, key.data(), int(key.size()), data.data(), data.size(), out, &n) != nullptr);
    return Bytes(out, out + n);
}

Bytes be32(uint32_t v)
{
    return Bytes{uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

// An AEAD known answer: ESP header, seq high (ESN) or none, salt || IV, plaintext, and the
// whole expected packet.
struct AeadVector {
    const char *name;
    AeadAlg alg;
    const char *key;
    const char *salt;
    const char *header;  // SPI || seq low
    bool esn;
    uint32_t seq_hi;
    const char *iv;
    const char *plaintext;
    const char *packet;  // SPI || seq low || IV || ciphertext || ICV
};

// draft-mcgrew-gcm-test-01 section 4 (AES-GCM in ESP; the 64-bit sequence numbers are ESN),
// RFC 7634 appendix A (ChaCha20-Poly1305 in ESP), and RFC 8439 2.8.2, whose 12-byte AAD reads
// as SPI || seq high || seq low.
const AeadVector kAeadVectors[] = {
    {"gcm-test-01 case 2 (AES-128)", AeadAlg::AesGcm, "feffe9928665731c6d6a8f9467308308",
     "cafebabe", "0000a5f8 0000000a", false, 0, "facedbaddecaf888",
     "4500003e698f000080114dccc0a80102 c0a801010a980035002a2343b2d00100"
     "00010000000000000373697009637962 65726369747902646b00000100010001",
     "0000a5f80000000afacedbaddecaf888 deb22cd9b07c72c16e3a65beeb8df304"
     "a5a5897d33ae530f1ba76d5d114d2a5c 3de81827c10e9a4f51330d0eec416642"
     "cfbb85a5b47e48a4ec3b9ba95d918bd1 83b70d3aa8bc6ee4c309e9d85a41ad4a"},
    {"gcm-test-01 case 1 (AES-128, ESN)", AeadAlg::AesGcm, "4c80cdefbb5d10da906ac73c3613a634",
     "2e443b68", "00004321 00000000", true, 0x87654321, "4956ed7e3b244cfe",
     "45000048699a000080114db7c0a80102 c0a801010a9bf15638d3010000010000"
     "00000000045f736970045f7564700373 69700963796265726369747902646b00 0021000101020201",
     "00004321000000004956ed7e3b244cfe fecf537e729d5b07dc30df528dd22b76"
     "8d1b98736696a6fd348509fa13ceac34 cfa2436f14a3f3cf65925bf1f4a13c5d"
     "15b21e1884f5ff6247aeabb786b93bce 61bc17d768fd9732459018148f6cbe72 2fd04796562dfdb4"},
    {"gcm-test-01 case 4 (AES-128, zero key)", AeadAlg::AesGcm, "00000000000000000000000000000000",
     "00000000", "00000000 00000001", false, 0, "0000000000000000",
     "4500003c99c500008001cb7a40679318 010101010800075c0200440061626364"
     "65666768696a6b6c6d6e6f7071727374 75767761626364656667686901020201",
     "00000000000000010000000000000000 4688daf2f973a392732909c331d56d60"
     "f694abaa414b5e7ff5fdcdfff5e9a284 456476492719ffb64de7d9dca1e1d894"
     "bc3bd57873ed4d181d19d4d5c8c18af3 f821d496eeb096e98ad2b69e4799c71d"},
    {"gcm-test-01 case 5 (AES-128, ESN)", AeadAlg::AesGcm, "3de09874b388e6491988d0c3607eae1f",
     "57690e43", "42f67e3f 10101010", true, 0x10101010, "4e280000a2fca1a3",
     "4500003c99c300008001cb7c40679318 010101010800085c0200430061626364"
     "65666768696a6b6c6d6e6f7071727374 75767761626364656667686901020201",
     "42f67e3f101010104e280000a2fca1a3 fba2caa4853cf9f0f22cb10d86dd83b0"
     "fec75691cf1a04b00d1138ec9c357917 65acbd8701ad79845bf9fe3fba487bc9"
     "1755e6662b4c8d0d1f5e22739530320a e0d731cc978ecafaeae88f00e80d6e48"},
    {"gcm-test-01 case 12 (AES-128, 4-byte payload)", AeadAlg::AesGcm,
     "7d773d00c144c525ac619d18c84a3f47", "d9664267", "335467ae ffffffff", false, 0,
     "43457e9182443bc6", "01020201",
     "335467aeffffffff43457e9182443bc6 437f866bcb3f699fe9b0822bac961c45 04bef270"},
    {"gcm-test-01 case 7 (AES-192)", AeadAlg::AesGcm,
     "feffe9928665731c6d6a8f9467308308 feffe9928665731c", "cafebabe", "0000a5f8 0000000a", false, 0,
     "facedbaddecaf888",
     "45000028a4ad4000400678800a01038f 0a010612802306b8cb712602dd6bb03e 501016d075680001",
     "0000a5f80000000afacedbaddecaf888 a5b1f8066029aea40e598b8122de0242"
     "0938b3ab33f828e687b8858b5bfbdbd0 315b27452144cc7795457b9652037f53 18027b5b4cd7a636"},
    {"gcm-test-01 case 3 (AES-256)", AeadAlg::AesGcm,
     "abbccddef00112233445566778899aab abbccddef00112233445566778899aab", "11223344",
     "4a2cbfe3 00000002", false, 0, "0102030405060708",
     "4500003069a6400080062690c0a80102 9389155e0a9e008b2dc57ee000000000"
     "7002400020bf0000020405b401010402 01020201",
     "4a2cbfe3000000020102030405060708 ff425c9b724599df7a3bcd510194e00d"
     "6a78107f1b0b1cbf06efae9d65a5d763 748a637985771d347f0545659f14e99d"
     "ef842d8eb335f4eecfdbf831824b4c49 15956c96"},
    {"gcm-test-01 case 9 (AES-256, ESN)", AeadAlg::AesGcm,
     "abbccddef00112233445566778899aab abbccddef00112233445566778899aab", "73616c74",
     "17405e67 dd0db99b", true, 0x156f3126, "616e640169766563",
     "45080028732c00004006e9f90a010612 0a01038f06b88023dd6bafbecb712602 50101f646d540001",
     "17405e67dd0db99b616e640169766563 f2d69ecdbd5a0d5b8d5ef38bad4da58d"
     "1f278fde98ef67549d524a3018d9a57f f4d3a31ce673119e451626c2415771e3 b7eebca614c89b35"},
    {"RFC 7634 appendix A", AeadAlg::ChaCha20Poly1305,
     "808182838485868788898a8b8c8d8e8f 909192939495969798999a9b9c9d9e9f", "a0a1a2a3",
     "01020304 00000005", false, 0, "1011121314151617",
     "45000054a6f200004001e778c6336405 c000020508005b7a3a080000553bec10"
     "000736270809 0a0b0c0d0e0f10111213 1415161718191a1b1c1d1e1f20212223"
     "2425262728292a2b2c2d2e2f30313233 3435363701020204",
     "01020304000000051011121314151617 24039428b97f417e3c13753a4f05087b"
     "67c352e6a7fab1b982d466ef407ae5c6 14ee8099d52844eb61aa95dfab4c02f7"
     "2aa71e7c4c4f64c9befe2facc638e8f3 cbec163fac469b502773f6fb94e664da"
     "9165b82829f641e0 76aaa8266b7fb0f7b11b369907e1ad43"},
    {"RFC 8439 2.8.2 (ESN layout)", AeadAlg::ChaCha20Poly1305,
     "808182838485868788898a8b8c8d8e8f 909192939495969798999a9b9c9d9e9f", "07000000",
     "50515253 c4c5c6c7", true, 0xc0c1c2c3, "4041424344454647",
     "4c616469657320616e642047656e746c656d656e206f662074686520636c617373206f66202739393a20"
     "4966204920636f756c64206f6666657220796f75206f6e6c79206f6e652074697020666f7220746865"
     "206675747572652c2073756e73637265656e20776f756c642062652069742e",
     "50515253c4c5c6c74041424344454647"
     "d31a8d34648e60db7b86afbc53ef7ec2a4aded51296e08fea9e2b5a736ee62d6"
     "3dbea45e8ca9671282fafb69da92728b1a71de0a9e060b2905d6a5b67ecd3b36"
     "92ddbd7f2d778b8c9803aee328091b58fab324e4fad675945585808b4831d7bc"
     "3ff4def08e4b7a9de576d26586cec64b6116 1ae10b594f09e26a7e902ecbd0600691"},
};

}  // namespace

TEST_CASE("backend names parse and print", "[crypto]")
{
    for (Backend b : {Backend::Auto, Backend::OpenSsl, Backend::IpsecMb})
        CHECK(parse_backend(backend_name(b)) == b);
    CHECK_FALSE(parse_backend("OpenSSL").has_value());
    CHECK_FALSE(parse_backend("").has_value());
}

TEST_CASE("auto picks intel-ipsec-mb where it can, OpenSSL otherwise", "[crypto]")
{
    const Bytes k16 = repeat(0x11, 16), k32 = repeat(0x22, 32), salt = repeat(1, 4);
    const Transform gcm = aead(AeadAlg::AesGcm, k16, salt, 16);
    const Transform chacha = aead(AeadAlg::ChaCha20Poly1305, k32, salt, 16);
    const Transform gmac = aead(AeadAlg::AesGmac, k16, salt, 16);
    const Transform cbc = enc_auth(EncAlg::AesCbc, k16, AuthAlg::HmacSha256, k32, 16);

    CHECK(resolve_backend(Backend::Auto, gcm) == Backend::IpsecMb);
    CHECK(resolve_backend(Backend::Auto, cbc) == Backend::IpsecMb);
    CHECK(resolve_backend(Backend::Auto, chacha) == Backend::OpenSsl);
    CHECK(resolve_backend(Backend::Auto, gmac) == Backend::OpenSsl);
    CHECK(resolve_backend(Backend::OpenSsl, gcm) == Backend::OpenSsl);

    CHECK(backend_supports(Backend::OpenSsl, chacha));
    CHECK_FALSE(backend_supports(Backend::IpsecMb, chacha));
    CHECK_FALSE(backend_supports(Backend::IpsecMb, gmac));
    CHECK(backend_supports(Backend::Auto, chacha));

    auto c = make_cipher(Backend::Auto, chacha, false);
    REQUIRE(c);
    CHECK((*c)->backend() == Backend::OpenSsl);
    auto g = make_cipher(Backend::Auto, gcm, true);
    REQUIRE(g);
    CHECK((*g)->backend() == Backend::IpsecMb);

    auto refused = make_cipher(Backend::IpsecMb, chacha, false);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().message.find("ipsecmb") != std::string::npos);
}

TEST_CASE("transforms ESP cannot use are refused by every backend", "[crypto]")
{
    const Bytes k16 = repeat(0x11, 16), salt = repeat(1, 4);
    std::vector<Transform> bad = {
        aead(AeadAlg::AesGcm, k16, salt, 10),
        aead(AeadAlg::AesGcm, repeat(1, 20), salt, 16),
        aead(AeadAlg::AesGmac, k16, salt, 12),
        aead(AeadAlg::ChaCha20Poly1305, k16, salt, 16),
        aead(AeadAlg::ChaCha20Poly1305, repeat(1, 32), salt, 12),
        enc_auth(EncAlg::AesCbc, repeat(1, 20), AuthAlg::HmacSha1, k16, 12),
        enc_auth(EncAlg::AesCbc, k16, AuthAlg::HmacSha1, k16, 21),
        enc_auth(EncAlg::AesCbc, k16, AuthAlg::HmacSha256, k16, 3),
        enc_auth(EncAlg::AesCbc, k16, AuthAlg::HmacSha256, {}, 16),
        enc_auth(EncAlg::AesCbc, k16, AuthAlg::None, {}, 0),
        enc_auth(EncAlg::None, {}, AuthAlg::HmacSha256, k16, 16),
    };
    Transform mixed = aead(AeadAlg::AesGcm, k16, salt, 16);
    mixed.auth = AuthAlg::HmacSha1;
    bad.push_back(mixed);
    for (const Transform &xf : bad) {
        for (Backend b : {Backend::Auto, Backend::OpenSsl, Backend::IpsecMb}) {
            CHECK_FALSE(backend_supports(b, xf));
            CHECK_FALSE(make_cipher(b, xf, false));
        }
    }
}

TEST_CASE("AEAD known answers as ESP packets", "[crypto]")
{
    for (const AeadVector &v : kAeadVectors) {
        const Bytes expected = hex(v.packet);
        const Bytes plaintext = hex(v.plaintext);
        // Truncated GCM ICVs are the leading bytes of the full tag (RFC 4106 6).
        std::vector<uint8_t> icv_lens = {16};
        if (v.alg == AeadAlg::AesGcm)
            icv_lens = {8, 12, 16};
        for (uint8_t icv_len : icv_lens) {
            const Transform xf = aead(v.alg, hex(v.key), hex(v.salt), icv_len);
            const Bytes want(expected.begin(), expected.end() - (16 - icv_len));
            for (Backend b : backends_for(xf)) {
                INFO(v.name << ", ICV " << int(icv_len) << ", " << backend_name(b));
                auto c = cipher(b, xf, v.esn);
                Packet p(hex(v.header), hex(v.iv), plaintext, icv_len, v.seq_hi);
                REQUIRE(encrypt_one(*c, p));
                CHECK(p.bytes == want);
                REQUIRE(decrypt_one(*c, p));
                CHECK(Bytes(p.bytes.begin() + 16, p.bytes.end() - icv_len) == plaintext);
            }
        }
    }
}

TEST_CASE("AES-CBC known answers from RFC 3602 section 4 in ESP packets", "[crypto]")
{
    struct CbcVector {
        Bytes key, iv, plaintext, ciphertext;
    };
    // Cases 1-4 carry no ESP framing; case 5 is a transport-mode ESP packet (SPI 4321, seq 1).
    const CbcVector vectors[] = {
        {hex("06a9214036b8a15b512e03d534120006"), hex("3dafba429d9eb430b422da802c9fac41"),
         ascii("Single block msg"), hex("e353779c1079aeb82708942dbe77181a")},
        {hex("c286696d887c9aa0611bbb3e2025a45a"), hex("562e17996d093d28ddb3ba695a2e6f58"),
         hex("000102030405060708090a0b0c0d0e0f 101112131415161718191a1b1c1d1e1f"),
         hex("d296cd94c2cccf8a3a863028b5e1dc0a 7586602d253cfff91b8266bea6d61ab1")},
        {hex("6c3ea0477630ce21a2ce334aa746c2cd"), hex("c782dc4c098c66cbd9cd27d825682c81"),
         ascii("This is a 48-byte message (exactly 3 AES blocks)"),
         hex("d0a02b3836451753d493665d33f0e886 2dea54cdb293abc7506939276772f8d5"
             "021c19216bad525c8579695d83ba2684")},
        {hex("56e47a38c5598974bc46903dba290349"), hex("8ce82eefbea0da3c44699ed7db51b7d9"),
         hex("a0a1a2a3a4a5a6a7a8a9aaabacadaeaf b0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
             "c0c1c2c3c4c5c6c7c8c9cacbcccdcecf d0d1d2d3d4d5d6d7d8d9dadbdcdddedf"),
         hex("c30e32ffedc0774e6aff6af0869f71aa 0f3af07a9a31a9c684db207eb0ef8e4e"
             "35907aa632c3ffdf868bb7b29d3d46ad 83ce9f9a102ee99d49a53e87f4c3da55")},
        {hex("90d382b410eeba7ad938c46cec1a82bf"), hex("e96e8c08ab465763fd098d45dd3ff893"),
         hex("08000ebda70a00008e9c083db95b0700 08090a0b0c0d0e0f1011121314151617"
             "18191a1b1c1d1e1f2021222324252627 28292a2b2c2d2e2f3031323334353637"
             "0102030405060708090a0b0c0d0e0e01"),
         hex("f663c25d325c18c6a9453e194e120849 a4870b66cc6b9965330013b4898dc856"
             "a4699e523a55db080b59ec3a8e4b7e52 775b07d1db34ed9c538ab50c551b874a"
             "a269add047ad2d5913ac19b7cfbad4a6")},
    };
    const Bytes header = hex("00004321 00000001");
    const Bytes auth_key = hex("0102030405060708090a0b0c0d0e0f1011121314");
    for (const CbcVector &v : vectors) {
        for (bool esn : {false, true}) {
            const Transform xf = enc_auth(EncAlg::AesCbc, v.key, AuthAlg::HmacSha1, auth_key, 12);
            const Bytes esp = cat({header, v.iv, v.ciphertext});
            // The ICV from an independent HMAC over the expected ciphertext (RFC 2404: 96 bits).
            Bytes icv =
                hmac_oneshot(AuthAlg::HmacSha1, auth_key, esn ? cat({esp, be32(0x01020304)}) : esp);
            icv.resize(12);
            for (Backend b : backends_for(xf)) {
                INFO("key " << int(v.key[0]) << (esn ? " ESN " : " ") << backend_name(b));
                auto c = cipher(b, xf, esn);
                Packet p(header, v.iv, v.plaintext, 12, 0x01020304);
                REQUIRE(encrypt_one(*c, p));
                CHECK(p.bytes == cat({esp, icv}));
                REQUIRE(decrypt_one(*c, p));
                CHECK(Bytes(p.bytes.begin() + 24, p.bytes.end() - 12) == v.plaintext);
            }
        }
    }
}

TEST_CASE("HMAC known answers from RFC 2202 and RFC 4231 via NULL encryption", "[crypto]")
{
    // The ICV of a NULL-encrypted packet is the HMAC of the whole packet, so each RFC message is
    // laid out as header (its first 8 bytes) and payload (the rest).
    struct HmacVector {
        AuthAlg alg;
        Bytes key;
        Bytes data;
        const char *mac;
    };
    const Bytes jefe = ascii("Jefe"), hi = ascii("Hi There");
    const Bytes want = ascii("what do ya want for nothing?");
    const Bytes k0b = repeat(0x0b, 20), kaa = repeat(0xaa, 20), k0c = repeat(0x0c, 20);
    const Bytes k25 = hex("0102030405060708090a0b0c0d0e0f10111213141516171819");
    const Bytes dd = repeat(0xdd, 50), cd = repeat(0xcd, 50);
    const Bytes trunc = ascii("Test With Truncation");
    const HmacVector vectors[] = {
        // RFC 2202 section 3
        {AuthAlg::HmacSha1, k0b, hi, "b617318655057264e28bc0b6fb378c8ef146be00"},
        {AuthAlg::HmacSha1, jefe, want, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"},
        {AuthAlg::HmacSha1, kaa, dd, "125d7342b9ac11cd91a39af48aa17b4f63f175d3"},
        {AuthAlg::HmacSha1, k25, cd, "4c9007f4026250c6bc8414f9bf50c86c2d7235da"},
        {AuthAlg::HmacSha1, k0c, trunc, "4c1a03424b55e07fe7f27be1d58bb9324a9a5a04"},
        {AuthAlg::HmacSha1, repeat(0xaa, 80),
         ascii("Test Using Larger Than Block-Size Key - Hash Key First"),
         "aa4ae5e15272d00e95705637ce8a3b55ed402112"},
        {AuthAlg::HmacSha1, repeat(0xaa, 80),
         ascii("Test Using Larger Than Block-Size Key and Larger Than One Block-Size Data"),
         "e8e99d0f45237d786d6bbaa7965c7808bbff1a91"},
        // RFC 4231 section 4, cases 1-5 (6 and 7 have 131-byte keys, over KeyBytes::kMax)
        {AuthAlg::HmacSha256, k0b, hi,
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {AuthAlg::HmacSha384, k0b, hi,
         "afd03944d84895626b0825f4ab46907f15f9dadbe4101ec682aa034c7cebc59c"
         "faea9ea9076ede7f4af152e8b2fa9cb6"},
        {AuthAlg::HmacSha512, k0b, hi,
         "87aa7cdea5ef619d4ff0b4241a1d6cb02379f4e2ce4ec2787ad0b30545e17cde"
         "daa833b7d6b8a702038b274eaea3f4e4be9d914eeb61f1702e696c203a126854"},
        {AuthAlg::HmacSha256, jefe, want,
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {AuthAlg::HmacSha384, jefe, want,
         "af45d2e376484031617f78d2b58a6b1b9c7ef464f5a01b47e42ec3736322445e"
         "8e2240ca5e69e2c78b3239ecfab21649"},
        {AuthAlg::HmacSha512, jefe, want,
         "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea250554"
         "9758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"},
        {AuthAlg::HmacSha256, kaa, dd,
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {AuthAlg::HmacSha384, kaa, dd,
         "88062608d3e6ad8a0aa2ace014c8a86f0aa635d947ac9febe83ef4e55966144b"
         "2a5ab39dc13814b94e3ab6e101a34f27"},
        {AuthAlg::HmacSha512, kaa, dd,
         "fa73b0089d56a284efb0f0756c890be9b1b5dbdd8ee81a3655f83e33b2279d39"
         "bf3e848279a722c806b485a47e67c807b946a337bee8942674278859e13292fb"},
        {AuthAlg::HmacSha256, k25, cd,
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {AuthAlg::HmacSha384, k25, cd,
         "3e8a69b7783c25851933ab6290af6ca77a9981480850009cc5577c6e1f573b4e"
         "6801dd23c4a7d679ccf8a386c674cffb"},
        {AuthAlg::HmacSha512, k25, cd,
         "b0ba465637458c6990e5a8c5f61d4af7e576d97ff94b872de76f8050361ee3db"
         "a91ca5c11aa25eb4d679275cc5788063a5f19741120c4f2de2adebeb10a298dd"},
        {AuthAlg::HmacSha256, k0c, trunc, "a3b6167473100ee06e0c796c2955552b"},
        {AuthAlg::HmacSha384, k0c, trunc, "3abf34c3503b2a23a46efc619baef897"},
        {AuthAlg::HmacSha512, k0c, trunc, "415fad6271580a531d4179bc891d87a6"},
    };
    for (const HmacVector &v : vectors) {
        const Bytes mac = hex(v.mac);
        // The RFC's own length and the ESP truncation (RFC 2404, RFC 4868: half the digest).
        const size_t full = v.alg == AuthAlg::HmacSha1     ? 20
                            : v.alg == AuthAlg::HmacSha256 ? 32
                            : v.alg == AuthAlg::HmacSha384 ? 48
                                                           : 64;
        for (size_t icv_len : {mac.size(), full == 20 ? size_t(12) : full / 2}) {
            if (icv_len > mac.size())
                continue;  // RFC 4231 case 5 publishes only the first 128 bits
            const Transform xf = enc_auth(EncAlg::Null, {}, v.alg, v.key, uint8_t(icv_len));
            const Bytes header(v.data.begin(), v.data.begin() + 8);
            const Bytes payload(v.data.begin() + 8, v.data.end());
            for (Backend b : backends_for(xf)) {
                INFO(v.mac << " ICV " << icv_len << " " << backend_name(b));
                auto c = cipher(b, xf, false);
                Packet p(header, {}, payload, icv_len);
                REQUIRE(encrypt_one(*c, p));
                CHECK(p.bytes == cat({v.data, Bytes(mac.begin(), mac.begin() + icv_len)}));
                CHECK(decrypt_one(*c, p));
            }
        }
    }
}

TEST_CASE("ESN puts seq high after the payload in the HMAC", "[crypto]")
{
    // RFC 4303 3.3.2.1: the high half is authenticated as if appended, never sent.
    const Bytes key = hex("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
    const Bytes header = hex("0badcafe 00000007");
    const Bytes payload = hex("0102030405060708090a0b0c0d0e0f10 1112131415161718191a1b1c0002 0404");
    for (AuthAlg a :
         {AuthAlg::HmacSha1, AuthAlg::HmacSha256, AuthAlg::HmacSha384, AuthAlg::HmacSha512}) {
        const Transform xf = enc_auth(EncAlg::Null, {}, a, key, 12);
        const Bytes mac = hmac_oneshot(a, key, cat({header, payload, be32(0xa1b2c3d4)}));
        for (Backend b : backends_for(xf)) {
            INFO(int(a) << " " << backend_name(b));
            auto c = cipher(b, xf, true);
            Packet p(header, {}, payload, 12, 0xa1b2c3d4);
            REQUIRE(encrypt_one(*c, p));
            CHECK(p.bytes == cat({header, payload, Bytes(mac.begin(), mac.begin() + 12)}));
            CHECK(decrypt_one(*c, p));
        }
    }
}

namespace {

// Every transform ESP uses, with random keys.
std::vector<Transform> all_transforms(std::mt19937 &rng)
{
    auto random = [&rng](size_t n) {
        Bytes b(n);
        for (auto &x : b)
            x = uint8_t(rng());
        return b;
    };
    std::vector<Transform> out;
    for (size_t k : {16, 24, 32}) {
        for (uint8_t icv : {8, 12, 16})
            out.push_back(aead(AeadAlg::AesGcm, random(k), random(4), icv));
        out.push_back(aead(AeadAlg::AesGmac, random(k), random(4), 16));
    }
    out.push_back(aead(AeadAlg::ChaCha20Poly1305, random(32), random(4), 16));
    struct Auth {
        AuthAlg alg;
        size_t key_len;
        uint8_t icv;
    };
    const Auth auths[] = {{AuthAlg::HmacSha1, 20, 12},   {AuthAlg::HmacSha256, 32, 16},
                          {AuthAlg::HmacSha384, 48, 24}, {AuthAlg::HmacSha512, 64, 32},
                          {AuthAlg::HmacSha1, 20, 20},   {AuthAlg::HmacSha256, 100, 32}};
    for (const Auth &a : auths) {
        for (size_t k : {16, 24, 32})
            out.push_back(enc_auth(EncAlg::AesCbc, random(k), a.alg, random(a.key_len), a.icv));
        out.push_back(enc_auth(EncAlg::Null, {}, a.alg, random(a.key_len), a.icv));
    }
    return out;
}

struct Burst {
    std::vector<Packet> packets;
    std::vector<Bytes> plaintexts;

    std::vector<CryptoOp> ops()
    {
        std::vector<CryptoOp> v;
        for (Packet &p : packets)
            v.push_back(p.op());
        return v;
    }
};

Burst random_burst(const Transform &xf, std::mt19937 &rng, size_t count)
{
    const size_t block = xf.block_size();
    const size_t sizes[] = {1, 2, 3, 4, 15, 16, 87};  // in blocks
    Burst burst;
    for (size_t i = 0; i < count; i++) {
        Bytes header(8), iv(xf.iv_len()), payload(sizes[i % std::size(sizes)] * block);
        for (auto *v : {&header, &iv, &payload})
            for (auto &x : *v)
                x = uint8_t(rng());
        burst.packets.emplace_back(header, iv, payload, xf.icv_len, uint32_t(rng()));
        burst.plaintexts.push_back(payload);
    }
    return burst;
}

std::string label(const Transform &xf, bool esn)
{
    return "aead " + std::to_string(int(xf.aead)) + " enc " + std::to_string(int(xf.enc)) +
           " auth " + std::to_string(int(xf.auth)) + " key " + std::to_string(xf.enc_key.size()) +
           " icv " + std::to_string(xf.icv_len) + (esn ? " esn" : "");
}

}  // namespace

TEST_CASE("backends agree on every transform and decrypt each other's packets", "[crypto]")
{
    std::mt19937 rng(4303);
    for (const Transform &xf : all_transforms(rng)) {
        for (bool esn : {false, true}) {
            INFO(label(xf, esn));
            const auto backends = backends_for(xf);
            REQUIRE(!backends.empty());
            const Burst original = random_burst(xf, rng, 150);  // more than one round of jobs
            std::vector<Bytes> first_ciphertexts;
            for (Backend enc_backend : backends) {
                INFO("encrypt with " << backend_name(enc_backend));
                Burst burst = original;
                auto ops = burst.ops();
                cipher(enc_backend, xf, esn)->encrypt(ops.data(), ops.size());
                std::vector<Bytes> ciphertexts;
                for (size_t i = 0; i < ops.size(); i++) {
                    REQUIRE(ops[i].ok);
                    ciphertexts.push_back(burst.packets[i].bytes);
                }
                // Same keys and IVs: every backend must produce the same bytes.
                if (first_ciphertexts.empty())
                    first_ciphertexts = ciphertexts;
                else
                    CHECK(ciphertexts == first_ciphertexts);

                for (Backend dec_backend : backends) {
                    INFO("decrypt with " << backend_name(dec_backend));
                    Burst copy = burst;
                    auto dops = copy.ops();
                    cipher(dec_backend, xf, esn)->decrypt(dops.data(), dops.size());
                    for (size_t i = 0; i < dops.size(); i++) {
                        REQUIRE(dops[i].ok);
                        const Bytes &b = copy.packets[i].bytes;
                        const size_t off = 8 + xf.iv_len();
                        CHECK(Bytes(b.begin() + off, b.begin() + off + dops[i].payload_len) ==
                              original.plaintexts[i]);
                    }
                }
            }
        }
    }
}

TEST_CASE("any flipped byte or a wrong seq high (with ESN) fails decryption", "[crypto]")
{
    std::mt19937 rng(2404);
    for (const Transform &xf : all_transforms(rng)) {
        for (bool esn : {false, true}) {
            INFO(label(xf, esn));
            const auto backends = backends_for(xf);
            Burst sealed = random_burst(xf, rng, 4);
            auto ops = sealed.ops();
            cipher(backends.front(), xf, esn)->encrypt(ops.data(), ops.size());
            const Packet &good = sealed.packets[2];  // 3 blocks of payload

            for (Backend b : backends) {
                INFO("decrypt with " << backend_name(b));
                auto c = cipher(b, xf, esn);
                // One burst holds every single-byte corruption of the packet plus the
                // untouched packet at the end, so the failures also must not leak across ops.
                std::vector<Packet> burst;
                for (size_t i = 0; i < good.bytes.size(); i++) {
                    burst.push_back(good);
                    burst.back().bytes[i] ^= uint8_t(1u << (i % 8));
                }
                burst.push_back(good);
                std::vector<CryptoOp> dops;
                for (Packet &p : burst)
                    dops.push_back(p.op());
                c->decrypt(dops.data(), dops.size());
                for (size_t i = 0; i + 1 < dops.size(); i++) {
                    INFO("flipped byte " << i);
                    CHECK_FALSE(dops[i].ok);
                }
                CHECK(dops.back().ok);

                Packet other_hi = good;
                other_hi.seq_hi ^= 0x00010000;
                CHECK(decrypt_one(*c, other_hi) == !esn);
            }
        }
    }
}

TEST_CASE("CBC refuses payloads that are not whole blocks", "[crypto]")
{
    const Transform xf =
        enc_auth(EncAlg::AesCbc, repeat(7, 16), AuthAlg::HmacSha256, repeat(9, 32), 16);
    for (Backend b : backends_for(xf)) {
        INFO(backend_name(b));
        auto c = cipher(b, xf, false);
        for (size_t len : {0, 4, 17}) {
            Packet p(repeat(1, 8), repeat(2, 16), repeat(3, len), 16);
            CHECK_FALSE(encrypt_one(*c, p));
            CHECK_FALSE(decrypt_one(*c, p));
        }
    }
}

TEST_CASE("a burst across SAs gives each packet the bytes of its own SA's cipher", "[crypto]")
{
    std::mt19937 rng(4301);
    // Every transform on every backend that has it, ESN on for every other one: the SAs of
    // one burst, backends and transforms mixed.
    std::vector<Transform> xfs;
    std::vector<std::unique_ptr<SaCipher>> sas;
    for (const Transform &xf : all_transforms(rng)) {
        for (Backend b : backends_for(xf)) {
            xfs.push_back(xf);
            sas.push_back(cipher(b, xf, sas.size() % 2 == 1));
        }
    }
    // Runs of one SA (1, 2 or 3 packets) in turn with single packets of others; more packets
    // than one round of jobs.
    std::vector<size_t> owner;
    for (size_t i = 0; owner.size() < 300; i++)
        for (size_t k = 0; k < 1 + i % 3; k++)
            owner.push_back(i % sas.size());
    Burst burst;
    for (size_t sa : owner) {
        Burst one = random_burst(xfs[sa], rng, 1);
        burst.packets.push_back(one.packets[0]);
        burst.plaintexts.push_back(one.plaintexts[0]);
    }
    std::vector<SaCipher *> ciphers;
    for (size_t sa : owner)
        ciphers.push_back(sas[sa].get());

    Burst alone = burst;
    auto alone_ops = alone.ops();
    for (size_t i = 0; i < owner.size(); i++) {
        sas[owner[i]]->encrypt(&alone_ops[i], 1);
        REQUIRE(alone_ops[i].ok);
    }
    auto ops = burst.ops();
    crypt_burst(ciphers.data(), ops.data(), ops.size(), true);
    for (size_t i = 0; i < owner.size(); i++) {
        INFO("packet " << i << " SA " << owner[i] << " " << label(xfs[owner[i]], owner[i] % 2));
        CHECK(ops[i].ok);
        CHECK(burst.packets[i].bytes == alone.packets[i].bytes);
    }

    // One forged packet fails alone; the others decrypt to their plaintext.
    const size_t forged = 77;
    burst.packets[forged].bytes.back() ^= 1;
    ops = burst.ops();
    crypt_burst(ciphers.data(), ops.data(), ops.size(), false);
    for (size_t i = 0; i < owner.size(); i++) {
        INFO("packet " << i << " SA " << owner[i] << " " << label(xfs[owner[i]], owner[i] % 2));
        if (i == forged) {
            CHECK_FALSE(ops[i].ok);
            continue;
        }
        REQUIRE(ops[i].ok);
        const Bytes &b = burst.packets[i].bytes;
        const size_t off = 8 + xfs[owner[i]].iv_len();
        CHECK(Bytes(b.begin() + off, b.begin() + off + ops[i].payload_len) == burst.plaintexts[i]);
    }
}

TEST_CASE("intel-ipsec-mb runs AES-CBC and HMAC jobs of many SAs in one call", "[crypto]")
{
    std::mt19937 rng(2104);
    std::vector<std::unique_ptr<SaCipher>> sas;
    std::vector<Transform> xfs;
    for (const Transform &xf : all_transforms(rng)) {
        if (!xf.is_aead()) {
            xfs.push_back(xf);
            sas.push_back(cipher(Backend::IpsecMb, xf, false));
        }
    }
    REQUIRE(sas.size() > 1);
    Burst burst;
    std::vector<SaCipher *> ciphers;
    for (size_t i = 0; i < sas.size(); i++) {
        Burst one = random_burst(xfs[i], rng, 1);
        burst.packets.push_back(one.packets[0]);
        ciphers.push_back(sas[i].get());
    }
    // Every SA differs from the one before: one call takes them all, filling the lanes.
    auto ops = burst.ops();
    CHECK(ciphers[0]->run_many(ciphers.data(), ops.data(), ops.size(), true) == ops.size());
    for (const CryptoOp &op : ops)
        CHECK(op.ok);
}

// intel-ipsec-mb 1.3 writes one global variable at every call: each thread that runs its crypto
// has a copy of the library of its own (crypto_ipsecmb.cpp), and uses keys another copy
// expanded.
TEST_CASE("each thread runs intel-ipsec-mb in a copy of its own, on keys made in another",
          "[crypto][threads]")
{
    if (!ipsecmb_private_copies()) {
        WARN("not run: this build or library version keeps every thread on one copy");
        return;
    }
    const void *here = ipsecmb_thread_code();
    REQUIRE(here != nullptr);
    std::mt19937 rng(112);
    for (const Transform &xf : all_transforms(rng)) {
        if (!backend_supports(Backend::IpsecMb, xf))
            continue;
        INFO(label(xf, false));
        auto c = cipher(Backend::IpsecMb, xf, false);  // keys expanded on this thread
        const Burst original = random_burst(xf, rng, 70);
        Burst mine = original, theirs = original;
        auto my_ops = mine.ops();
        c->encrypt(my_ops.data(), my_ops.size());
        // The other thread encrypts the same packets, and decrypts this one's, one of them
        // with a flipped byte.
        Burst back = mine;
        back.packets[3].bytes[20] ^= 1;
        const void *there = nullptr;
        std::vector<CryptoOp> their_ops, back_ops;
        std::thread t([&] {
            there = ipsecmb_thread_code();
            their_ops = theirs.ops();
            c->encrypt(their_ops.data(), their_ops.size());
            back_ops = back.ops();
            c->decrypt(back_ops.data(), back_ops.size());
        });
        t.join();
        REQUIRE(there != nullptr);
        CHECK(there != here);
        const size_t off = 8 + xf.iv_len();
        for (size_t i = 0; i < my_ops.size(); i++) {
            INFO("packet " << i);
            REQUIRE(my_ops[i].ok);
            REQUIRE(their_ops[i].ok);
            CHECK(theirs.packets[i].bytes == mine.packets[i].bytes);
            CHECK(back_ops[i].ok == (i != 3));
            if (i != 3) {
                const Bytes &b = back.packets[i].bytes;
                CHECK(
                    Bytes(b.begin() + long(off), b.begin() + long(off) + back_ops[i].payload_len) ==
                    original.plaintexts[i]);
            }
        }
    }
}

TEST_CASE("every cipher names its whole object as what it reads per op", "[crypto]")
{
    std::mt19937 rng(64);
    for (const Transform &xf : all_transforms(rng))
        for (Backend b : backends_for(xf)) {
            INFO(label(xf, false) << " " << backend_name(b));
            auto c = cipher(b, xf, false);
            const SaCipher::Hot h = c->hot();
            CHECK(h.p == c.get());
            CHECK(h.len > sizeof(SaCipher));  // set by the backend's constructor
        }
}
