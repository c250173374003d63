// The ESP algorithms xesp offers, by their ip xfrm / kernel names, with their valid key and
// ICV sizes. The advice given for a name that is not one of them: config/xfrm_algs.h.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "userspace/esp/sa_config.h"

namespace xesp::xfrm {

enum class Kind : uint8_t { Aead, Enc, Auth };

struct AlgInfo {
    Kind kind;
    uint8_t id;                         // AeadAlg / EncAlg / AuthAlg
    std::string_view name;              // as ip xfrm and the kernel spell it
    std::string_view alias;             // the short name ip xfrm also accepts, if any
    std::array<uint16_t, 3> key_bytes;  // valid key sizes (0 = end of list, except for NULL)
    std::array<uint16_t, 3> icv_bits;   // aead: allowed ICV bits; auth: {ICV bits of `auth`}
};

// `auth NAME KEY` gives the ICV length the kernel gives it, so that one line means the same SA
// to xesp and to `ip xfrm`: for hmac(sha256) that is 96 bits (a pre-RFC 4868 draft value the
// kernel keeps), not RFC 4868's 128. Peers other than Linux want `auth-trunc hmac(sha256) KEY
// 128`. format_sa always writes auth-trunc with explicit bits.
inline constexpr std::array<AlgInfo, 9> kAlgs{{
    {Kind::Aead, uint8_t(AeadAlg::AesGcm), "rfc4106(gcm(aes))", "", {16, 24, 32}, {64, 96, 128}},
    {Kind::Aead, uint8_t(AeadAlg::AesGmac), "rfc4543(gcm(aes))", "", {16, 24, 32}, {128, 0, 0}},
    {Kind::Aead,
     uint8_t(AeadAlg::ChaCha20Poly1305),
     "rfc7539esp(chacha20,poly1305)",
     "",
     {32, 0, 0},
     {128, 0, 0}},
    {Kind::Enc, uint8_t(EncAlg::AesCbc), "cbc(aes)", "aes", {16, 24, 32}, {}},
    {Kind::Enc, uint8_t(EncAlg::Null), "ecb(cipher_null)", "cipher_null", {0, 0, 0}, {}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha1), "hmac(sha1)", "sha1", {}, {96, 0, 0}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha256), "hmac(sha256)", "sha256", {}, {96, 0, 0}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha384), "hmac(sha384)", "sha384", {}, {192, 0, 0}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha512), "hmac(sha512)", "sha512", {}, {256, 0, 0}},
}};

// Digest bits of an HMAC: the longest auth-trunc.
unsigned digest_bits(AuthAlg a);

// The algorithm named `name` (its full name or its ip xfrm alias), or nullptr.
const AlgInfo *find_alg(std::string_view name);
// The algorithm of kind `k` with enum value `id`, or nullptr.
const AlgInfo *alg_of(Kind k, uint8_t id);

}  // namespace xesp::xfrm
