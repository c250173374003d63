// Internals shared by the xfrm_*.cpp files that read and write `ip xfrm` words: values
// (numbers, keys), the cursor over one command's words, and the messages for a word that is
// wrong. Everything here is private to the grammar; other code includes xfrm_grammar.h.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"

namespace xesp::xfrm {

// ---- values --------------------------------------------------------------------------------

bool has_hex_prefix(std::string_view w);

// A word as quoted in an error message. A key typed in the wrong place ends up here as an
// "unknown word" or "not a number", and messages go to terminals and logs: words that look
// like key material (long hex, long strings) are described instead of shown.
std::string shown(std::string_view w);

// Numbers are decimal or 0x hex. ip xfrm reads them with strtoul(..., 0), where a leading 0
// means octal: such words are refused rather than read differently from ip xfrm.
Result<uint64_t> to_number(std::string_view w, std::string_view what, uint64_t max);

// ALGO-KEYMAT: 0x followed by hex digits (any case), else the bytes of the word (ip xfrm's
// xfrm_algo_parse). ip xfrm pads an odd number of digits with a leading 0; a digit missing
// from a key is a typo, so that is refused.
Result<KeyBytes> to_key(std::string_view w, std::string_view what);

// Appends the key p[0..n) followed by p2[0..n2) as a word: 0x... when show, else kHiddenKey;
// "" when there are no bytes at all. Storage that out leaves behind as it grows is wiped.
void append_key_text(std::string &out, const uint8_t *p, size_t n, const uint8_t *p2, size_t n2,
                     bool show);

// ---- the cursor over one command's words ---------------------------------------------------

// Walks words[2..] of a command (words[0..1] are the object and the verb). Every message it
// makes starts with the context, e.g. "sa add: ".
class Cursor {
public:
    Cursor(const std::vector<std::string> &words, std::string context)
            : w_(words), i_(2), ctx_(std::move(context))
    {}

    bool more() const { return i_ < w_.size(); }
    std::string_view peek() const { return w_[i_]; }
    std::string_view take() { return w_[i_++]; }
    void back() { i_--; }
    Error fail(const std::string &msg) const { return make_error(ctx_ + ": " + msg); }
    const std::string &context() const { return ctx_; }

    // The value after `key`; `meta` says what was expected ("an address", "SPI", ...).
    Result<std::string_view> value(std::string_view key, std::string_view meta);
    Result<uint64_t> number(std::string_view key, uint64_t max);
    Result<IpAddr> address(std::string_view key);
    Result<Prefix> prefix(std::string_view key);
    Result<KeyBytes> key(std::string_view alg_word);
    // The value after `key`, one of `choices` (index returned).
    Result<size_t> choice(std::string_view key, std::initializer_list<std::string_view> choices);
    // Refuses a word given twice.
    Result<void> once(std::string_view word);

private:
    const std::vector<std::string> &w_;
    size_t i_;
    std::string ctx_;
    std::set<std::string, std::less<>> seen_;
};

// Returns the error of a Result, if it has one.
#define XESP_TRY(expr)                                                                             \
    do {                                                                                           \
        auto xesp_try_r_ = (expr);                                                                 \
        if (!xesp_try_r_)                                                                          \
            return xesp_try_r_.error();                                                            \
    } while (0)

// Sets `out` from a Result, or returns its error.
#define XESP_SET(out, expr)                                                                        \
    do {                                                                                           \
        auto xesp_set_r_ = (expr);                                                                 \
        if (!xesp_set_r_)                                                                          \
            return xesp_set_r_.error();                                                            \
        out = std::move(*xesp_set_r_);                                                             \
    } while (0)

// ---- wrong words ---------------------------------------------------------------------------

// The error for a word that is none of `known`: an ip xfrm option xesp does not implement,
// a near miss of one of `known` ("did you mean"), or else the list of `known`.
Error unknown_word(const Cursor &c, std::string_view w,
                   std::initializer_list<std::string_view> known);

}  // namespace xesp::xfrm
