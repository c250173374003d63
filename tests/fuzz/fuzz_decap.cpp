// libFuzzer target for the inbound path. The first byte picks how the rest is used:
//   even: the bytes are an IP packet handed to the engine as it comes off the wire (parsing,
//         classification, length checks, NAT-T markers);
//   odd:  the bytes are the plaintext of an ESP payload, encrypted with the SA's key so that it
//         authenticates: the checks after the ICV (padding, next header, inner headers, TFC
//         trimming, transport-mode rebuild, selectors) see arbitrary content.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "userspace/config.h"
#include "userspace/engine.h"
#include "userspace/wire.h"

using namespace xesp;

namespace {

SaConfig make_sa(uint32_t spi, Mode mode, bool cbc, bool natt, bool esn)
{
    SaConfig c;
    c.src = *IpAddr::parse("192.0.2.1");
    c.dst = *IpAddr::parse("192.0.2.2");
    c.spi = spi;
    c.mode = mode;
    c.esn = esn;
    c.replay_window = 64;
    uint8_t key[32];
    for (int i = 0; i < 32; i++)
        key[i] = uint8_t(i);
    if (cbc) {
        c.xf.enc = EncAlg::AesCbc;
        c.xf.auth = AuthAlg::HmacSha256;
        c.xf.enc_key.assign(key, 16);
        c.xf.auth_key.assign(key, 32);
        c.xf.icv_len = 16;
    } else {
        c.xf.aead = AeadAlg::AesGcm;
        c.xf.enc_key.assign(key, 16);
        c.xf.icv_len = 16;
    }
    if (natt)
        c.encap = NatTEncap{4500, 4500, IpAddr{}};
    c.sel = Selector{*Prefix::parse("10.0.0.0/8"), *Prefix::parse("0.0.0.0/0")};
    return c;
}

struct Fixture {
    Config config;
    std::unique_ptr<Engine> engine;
    std::vector<std::unique_ptr<SaCipher>> ciphers;

    Fixture()
    {
        config.sas = {make_sa(1, Mode::Tunnel, false, false, false),
                      make_sa(2, Mode::Transport, true, false, true),
                      make_sa(3, Mode::Tunnel, true, true, false),
                      make_sa(4, Mode::Transport, false, true, false)};
        for (auto &sa : config.sas)
            ciphers.push_back(std::move(*make_cipher(Backend::OpenSsl, sa.xf, sa.esn)));
    }
    void reset() { engine = std::move(*Engine::create(config, Backend::OpenSsl)); }
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static Fixture fx;
    if (size < 2 || size > 3000)
        return 0;
    fx.reset();
    std::vector<uint8_t> frame(kFrameSize);
    Pkt pkt{frame.data(), kFrameSize, kFrameHeadroom, 0};
    uint8_t mode = data[0];
    data++, size--;
    if (!(mode & 1)) {
        std::memcpy(frame.data() + kFrameHeadroom, data, size);
        pkt.len = uint32_t(size);
    } else {
        // outer IPv4 [UDP] ESP(spi, seq) IV payload ICV, payload rounded down to the block
        size_t which = (mode >> 1) % fx.config.sas.size();
        const SaConfig &sa = fx.config.sas[which];
        uint32_t block = sa.xf.block_size(), iv = sa.xf.iv_len();
        uint32_t plen = uint32_t(size) / block * block;
        if (plen == 0)
            return 0;
        uint32_t udp = sa.encap ? 8 : 0;
        uint8_t *ip = frame.data() + kFrameHeadroom;
        uint32_t total = 20 + udp + 8 + iv + plen + sa.xf.icv_len;
        ip[0] = 0x45;
        wire::put16(ip + 2, uint16_t(total));
        ip[8] = 64;
        ip[9] = udp ? wire::kProtoUdp : wire::kProtoEsp;
        std::memcpy(ip + 12, sa.src.b.data(), 4);
        std::memcpy(ip + 16, sa.dst.b.data(), 4);
        wire::ipv4_set_checksum(ip);
        if (udp) {
            wire::put16(ip + 20, 4500);
            wire::put16(ip + 22, 4500);
            wire::put16(ip + 24, uint16_t(total - 20));
        }
        uint8_t *esp = ip + 20 + udp;
        wire::put32(esp, sa.spi);
        wire::put32(esp + 4, 1);
        std::memcpy(esp + 8 + iv, data, plen);
        CryptoOp op{esp, plen, 0, false};
        fx.ciphers[which]->encrypt(&op, 1);
        if (!op.ok)
            __builtin_trap();
        pkt.len = total;
    }
    Pkt *p = &pkt;
    fx.engine->process(&p, 1);
    // Whatever it decided, the packet must lie inside its frame.
    if (pkt.verdict != Verdict::Drop &&
        (pkt.l3 > kFrameSize || pkt.len > kFrameSize - pkt.l3))
        __builtin_trap();
    const EngineStats &st = fx.engine->stats();
    if (st.encrypted + st.decrypted + st.passed + st.dropped != 1)
        __builtin_trap();
    return 0;
}
