// An SA as the data path sees it: its configuration (control part) next to the runtime part
// the per-packet code touches (VPP's ipsec_sa_t split): prepared cipher, sequence numbers,
// replay window, lifetimes, counters and a prebuilt outer header.
//
// The runtime part comes first and starts on a cache line: the four lines from there hold
// every field a packet reads or writes, copies of the configured ones included, so that a
// packet of an SA that is not in cache costs those lines and the cipher's keys, which the
// engine asks for ahead of time (prefetch_state(), prefetch_crypto()).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "userspace/base/counters.h"
#include "userspace/crypto/crypto.h"
#include "userspace/esp/replay.h"
#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"

namespace xesp {

// The smaller of two MTUs where 0 means "not known".
inline uint32_t smaller_mtu(uint32_t a, uint32_t b)
{
    return a && (!b || a < b) ? a : b;
}

// What SAs tell the owner of their sequence reservations (the daemon's state keeper), on the
// thread that runs them: which reached their low-water mark or bound, and whose replay window
// moved since the owner last looked. Each SA is listed once until the owner takes note
// (Sa::reserve_to, Sa::window_saved), so the owner's work follows the SAs that move, not
// the number of SAs.
struct SaNotify {
    struct Entry {
        SaKey key;
        uint64_t serial;
    };
    std::atomic<bool> wake{false};  // asking has grown
    std::vector<Entry> asking;
    std::vector<Entry> moved;
};

class Sa {
public:
    // Prepares the runtime part: the cipher (backend resolved here), the replay window from
    // replay-seq[-hi], the output counter from replay-oseq[-hi], the outer header.
    static Result<std::unique_ptr<Sa>> create(const SaConfig &cfg, Backend backend);
    // What create() would refuse before it makes anything: a backend without the algorithms.
    static Result<void> check(const SaConfig &cfg, Backend backend);

    const SaConfig &config() const { return cfg_; }
    // Unique for the process's life: tells this SA from one created later at the same address.
    uint64_t serial() const { return serial_; }
    Backend backend() const { return cipher_->backend(); }

    // Hot fields, read by encap.cpp and decap.cpp.
    SaCipher &cipher() { return *cipher_; }
    // cipher().thread_safe(), kept here: read with the SA's first line, not the cipher's.
    bool crypt_anywhere() const { return crypt_anywhere_; }
    uint32_t spi_be() const { return spi_be_; }
    uint8_t iv_len() const { return iv_len_; }
    uint8_t icv_len() const { return icv_len_; }
    uint8_t block() const { return block_; }
    bool esn() const { return esn_; }
    bool tunnel() const { return tunnel_; }
    bool natt() const { return natt_; }
    bool aead() const { return aead_; }
    bool has_selector() const { return selector_; }                   // config().sel is set
    uint8_t outer_family() const { return uint8_t(outer_[0] >> 4); }  // the template's version

    // Ask for the runtime part (prefetch_state()), then for what the cipher reads
    // (prefetch_crypto(), which reads the runtime part to find it), to be brought into cache
    // without waiting for them: for a packet of this SA a little later. With thousands of SAs
    // and traffic spread over them, each SA is cold when its packet comes.
    static constexpr size_t kHotBytes = 4 * 64;
    static constexpr size_t kMaxCryptHot = 2048;
    void prefetch_state() const
    {
        const char *hot = reinterpret_cast<const char *>(this);
        for (size_t off = 0; off < kHotBytes; off += 64)
            __builtin_prefetch(hot + off, 1);
    }
    void prefetch_crypto() const
    {
        for (size_t off = 0; off < crypt_hot_len_; off += 64)
            __builtin_prefetch(crypt_hot_ + off);
    }

    // Outer IP (+ UDP for NAT-T) header template for tunnel mode; length fields left 0.
    const uint8_t *outer_template() const { return outer_.data(); }
    uint8_t outer_len() const { return outer_len_; }
    // IPv4 outer header: one's complement sum of the template's words that never change.
    uint32_t outer_csum_base() const { return outer_csum_base_; }

