// The transforms `xesp bench` and `xesp bench pipeline` know by name, and the SA they run.
#pragma once

#include <string>

#include "userspace/esp/sa_config.h"

namespace xesp::cli {

struct NamedTransform {
    const char *name;
    AeadAlg aead;
    EncAlg enc;
    AuthAlg auth;
    uint8_t key_len, auth_key_len, icv_len;
};

inline constexpr NamedTransform kTransforms[] = {
    {"aes128gcm", AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 16, 0, 16},
    {"aes256gcm", AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 32, 0, 16},
    {"aes128gmac", AeadAlg::AesGmac, EncAlg::None, AuthAlg::None, 16, 0, 16},
    {"chacha20poly1305", AeadAlg::ChaCha20Poly1305, EncAlg::None, AuthAlg::None, 32, 0, 16},
    {"aes128cbc-sha1", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha1, 16, 20, 12},
    {"aes128cbc-sha256", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha256, 16, 32, 16},
    {"aes256cbc-sha256", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha256, 32, 32, 16},
    {"aes256cbc-sha512", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha512, 32, 64, 32},
    {"null-sha256", AeadAlg::None, EncAlg::Null, AuthAlg::HmacSha256, 0, 32, 16},
};

inline const NamedTransform *find_transform(const std::string &name)
{
    for (const auto &t : kTransforms)
        if (name == t.name)
            return &t;
    return nullptr;
}

inline SaConfig bench_sa(const NamedTransform &t)
{
    SaConfig c;
    c.src = *IpAddr::parse("192.0.2.1");
    c.dst = *IpAddr::parse("192.0.2.2");
    c.spi = 0x1000;
    c.mode = Mode::Tunnel;
    c.replay_window = 64;
    uint8_t key[96];  // room for the longest HMAC key at its offset
    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = uint8_t(i * 7 + 1);
    c.xf.aead = t.aead;
    c.xf.enc = t.enc;
    c.xf.auth = t.auth;
    c.xf.enc_key.assign(key, t.key_len);
    c.xf.auth_key.assign(key + 8, t.auth_key_len);
    c.xf.salt = {1, 2, 3, 4};
    c.xf.icv_len = t.icv_len;
    return c;
}

}  // namespace xesp::cli
