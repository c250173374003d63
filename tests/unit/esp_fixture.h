// Building blocks for ESP tests: SA configs for every transform, plaintext packets, frames with
// headroom, and an engine pair (sender, receiver) over the same SA.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "userspace/config/config.h"
#include "userspace/esp/engine.h"
#include "userspace/base/wire.h"

namespace xesp::test {

struct TransformCase {
    const char *name;
    AeadAlg aead;
    EncAlg enc;
    AuthAlg auth;
    uint8_t key_len, auth_key_len, icv_len;
};

inline const std::vector<TransformCase> &all_transforms()
{
    static const std::vector<TransformCase> t = {
        {"aes128-gcm16", AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 16, 0, 16},
        {"aes192-gcm12", AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 24, 0, 12},
        {"aes256-gcm8", AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 32, 0, 8},
        {"aes128-gmac", AeadAlg::AesGmac, EncAlg::None, AuthAlg::None, 16, 0, 16},
        {"aes256-gmac", AeadAlg::AesGmac, EncAlg::None, AuthAlg::None, 32, 0, 16},
        {"chacha20-poly1305", AeadAlg::ChaCha20Poly1305, EncAlg::None, AuthAlg::None, 32, 0, 16},
        {"aes128-cbc-sha1", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha1, 16, 20, 12},
        {"aes192-cbc-sha256", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha256, 24, 32, 16},
        {"aes256-cbc-sha384", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha384, 32, 48, 24},
        {"aes256-cbc-sha512", AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha512, 32, 64, 32},
        {"null-sha256", AeadAlg::None, EncAlg::Null, AuthAlg::HmacSha256, 0, 32, 16},
    };
    return t;
}

inline Transform make_transform(const TransformCase &t, uint8_t seed = 1)
{
    Transform x;
    uint8_t key[96];  // room for the longest HMAC key at its offset
    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = uint8_t(seed * 31 + i * 7);
    x.aead = t.aead;
    x.enc = t.enc;
    x.auth = t.auth;
    x.enc_key.assign(key, t.key_len);
    x.auth_key.assign(key + 3, t.auth_key_len);
    x.salt = {uint8_t(seed), 0xa5, 0x5a, 0x11};
    x.icv_len = t.icv_len;
    return x;
}

inline IpAddr addr(const char *s)
{
    return *IpAddr::parse(s);
}
inline Prefix pfx(const char *s)
{
    return *Prefix::parse(s);
}

inline SaConfig make_sa(const TransformCase &t, Mode mode, int outer_family, bool natt = false,
                        bool esn = false)
{
    SaConfig c;
    c.src = addr(outer_family == 4 ? "192.0.2.1" : "2001:db8::1");
    c.dst = addr(outer_family == 4 ? "192.0.2.2" : "2001:db8::2");
    c.spi = 0x1000;
    c.reqid = 1;
    c.mode = mode;
    c.xf = make_transform(t);
    c.esn = esn;
    c.replay_window = 128;
    if (natt)
        c.encap = NatTEncap{4500, 4500, IpAddr{}};
    return c;
}

// Plaintext packet bytes: IPv4 or IPv6, UDP with a payload pattern.
inline std::vector<uint8_t> udp_packet(int family, const char *src, const char *dst, size_t payload,
                                       uint8_t tos = 0, uint16_t sport = 1000,
                                       uint16_t dport = 2000)
{
    using namespace wire;
    size_t hl = family == 4 ? kIpv4Len : kIpv6Len;
    std::vector<uint8_t> p(hl + kUdpLen + payload);
    IpAddr s = addr(src), d = addr(dst);
    if (family == 4) {
        p[0] = 0x45;
        p[1] = tos;
        put16(&p[2], uint16_t(p.size()));
        put16(&p[4], 0x1234);
        p[6] = 0x40;
        p[8] = 64;
        p[9] = kProtoUdp;
        std::memcpy(&p[12], s.b.data(), 4);
        std::memcpy(&p[16], d.b.data(), 4);
        ipv4_set_checksum(p.data());
    } else {
        p[0] = uint8_t(0x60 | tos >> 4);
        p[1] = uint8_t((tos & 0x0f) << 4);
        put16(&p[4], uint16_t(p.size() - kIpv6Len));
        p[6] = kProtoUdp;
        p[7] = 64;
        std::memcpy(&p[8], s.b.data(), 16);
        std::memcpy(&p[24], d.b.data(), 16);
    }
    put16(&p[hl], sport);
    put16(&p[hl + 2], dport);
    put16(&p[hl + 4], uint16_t(kUdpLen + payload));
    for (size_t i = 0; i < payload; i++)
        p[hl + kUdpLen + i] = uint8_t(i * 13 + payload);
    return p;
}

// A frame with headroom holding one IP packet.
struct Frame {
    std::vector<uint8_t> buf = std::vector<uint8_t>(kFrameSize);
    Pkt pkt;

