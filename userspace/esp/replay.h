// Anti-replay for one inbound SA: the sliding window of RFC 4303 3.4.3 kept as the bitmap ring
// of RFC 6479 (O(1) per packet whatever the window size), and the ESN high-half inference of
// RFC 4303 Appendix A2.2. check() runs before the ICV is verified, update() after it: a forged
// packet can never move the window.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace xesp {

class ReplayWindow {
public:
    enum class Verdict : uint8_t { Ok, Replay, TooOld };

    static constexpr uint32_t kMaxWindow = 65536;

    // window: packets tracked (0 = anti-replay off, as `replay-window 0`); highest: the highest
    // sequence number received so far (64-bit when esn).
    void init(uint32_t window, bool esn, uint64_t highest);

    // Infers the full sequence number of a received low half and checks it against the window.
    Verdict check(uint32_t seq_lo, uint64_t *seq) const;
    // Records an authenticated packet. Checks again: with parallel crypto another packet with
    // the same number may have been accepted since check().
    Verdict update(uint64_t seq);

    // The whole state, for the daemon's state file: the highest number and, for the window
    // below it, which numbers were accepted (bit i of `seen`: top - i; bytes little-endian).
    // restore() takes back what snapshot() gave, for the same window size and ESN setting;
    // false (and the window left as init() made it) for anything else.
    struct Snapshot {
        uint64_t top = 0;
        std::vector<uint8_t> seen;
    };
    Snapshot snapshot() const;
    bool restore(const Snapshot &s);
    // For a fresh SA that replaces another under the same keys: takes over `old`'s state when
    // old got as far or further, its top and below it whatever old saw (numbers old's window
    // did not cover count as seen), so that nothing the peer sent is accepted twice.
    void catch_up(const ReplayWindow &old);

    uint64_t highest() const { return top_; }
    uint32_t window() const { return window_; }
    bool esn() const { return esn_; }

private:
    uint64_t infer(uint32_t seq_lo) const;
    bool seen(uint64_t seq) const;

    uint64_t top_ = 0;
    uint32_t window_ = 0;
    bool esn_ = false;
    uint32_t block_mask_ = 0;  // number of 64-bit blocks - 1 (power of two)
    std::unique_ptr<uint64_t[]> bitmap_;
};

}  // namespace xesp