    // Output sequence numbers. Never wraps (RFC 4303 3.3.3): 2^32-1 is the last number
    // without ESN, 2^64-1 with it; then next_seq() fails, seq_exhausted() says so, and the SA
    // must be rekeyed. Nor does it go beyond the reservation (reserve_to()): then next_seq()
    // fails too, and the SA sends again once the owner reserves more.
    bool next_seq(uint64_t *seq)
    {
        uint64_t limit = esn_ ? UINT64_MAX : UINT32_MAX;
        if (oseq_ >= limit) [[unlikely]] {
            expire(true);  // the SA is spent: hard-expire it, as the kernel does
            return false;
        }
        if (oseq_ >= reserved_.load(std::memory_order_acquire)) [[unlikely]] {
            ask_for_more();
            return false;
        }
        *seq = ++oseq_;
        if (oseq_ >= low_water_) [[unlikely]]
            ask_for_more();
        return true;
    }
    uint64_t oseq() const { return oseq_; }
    bool seq_exhausted() const { return oseq_ >= (esn_ ? UINT64_MAX : UINT32_MAX); }

    // The sequence reservation. An owner that keeps sequence numbers across restarts (the
    // daemon's state file) makes each SA send only numbers it has durably recorded: it binds
    // the SA once, before the SA sends anything (bind_reservation(), which may move the
    // counter up to where an earlier SA with the same key stopped), and raises the bound each
    // time the record is on disk (reserve_to()). When the counter reaches `low_water`, or the
    // bound, the SA lists itself for the owner (SaNotify::asking, once per reserve_to()).
    // Unbound, as `xesp pcap` uses it, an SA is limited only by the sequence space.
    bool reservation_bound() const { return bound_; }
    // Held since it was made: not bound yet, nothing reserved (hold()).
    bool held() const { return reserved_.load(std::memory_order_relaxed) <= oseq_ && !bound_; }
    // Before binding: the SA sends nothing (out-seq-unreserved) until bind_reservation().
    void hold()
    {
        if (!bound_)
            reserved_.store(oseq_, std::memory_order_release);
    }
    void bind_reservation(uint64_t start, SaNotify *notify = nullptr)
    {
        if (start > oseq_)
            oseq_ = start;
        notify_ = notify;
        window_listed_ = notify == nullptr;
        low_water_ = UINT64_MAX;
        reserved_.store(oseq_, std::memory_order_release);
        bound_ = true;
    }
    void reserve_to(uint64_t last, uint64_t low_water = UINT64_MAX)
    {
        if (last > reserved_.load(std::memory_order_relaxed))
            reserved_.store(last, std::memory_order_release);
        low_water_ = low_water;
        asked_ = false;
    }
    uint64_t reserved() const { return reserved_.load(std::memory_order_acquire); }
    ReplayWindow &replay() { return replay_; }
    // The window moved (a packet accepted): listed once for the owner, until window_saved().
    void window_moved()
    {
        if (!window_listed_ && notify_) [[unlikely]] {
            window_listed_ = true;
            notify_->moved.push_back({SaKey{cfg_.dst, cfg_.spi}, serial_});
        }
    }
    void window_saved() { window_listed_ = false; }
    const ReplayWindow &replay() const { return replay_; }

    Counters &counters() { return counters_; }
    const Counters &counters() const { return counters_; }

    // Lifetimes (`limit ...`). Counted after a packet is accepted; a replayed or forged packet
    // never counts. charge() returns true when this packet crossed the soft limit.
    bool hard_expired() const { return hard_expired_; }
    bool soft_expired() const { return soft_expired_; }
    bool charge(uint64_t bytes)
    {
        life_packets_++;
        life_bytes_ += bytes;
        counters_.packets++;
        counters_.bytes += bytes;
        if (life_packets_ >= next_packets_ || life_bytes_ >= next_bytes_) [[unlikely]]
            return crossed_limit();
        return false;
    }
    // A packet over the hard limit is refused before any work is done on it.
    bool over_hard(uint64_t bytes) const
    {
        return hard_expired_ || life_packets_ + 1 > hard_packets_ ||
               life_bytes_ + bytes > hard_bytes_;
    }

    // Called once when a lifetime limit is crossed (soft or hard), as the kernel's expire message.
    using ExpireFn = std::function<void(const Sa &sa, bool hard)>;
    void on_expire(ExpireFn fn) { on_expire_ = std::move(fn); }

    // Time limits are checked apart from the packets: the owner calls check_time() about once
    // a second with CLOCK_MONOTONIC in ns (the gateway's data thread, a share of its SAs each
    // round: Engine::check_time_some()). The first call that sees the SA used since the one
    // before starts its use time, so that is a second's resolution (as the kernel's). Added:
    // when create() made it.
    uint64_t added_ns() const { return added_ns_; }
    uint64_t first_use_ns() const { return first_use_ns_; }
    void check_time(uint64_t now);
    // Whole seconds until the soft or hard time limit at now_ns (0: reached); UINT64_MAX when
    // there is none, or only a use limit and no use seen yet.
    uint64_t seconds_left(uint64_t now, bool hard) const;