    explicit Frame(const std::vector<uint8_t> &ip)
    {
        std::memcpy(buf.data() + kFrameHeadroom, ip.data(), ip.size());
        pkt = Pkt{buf.data(), kFrameSize, kFrameHeadroom, uint32_t(ip.size())};
    }
    std::vector<uint8_t> bytes() const { return {pkt.ip(), pkt.ip() + pkt.len}; }
};

inline std::unique_ptr<Engine> make_engine(const Config &c, Backend b = Backend::Auto)
{
    auto e = Engine::create(c, b);
    if (!e)
        throw std::runtime_error(e.error().message);
    return std::move(*e);
}

inline Verdict run(Engine &e, Frame &f)
{
    Pkt *p = &f.pkt;
    e.process(&p, 1);
    return f.pkt.verdict;
}

// The template of a policy that names sa: its addresses in tunnel mode, its reqid and mode.
inline PolicyTmpl tmpl_for(const SaConfig &sa)
{
    PolicyTmpl t;
    t.src = sa.mode == Mode::Tunnel ? sa.src : IpAddr{};
    t.dst = sa.mode == Mode::Tunnel ? sa.dst : IpAddr{};
    t.reqid = sa.reqid;
    t.mode = sa.mode;
    return t;
}

// Sender config: the SA plus the outbound policy that selects the given inner flow.
inline Config sender(const SaConfig &sa, const char *inner_src_pfx, const char *inner_dst_pfx)
{
    Config c;
    SaConfig s = sa;
    s.dir = Dir::Out;
    c.sas.push_back(s);
    PolicyConfig p;
    p.sel.src = pfx(inner_src_pfx);
    p.sel.dst = pfx(inner_dst_pfx);
    p.dir = Dir::Out;
    p.tmpl = tmpl_for(sa);
    c.policies.push_back(p);
    return c;
}

// The fwd policy that accepts what comes out of sa, whatever the inner addresses, below any
// other policy: an SA carries only what a policy lets out of it (RFC 4301 5.2).
inline PolicyConfig accept_from(const SaConfig &sa, const char *inner_pfx)
{
    PolicyConfig p;
    p.sel.src = pfx(inner_pfx);
    p.sel.dst = pfx(inner_pfx);
    p.dir = Dir::Fwd;
    p.priority = UINT32_MAX;
    p.tmpl = tmpl_for(sa);
    return p;
}

// Receiver config: the SA, and unless told otherwise policies that accept any inner IPv4 and
// IPv6 through it.
inline Config receiver(const SaConfig &sa, bool accept_any = true)
{
    Config c;
    SaConfig s = sa;
    s.dir = Dir::In;
    c.sas.push_back(s);
    if (accept_any) {
        c.policies.push_back(accept_from(sa, "0.0.0.0/0"));
        c.policies.push_back(accept_from(sa, "::/0"));
    }
    return c;
}

}  // namespace xesp::test
