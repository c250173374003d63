#include "userspace/esp/sa.h"

#include <algorithm>
#include <cstddef>

#include "userspace/base/clock.h"
#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

Result<void> Sa::check(const SaConfig &cfg, Backend backend)
{
    Backend resolved = resolve_backend(backend, cfg.xf);
    if (!backend_supports(resolved, cfg.xf))
        return make_error(std::string("crypto backend '") + std::string(backend_name(resolved)) +
                          "' does not implement " + cfg.xf.name() + "; use --crypto auto");
    return {};
}

Result<std::unique_ptr<Sa>> Sa::create(const SaConfig &cfg, Backend backend)
{
    if (auto r = check(cfg, backend); !r)
        return r.error();
    auto cipher = make_cipher(resolve_backend(backend, cfg.xf), cfg.xf, cfg.esn);
    if (!cipher)
        return cipher.error();

    std::unique_ptr<Sa> sa(new Sa());
    sa->cfg_ = cfg;
    static std::atomic<uint64_t> serials{0};
    sa->serial_ = ++serials;
    sa->cipher_owner_ = std::move(*cipher);
    sa->cipher_ = sa->cipher_owner_.get();
    sa->crypt_anywhere_ = sa->cipher_->thread_safe();
    SaCipher::Hot hot = sa->cipher_->hot();
    sa->crypt_hot_ = static_cast<const char *>(hot.p);
    sa->crypt_hot_len_ = uint16_t(std::min<size_t>(hot.len, kMaxCryptHot));
    sa->spi_be_ = htonl(cfg.spi);
    sa->iv_len_ = cfg.xf.iv_len();
    sa->icv_len_ = cfg.xf.icv_len;
    sa->block_ = cfg.xf.block_size();
    sa->tunnel_ = cfg.mode == Mode::Tunnel;
    sa->natt_ = cfg.encap.has_value();
    sa->esn_ = cfg.esn;
    sa->aead_ = cfg.xf.is_aead();
    sa->selector_ = cfg.sel.has_value();
    sa->hard_packets_ = cfg.lifetime.hard_packets;
    sa->hard_bytes_ = cfg.lifetime.hard_bytes;
    sa->set_next_limits();
    sa->oseq_ = cfg.esn ? (uint64_t(cfg.oseq_hi) << 32 | cfg.oseq) : cfg.oseq;
    sa->replay_.init(cfg.replay_window, cfg.esn,
                     cfg.esn ? (uint64_t(cfg.seq_hi) << 32 | cfg.seq) : cfg.seq);
    sa->build_outer();
    sa->added_ns_ = now_ns();
    return sa;
}

// The outer header of tunnel mode is the same for every packet but for its length, ID,
// traffic class and checksum: build it once.
void Sa::build_outer()
{
    uint8_t *p = outer_.data();
    uint8_t next = natt() ? kProtoUdp : kProtoEsp;
    if (cfg_.src.family == 4) {
        p[0] = 0x45;
        p[6] = 0x40;  // DF: the outer packet is not fragmented on the way
        p[8] = 64;    // TTL
        p[9] = next;
        std::memcpy(p + 12, cfg_.src.b.data(), 4);
        std::memcpy(p + 16, cfg_.dst.b.data(), 4);
        outer_len_ = kIpv4Len;
        // TTL/protocol and the addresses; version/TOS, length, ID and flags are added per packet
        outer_csum_base_ = csum_add(0, p + 8, 2) + csum_add(0, p + 12, 8);
    } else {
        p[0] = 0x60;
        p[6] = next;
        p[7] = 64;  // hop limit
        std::memcpy(p + 8, cfg_.src.b.data(), 16);
        std::memcpy(p + 24, cfg_.dst.b.data(), 16);
        outer_len_ = kIpv6Len;
    }
    if (natt()) {
        put16(p + outer_len_, cfg_.encap->sport);
        put16(p + outer_len_ + 2, cfg_.encap->dport);
        outer_len_ += kUdpLen;
    }
}