    // An SA put in place of `pred`, under the same keys (`sa update`): it continues pred's
    // sequence numbers and replay window, as the kernel's xfrm_state_update keeps them. The
    // engine calls take_over() before this SA's first packet, on the thread that ran pred's.
    void follow(std::shared_ptr<Sa> pred)
    {
        following_ = pred != nullptr;
        pred_ = std::move(pred);
    }
    bool following() const { return following_; }  // on line 0: asked for every burst
    void take_over();

    // Effective MTU inside the tunnel for a given egress MTU, worst-case padding included.
    uint32_t inner_mtu(uint32_t link_mtu) const;

    // The path MTU to the peer learnt from ICMP (pmtu.h); 0: none, the link's applies. Set and
    // aged by the gateway; kept when a reconfiguration keeps the SA.
    uint32_t path_mtu() const { return path_mtu_; }
    void set_path_mtu(uint32_t mtu) { path_mtu_ = mtu; }
    // What this SA's encrypted packets must fit: the egress link's MTU (0: unknown), or the
    // learnt path MTU if that is smaller.
    uint32_t outer_mtu(uint32_t link_mtu) const { return smaller_mtu(path_mtu_, link_mtu); }

private:
    Sa() = default;
    void build_outer();
    void expire(bool hard);  // sets the flag and tells on_expire_, once each
    bool crossed_limit();    // charge() past next_packets_ or next_bytes_
    void set_next_limits();
    static void check_layout();  // static_asserts on the offsets below
    void ask_for_more()
    {
        low_water_ = UINT64_MAX;
        if (notify_ && !asked_) {
            asked_ = true;
            notify_->asking.push_back({SaKey{cfg_.dst, cfg_.spi}, serial_});
            notify_->wake.store(true, std::memory_order_relaxed);
        }
    }

    // The runtime part, in the order of the lines it takes (kHotBytes; the offsets are
    // checked in sa.cpp). Line 0, read by every packet: the outer header template and what
    // the headers need.
    alignas(64) std::array<uint8_t, 48> outer_{};
    uint32_t spi_be_ = 0;
    uint32_t outer_csum_base_ = 0;
    uint8_t iv_len_ = 0, icv_len_ = 0, block_ = 4, outer_len_ = 0;
    bool tunnel_ : 1 = false, natt_ : 1 = false, esn_ : 1 = false, aead_ : 1 = false,
                   selector_ : 1 = false, crypt_anywhere_ : 1 = false;
    bool following_ = false;     // follow(), until take_over()
    bool window_listed_ = true;  // window_moved(), until window_saved(); none bound: true
    // Line 1: the cipher and the output sequence and lifetime counts.
    SaCipher *cipher_ = nullptr;       // owned by cipher_owner_
    const char *crypt_hot_ = nullptr;  // what the cipher reads per packet (prefetch_crypto())
    uint16_t crypt_hot_len_ = 0;
    bool soft_expired_ = false, hard_expired_ = false;
    uint32_t path_mtu_ = 0;
    uint64_t oseq_ = 0;
    std::atomic<uint64_t> reserved_{UINT64_MAX};  // the last number the SA may send
    uint64_t low_water_ = UINT64_MAX;             // ask for more from here
    uint64_t life_packets_ = 0, life_bytes_ = 0;
    // Line 2: the byte and packet limits (the configured ones, copied here), the replay
    // window's state (its bitmap is elsewhere).
    uint64_t hard_packets_ = UINT64_MAX, hard_bytes_ = UINT64_MAX;
    // The next limit charge() has to act on: the soft one, then the hard one.
    uint64_t next_packets_ = UINT64_MAX, next_bytes_ = UINT64_MAX;
    ReplayWindow replay_;
    // Line 3: the counters' packets and bytes (their drops follow, touched only by drops).
    Counters counters_;

    // The control part: read when an SA is made, changed or shown.
    std::unique_ptr<SaCipher> cipher_owner_;
    SaConfig cfg_;
    uint64_t serial_ = 0;
    SaNotify *notify_ = nullptr;
    bool bound_ = false;
    bool asked_ = false;
    uint64_t added_ns_ = 0, first_use_ns_ = 0;
    ExpireFn on_expire_;
    std::shared_ptr<Sa> pred_;  // follow()
};

}  // namespace xesp
