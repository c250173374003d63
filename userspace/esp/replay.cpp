#include "userspace/esp/replay.h"

#include <algorithm>

namespace xesp {

void ReplayWindow::init(uint32_t window, bool esn, uint64_t highest)
{
    window_ = std::min(window, kMaxWindow);
    esn_ = esn;
    top_ = esn ? highest : uint32_t(highest);
    // RFC 6479: one block more than the window needs, so the block being filled never
    // overlaps the oldest one still inside the window.
    uint32_t blocks = 1;
    while (blocks * 64 < window_ + 64)
        blocks <<= 1;
    block_mask_ = blocks - 1;
    bitmap_ = std::make_unique<uint64_t[]>(blocks);
    if (top_)
        bitmap_[(top_ >> 6) & block_mask_] |= uint64_t(1) << (top_ & 63);
}

// RFC 4303 Appendix A2.2. W is the window, T the highest number seen (Th, Tl its halves).
uint64_t ReplayWindow::infer(uint32_t seq_lo) const
{
    if (!esn_)
        return seq_lo;
    uint32_t th = uint32_t(top_ >> 32), tl = uint32_t(top_);
    // Without a window the sender is still assumed to be within 2^31 of T.
    uint32_t w = window_ ? window_ : 0x80000000u;
    uint32_t bottom = tl - w + 1;  // modulo 2^32
    uint32_t sh;
    if (tl >= w - 1)  // Case A: window inside one subspace
        sh = seq_lo >= bottom ? th : th + 1;
    else  // Case B: window spans two subspaces
        sh = seq_lo >= bottom ? th - 1 : th;
    if (sh == 0xffffffffu && th == 0)  // would be before the start of the SA
        return 0;
    return uint64_t(sh) << 32 | seq_lo;
}

bool ReplayWindow::seen(uint64_t seq) const
{
    return bitmap_[(seq >> 6) & block_mask_] & (uint64_t(1) << (seq & 63));
}

ReplayWindow::Verdict ReplayWindow::check(uint32_t seq_lo, uint64_t *seq) const
{
    uint64_t s = infer(seq_lo);
    *seq = s;
    if (s == 0)  // sequence 0 is never sent (RFC 4303 3.3.3)
        return Verdict::TooOld;
    if (window_ == 0 || s > top_)
        return Verdict::Ok;
    if (top_ - s >= window_)
        return Verdict::TooOld;
    return seen(s) ? Verdict::Replay : Verdict::Ok;
}

ReplayWindow::Verdict ReplayWindow::update(uint64_t seq)
{
    if (seq == 0)
        return Verdict::TooOld;
    if (window_ == 0) {
        top_ = std::max(top_, seq);
        return Verdict::Ok;
    }
    if (seq > top_) {
        // Clear the blocks the window slides over; at most the whole ring.
        uint64_t from = (top_ >> 6) + 1, to = seq >> 6;
        if (to >= from) {
            uint64_t n = std::min<uint64_t>(to - from + 1, uint64_t(block_mask_) + 1);
            for (uint64_t i = 0; i < n; i++)
                bitmap_[(to - i) & block_mask_] = 0;
        }
        top_ = seq;
    } else {
        if (top_ - seq >= window_)
            return Verdict::TooOld;
        if (seen(seq))
            return Verdict::Replay;
    }
    bitmap_[(seq >> 6) & block_mask_] |= uint64_t(1) << (seq & 63);
    return Verdict::Ok;
}

ReplayWindow::Snapshot ReplayWindow::snapshot() const
{
    Snapshot s;
    s.top = top_;
    s.seen.assign((window_ + 7) / 8, 0);
    for (uint32_t i = 0; i < window_ && i < top_; i++)
        if (seen(top_ - i))
            s.seen[i / 8] |= uint8_t(1u << (i % 8));
    return s;
}

bool ReplayWindow::restore(const Snapshot &s)
{
    if (s.seen.size() != (window_ + 7) / 8 || (!esn_ && s.top > UINT32_MAX))
        return false;
    init(window_, esn_, s.top);
    for (uint32_t i = 0; i < window_ && i < s.top; i++)
        if (s.seen[i / 8] & (1u << (i % 8)))
            bitmap_[((s.top - i) >> 6) & block_mask_] |= uint64_t(1) << ((s.top - i) & 63);
    return true;
}

void ReplayWindow::catch_up(const ReplayWindow &old)
{
    if (old.top_ < top_ || (!esn_ && old.top_ > UINT32_MAX))
        return;
    Snapshot was = old.snapshot();
    Snapshot now{was.top, std::vector<uint8_t>((window_ + 7) / 8)};
    for (uint32_t i = 0; i < window_; i++)
        if (i >= old.window_ || (was.seen[i / 8] >> (i % 8)) & 1)
            now.seen[i / 8] |= uint8_t(1u << (i % 8));
    restore(now);
}

}  // namespace xesp