// The runtime part is where sa.h says, every packet's fields within its kHotBytes. Sa is not
// standard-layout (private members, a std::function), which offsetof tolerates in GCC and
// Clang as long as there is no virtual base.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
void Sa::check_layout()
{
    static_assert(alignof(Sa) == 64);
    static_assert(offsetof(Sa, outer_) == 0);
    static_assert(offsetof(Sa, cipher_) == 64);
    static_assert(offsetof(Sa, hard_packets_) == 128);
    static_assert(offsetof(Sa, replay_) + sizeof(ReplayWindow) <= 192);
    static_assert(offsetof(Sa, counters_) == 192);
    static_assert(offsetof(Sa, counters_) + offsetof(Counters, bytes) + 8 <= Sa::kHotBytes);
}
#pragma GCC diagnostic pop

void Sa::expire(bool hard)
{
    bool &flag = hard ? hard_expired_ : soft_expired_;
    if (flag)
        return;
    flag = true;
    if (on_expire_)
        on_expire_(*this, hard);
}

uint64_t Sa::seconds_left(uint64_t now, bool hard) const
{
    const Lifetime &l = cfg_.lifetime;
    auto left = [&](uint64_t limit, uint64_t since) {
        uint64_t s = now > since ? (now - since) / kSecondNs : 0;
        return s >= limit ? 0 : limit - s;
    };
    uint64_t add = hard ? l.hard_add_s : l.soft_add_s, use = hard ? l.hard_use_s : l.soft_use_s;
    uint64_t n = add != UINT64_MAX ? left(add, added_ns_) : UINT64_MAX;
    if (use != UINT64_MAX && first_use_ns_)
        n = std::min(n, left(use, first_use_ns_));
    return n;
}

void Sa::check_time(uint64_t now)
{
    if (!first_use_ns_ && life_packets_)
        first_use_ns_ = now;
    if (seconds_left(now, false) == 0)
        expire(false);
    if (seconds_left(now, true) == 0)
        expire(true);
}

// The lowest packet and byte counts at which charge() has something to do: the soft limits
// until they are crossed, then the hard ones.
void Sa::set_next_limits()
{
    const Lifetime &l = cfg_.lifetime;
    next_packets_ = std::min(soft_expired_ ? UINT64_MAX : l.soft_packets,
                             hard_expired_ ? UINT64_MAX : l.hard_packets);
    next_bytes_ = std::min(soft_expired_ ? UINT64_MAX : l.soft_bytes,
                           hard_expired_ ? UINT64_MAX : l.hard_bytes);
}

bool Sa::crossed_limit()
{
    const Lifetime &l = cfg_.lifetime;
    bool crossed_soft = false;
    if (!soft_expired_ && (life_packets_ >= l.soft_packets || life_bytes_ >= l.soft_bytes)) {
        crossed_soft = true;
        expire(false);
    }
    if (!hard_expired_ && (life_packets_ >= l.hard_packets || life_bytes_ >= l.hard_bytes))
        expire(true);
    set_next_limits();
    return crossed_soft;
}

uint32_t Sa::inner_mtu(uint32_t link_mtu) const
{
    uint32_t front = (tunnel() ? outer_len_ : (natt() ? kUdpLen : 0)) + kEspHdrLen + iv_len_;
    uint32_t back = kEspTrailerLen + icv_len_;
    if (link_mtu <= front + back + block_)
        return 0;
    // The payload is rounded up to the block size: round the room down to it.
    uint32_t room = link_mtu - front - icv_len_;
    room -= room % block_;
    return room - kEspTrailerLen;
}

void Sa::take_over()
{
    if (!pred_)
        return;
    if (pred_->following())  // updated again before a packet came: its own first
        pred_->take_over();
    replay_.catch_up(pred_->replay_);
    // Same keys: a number pred sent must never be sent again under them.
    if (pred_->oseq_ > oseq_)
        oseq_ = pred_->oseq_;
    pred_.reset();
    following_ = false;
}

}  // namespace xesp
