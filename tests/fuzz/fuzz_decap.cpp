// libFuzzer target for the inbound path. The first byte picks an SA of the table below, by
// (byte >> 1) % kSaCount, and how the rest is used:
//   even: the bytes are an IP packet handed to the engine as it comes off the wire (parsing,
//         classification, length checks, NAT-T markers, decryption of ESP made elsewhere);
//   odd:  the bytes are the plaintext of an ESP payload, encrypted with the SA's key so that it
//         authenticates: the checks after the ICV (padding, next header, inner headers, TFC
//         trimming, transport-mode rebuild, selectors) see arbitrary content.
// The engine holds that one SA (and its inbound policy), knows the SA's destination as its own
// address, and starts afresh for every input.
//
// The table is every transform in every layout: tunnel and transport, IPv4 and IPv6 outside
// and inside, NAT-T, ESN. tests/fuzz/make_seeds.py builds the same SAs (keep them in step) and
// writes seeds of both kinds for each, so that fuzzing starts on the decryption success paths.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "userspace/esp/engine.h"
#include "userspace/base/wire.h"

using namespace xesp;

namespace {

struct Transform {
    AeadAlg aead;
    EncAlg enc;
    AuthAlg auth;
    unsigned icv_bits;
    unsigned enc_key_len, auth_key_len;  // an AEAD's key ends in its 4-byte salt
};

// As `ip xfrm` would say: `auth` gives the kernel's ICV (96 bits for sha1, 192 for sha384),
// `aead ... 128` and `auth-trunc ... BITS` the bits given.
const Transform kTransforms[] = {
    {AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 128, 20, 0},
    {AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 128, 28, 0},
    {AeadAlg::AesGcm, EncAlg::None, AuthAlg::None, 128, 36, 0},
    {AeadAlg::AesGmac, EncAlg::None, AuthAlg::None, 128, 20, 0},
    {AeadAlg::ChaCha20Poly1305, EncAlg::None, AuthAlg::None, 128, 36, 0},
    {AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha1, 96, 16, 20},
    {AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha256, 128, 16, 32},
    {AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha384, 192, 32, 48},
    {AeadAlg::None, EncAlg::AesCbc, AuthAlg::HmacSha512, 256, 32, 64},
    {AeadAlg::None, EncAlg::Null, AuthAlg::HmacSha256, 128, 0, 32},
};

struct Layout {
    bool tunnel;
    int outer, inner;  // address families
    bool natt, esn;
};

const Layout kLayouts[] = {
    {true, 4, 4, false, false}, {false, 6, 6, false, false}, {true, 6, 6, true, true},
    {false, 4, 4, true, false}, {true, 4, 6, false, true},
};

constexpr size_t kTransformCount = sizeof(kTransforms) / sizeof(kTransforms[0]);
constexpr size_t kSaCount = kTransformCount * (sizeof(kLayouts) / sizeof(kLayouts[0]));

// SA n: transform n % kTransformCount in layout n / kTransformCount, from the peer to us,
// SPI 0x100 + n, reqid 1, replay-window 64, with an inbound policy for its traffic. Key byte i
// of SA n is (n * 16 + i) & 0xff, the authentication key's continue from the encryption key's.
Config sa_config(size_t n)
{
    const Transform &t = kTransforms[n % kTransformCount];
    const Layout &l = kLayouts[n / kTransformCount];
    IpAddr peer = *IpAddr::parse(l.outer == 4 ? "192.0.2.1" : "2001:db8::1");
    IpAddr self = *IpAddr::parse(l.outer == 4 ? "192.0.2.2" : "2001:db8::2");
    Prefix from = *Prefix::parse(l.inner == 4 ? "10.1.0.0/16" : "2001:db8:1::/48");
    Prefix to = *Prefix::parse(l.inner == 4 ? "10.2.0.0/16" : "2001:db8:2::/48");
    uint8_t key[KeyBytes::kMax * 2];
    for (unsigned i = 0; i < t.enc_key_len + t.auth_key_len; i++)
        key[i] = uint8_t(n * 16 + i);

    SaConfig sa;
    sa.src = peer;
    sa.dst = self;
    sa.spi = uint32_t(0x100 + n);
    sa.reqid = 1;
    sa.mode = l.tunnel ? Mode::Tunnel : Mode::Transport;
    sa.xf.aead = t.aead;
    sa.xf.enc = t.enc;
    sa.xf.auth = t.auth;
    sa.xf.icv_len = uint8_t(t.icv_bits / 8);
    if (sa.xf.is_aead()) {
        sa.xf.enc_key.assign(key, t.enc_key_len - 4);
        std::memcpy(sa.xf.salt.data(), key + t.enc_key_len - 4, 4);
    } else {
        sa.xf.enc_key.assign(key, t.enc_key_len);
        sa.xf.auth_key.assign(key + t.enc_key_len, t.auth_key_len);
    }
    sa.replay_window = 64;
    sa.esn = l.esn;
    if (l.natt)
        sa.encap = NatTEncap{4500, 4500, *IpAddr::parse(l.outer == 4 ? "0.0.0.0" : "::")};

    PolicyConfig pol;
    PolicyTmpl tmpl;
    tmpl.reqid = 1;
    if (l.tunnel) {
        sa.sel = Selector{from, to};
        pol.sel = Selector{from, to};
        pol.dir = Dir::Fwd;
        tmpl.src = peer;
        tmpl.dst = self;
        tmpl.mode = Mode::Tunnel;
    } else {
        pol.sel = Selector{Prefix{peer, uint8_t(peer.size() * 8)},
                           Prefix{self, uint8_t(self.size() * 8)}};
        pol.dir = Dir::In;
        tmpl.mode = Mode::Transport;
    }
    pol.tmpl = tmpl;
    Config cfg;
    cfg.sas.push_back(sa);
    cfg.policies.push_back(pol);
    return cfg;
}

struct Fixture {
    std::vector<Config> configs;
    std::vector<std::unique_ptr<SaCipher>> ciphers;
    std::unique_ptr<Engine> engine;

    Fixture()
    {
        for (size_t n = 0; n < kSaCount; n++) {
            Config cfg = sa_config(n);
            const SaConfig &sa = cfg.sas.front();
            ciphers.push_back(std::move(*make_cipher(Backend::OpenSsl, sa.xf, sa.esn)));
            configs.push_back(std::move(cfg));
        }
    }
    void reset(size_t n)
    {
        EngineOptions opt;
        opt.local = {*IpAddr::parse("192.0.2.2"), *IpAddr::parse("2001:db8::2")};
        engine = std::move(*Engine::create(configs[n], Backend::OpenSsl, opt));
    }
};

// outer IP [UDP] ESP(spi, seq 1) IV payload ICV, for the payload encrypted in place; the
// length of the packet, or 0 if the payload is empty.
uint32_t build_esp(Fixture &fx, size_t n, const uint8_t *data, size_t size, uint8_t *ip)
{
    const SaConfig &sa = fx.configs[n].sas.nth(0);
    uint32_t block = sa.xf.block_size(), iv = sa.xf.iv_len();
    uint32_t plen = uint32_t(size) / block * block;
    if (plen == 0)
        return 0;
    bool v4 = sa.dst.family == 4;
    uint32_t hdr = v4 ? 20 : 40, udp = sa.encap ? 8 : 0;
    uint32_t total = hdr + udp + 8 + iv + plen + sa.xf.icv_len;
    uint8_t proto = udp ? wire::kProtoUdp : wire::kProtoEsp;
    if (v4) {
        ip[0] = 0x45;
        wire::put16(ip + 2, uint16_t(total));
        ip[8] = 64;
        ip[9] = proto;
        std::memcpy(ip + 12, sa.src.b.data(), 4);
        std::memcpy(ip + 16, sa.dst.b.data(), 4);
        wire::ipv4_set_checksum(ip);
    } else {
        ip[0] = 0x60;
        wire::put16(ip + 4, uint16_t(total - 40));
        ip[6] = proto;
        ip[7] = 64;
        std::memcpy(ip + 8, sa.src.b.data(), 16);
        std::memcpy(ip + 24, sa.dst.b.data(), 16);
    }
    if (udp) {
        wire::put16(ip + hdr, 4500);
        wire::put16(ip + hdr + 2, 4500);
        wire::put16(ip + hdr + 4, uint16_t(total - hdr));
    }
    uint8_t *esp = ip + hdr + udp;
    wire::put32(esp, sa.spi);
    wire::put32(esp + 4, 1);
    std::memcpy(esp + 8 + iv, data, plen);
    CryptoOp op{esp, plen, 0, false};
    fx.ciphers[n]->encrypt(&op, 1);
    if (!op.ok)
        __builtin_trap();
    return total;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static Fixture fx;
    if (size < 2 || size > 3000)
        return 0;
    uint8_t mode = data[0];
    data++, size--;
    size_t which = (mode >> 1) % kSaCount;
    fx.reset(which);
    std::vector<uint8_t> frame(kFrameSize);
    Pkt pkt{frame.data(), kFrameSize, kFrameHeadroom, 0};
    if (!(mode & 1)) {
        std::memcpy(frame.data() + kFrameHeadroom, data, size);
        pkt.len = uint32_t(size);
    } else {
        pkt.len = build_esp(fx, which, data, size, frame.data() + kFrameHeadroom);
        if (pkt.len == 0)
            return 0;
    }
    Pkt *p = &pkt;
    fx.engine->process(&p, 1);
    // Whatever it decided, the packet must lie inside its frame.
    if (pkt.verdict != Verdict::Drop && (pkt.l3 > kFrameSize || pkt.len > kFrameSize - pkt.l3))
        __builtin_trap();
    const EngineStats &st = fx.engine->stats();
    if (st.encrypted + st.decrypted + st.passed + st.dropped != 1)
        __builtin_trap();
    // FUZZ_DECAP_SHOW=1: one line per input, to check that seeds decrypt.
    static const bool show = std::getenv("FUZZ_DECAP_SHOW") != nullptr;
    if (show)
        std::fprintf(stderr, "fuzz_decap: sa %zu %s: %s\n", which, mode & 1 ? "odd" : "even",
                     st.decrypted                   ? "decrypted"
                     : pkt.verdict == Verdict::Drop ? std::string(drop_name(pkt.drop)).c_str()
                                                    : "not decrypted");
    return 0;
}
