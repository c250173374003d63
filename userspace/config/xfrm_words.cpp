// Words: shell-style splitting and quoting of a line, the values inside words (numbers, keys),
// the cursor that walks a command, and what to say about a word that is wrong.
#include "userspace/config/xfrm_words.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>

#include "userspace/base/wiped.h"
#include "userspace/config/xfrm_grammar.h"

namespace xesp {

// ---- splitting and quoting -----------------------------------------------------------------

namespace {

bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

// Reads one double-quoted string starting after the opening quote; returns the index after
// the closing quote, or npos.
size_t read_double_quoted(std::string_view line, size_t i, std::string &out)
{
    while (i < line.size()) {
        char c = line[i];
        if (c == '"')
            return i + 1;
        if (c == '\\' && i + 1 < line.size() &&
            std::string_view("\\\"$`").find(line[i + 1]) != std::string_view::npos) {
            out += line[i + 1];
            i += 2;
            continue;
        }
        out += c;
        i++;
    }
    return std::string_view::npos;
}

Result<std::vector<std::string>> split(std::string_view line, bool *continues)
{
    std::vector<std::string> words;
    std::string cur;
    bool in_word = false;
    if (continues)
        *continues = false;
    size_t i = 0;
    while (i < line.size()) {
        char c = line[i];
        if (is_blank(c)) {
            if (in_word)
                words.push_back(std::move(cur));
            cur.clear();
            in_word = false;
            i++;
            continue;
        }
        if (!in_word && c == '#')
            break;
        in_word = true;
        if (c == '\'') {
            size_t end = line.find('\'', i + 1);
            if (end == std::string_view::npos)
                return make_error("unterminated single quote at column " + std::to_string(i + 1));
            cur.append(line.substr(i + 1, end - i - 1));
            i = end + 1;
        } else if (c == '"') {
            size_t end = read_double_quoted(line, i + 1, cur);
            if (end == std::string_view::npos)
                return make_error("unterminated double quote at column " + std::to_string(i + 1));
            i = end;
        } else if (c == '\\') {
            if (i + 1 == line.size()) {
                if (!continues)
                    return make_error("the line ends with a backslash");
                *continues = true;
                break;
            }
            cur += line[i + 1];
            i += 2;
        } else {
            cur += c;
            i++;
        }
    }
    if (in_word)
        words.push_back(std::move(cur));
    return words;
}

}  // namespace

Result<std::vector<std::string>> split_words(std::string_view line)
{
    return split(line, nullptr);
}

Result<std::vector<std::string>> split_words(std::string_view line, bool *continues)
{
    return split(line, continues);
}

std::string quote_word(std::string_view word)
{
    auto safe = [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               std::string_view("_-.,:/+=@%").find(c) != std::string_view::npos;
    };
    bool plain = !word.empty();
    for (char c : word)
        plain = plain && safe(c);
    if (plain)
        return std::string(word);
    std::string out = "'";
    for (char c : word) {
        if (c == '\'')
            out += "'\\''";
        else
            out += c;
    }
    return out + "'";
}

namespace xfrm {

// ---- values --------------------------------------------------------------------------------

namespace {

int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

}  // namespace

bool has_hex_prefix(std::string_view w)
{
    return w.size() > 2 && w[0] == '0' && (w[1] == 'x' || w[1] == 'X');
}

std::string shown(std::string_view w)
{
    if ((has_hex_prefix(w) && w.size() > 18) || w.size() > 40)
        return "a " + std::to_string(w.size()) + "-character word (not shown: it may be a key)";
    std::string out = "'";
    for (unsigned char c : w) {
        if (c < 0x20 || c >= 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    return out + "'";
}

Result<uint64_t> to_number(std::string_view w, std::string_view what, uint64_t max)
{
    bool hex = has_hex_prefix(w);
    std::string_view digits = hex ? w.substr(2) : w;
    uint64_t v = 0;
    auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), v, hex ? 16 : 10);
    bool range = ec == std::errc::result_out_of_range;
    if (digits.empty() || end != digits.data() + digits.size() || (ec != std::errc() && !range))
        return make_error(std::string(what) + " " + shown(w) +
                          " is not a number (decimal or 0x hex)");
    if (!hex && w.size() > 1 && w[0] == '0')
        return make_error(std::string(what) + " " + shown(w) +
                          " has a leading zero, which ip xfrm reads as octal; write it in decimal "
                          "without the zero or in 0x hex");
    if (range || v > max)
        return make_error(std::string(what) + " " + shown(w) + " is out of range (0.." +
                          std::to_string(max) + ")");
    return v;
}

Result<KeyBytes> to_key(std::string_view w, std::string_view what)
{
    std::string pre = std::string(what) + " key";
    if (w == kHiddenKey)
        return make_error(pre + " is " + std::string(kHiddenKey) +
                          ": keys are hidden in listings; list with --show-keys to get lines that "
                          "load");
    KeyBytes key;
    if (!has_hex_prefix(w)) {
        if (w.size() > KeyBytes::kMax)
            return make_error(pre + " is longer than " + std::to_string(KeyBytes::kMax) + " bytes");
        key.assign(reinterpret_cast<const uint8_t *>(w.data()), w.size());
        return key;
    }
    std::string_view digits = w.substr(2);
    if (digits.size() % 2)
        return make_error(pre + " has an odd number of hex digits; write every digit of the key");
    if (digits.size() / 2 > KeyBytes::kMax)
        return make_error(pre + " is longer than " + std::to_string(KeyBytes::kMax) + " bytes");
    std::array<uint8_t, KeyBytes::kMax> buf{};
    for (size_t i = 0; i < digits.size() / 2; i++) {
        int hi = hex_digit(digits[2 * i]), lo = hex_digit(digits[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            OPENSSL_cleanse(buf.data(), buf.size());
            return make_error(pre + " is not valid hex after 0x");
        }
        buf[i] = uint8_t(hi << 4 | lo);
    }
    key.assign(buf.data(), digits.size() / 2);
    OPENSSL_cleanse(buf.data(), buf.size());
    return key;
}

void append_key_text(std::string &out, const uint8_t *p, size_t n, const uint8_t *p2, size_t n2,
                     bool show)
{
    if (n + n2 == 0)
        return append_wiped(out, "\"\"");
    if (!show)
        return append_wiped(out, kHiddenKey);
    static const char digits[] = "0123456789abcdef";
    reserve_wiped(out, 2 + 2 * (n + n2));  // the digits go where they stay
    out += "0x";
    for (size_t i = 0; i < n + n2; i++) {
        uint8_t b = i < n ? p[i] : p2[i - n];
        out += digits[b >> 4];
        out += digits[b & 15];
    }
}

// ---- the cursor ----------------------------------------------------------------------------

Result<std::string_view> Cursor::value(std::string_view key, std::string_view meta)
{
    if (!more()) {
        std::string word(key);
        return fail("'" + word + "' needs " + std::string(meta));
    }
    return take();
}

Result<uint64_t> Cursor::number(std::string_view key, uint64_t max)
{
    auto v = value(key, "a number");
    if (!v)
        return v.error();
    auto n = to_number(*v, key, max);
    if (!n)
        return fail(n.error().message);
    return n;
}

Result<IpAddr> Cursor::address(std::string_view key)
{
    auto v = value(key, "an address");
    if (!v)
        return v.error();
    if (auto a = IpAddr::parse(*v))
        return *a;
    if (v->find('/') != std::string_view::npos && Prefix::parse(*v))
        return fail(std::string(key) + " takes an address, not a prefix: " + shown(*v));
    return fail(std::string(key) + " " + shown(*v) + " is not an IPv4 or IPv6 address");
}

Result<Prefix> Cursor::prefix(std::string_view key)
{
    auto v = value(key, "a prefix");
    if (!v)
        return v.error();
    if (auto p = Prefix::parse(*v))
        return *p;
    return fail(std::string(key) + " " + shown(*v) +
                " is not a prefix (ADDR or ADDR/LEN, IPv4 or IPv6)");
}

Result<KeyBytes> Cursor::key(std::string_view alg_word)
{
    auto v = value(alg_word, "a key");
    if (!v)
        return v.error();
    auto k = to_key(*v, alg_word);
    if (!k)
        return fail(k.error().message);
    return k;
}

Result<size_t> Cursor::choice(std::string_view key, std::initializer_list<std::string_view> choices)
{
    std::string list;
    for (auto c : choices) {
        if (!list.empty())
            list += '|';
        list += c;
    }
    auto v = value(key, list);
    if (!v)
        return v.error();
    size_t i = 0;
    for (auto c : choices) {
        if (*v == c)
            return i;
        i++;
    }
    return fail(std::string(key) + " " + shown(*v) + " is not one of " + list);
}

Result<void> Cursor::once(std::string_view word)
{
    std::string w(word);
    if (!seen_.insert(w).second)
        return fail("'" + w + "' is given twice");
    return {};
}

// ---- wrong words ---------------------------------------------------------------------------

namespace {

// ip xfrm words that xesp knows but does not implement, with what to say about them.
std::string unsupported(std::string_view w)
{
    static const std::array<std::string_view, 14> kIpWords{"mark",
                                                           "if_id",
                                                           "ctx",
                                                           "coa",
                                                           "output-mark",
                                                           "offload",
                                                           "tfcpad",
                                                           "extra-flag",
                                                           "seq",
                                                           "comp",
                                                           "index",
                                                           "dev",
                                                           "nat-keepalive-interval",
                                                           "pcpu-num"};
    for (auto k : kIpWords) {
        if (w == k) {
            std::string word(w);
            return "'" + word + "' (an ip xfrm option) is not supported by xesp";
        }
    }
    return {};
}

size_t edit_distance(std::string_view a, std::string_view b)
{
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); j++)
        row[j] = j;
    for (size_t i = 1; i <= a.size(); i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); j++) {
            size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
            diag = up;
        }
    }
    return row[b.size()];
}

}  // namespace

Error unknown_word(const Cursor &c, std::string_view w,
                   std::initializer_list<std::string_view> known)
{
    std::string u = unsupported(w);
    if (!u.empty())
        return c.fail(u);
    std::string list;
    std::string_view best;
    size_t best_d = 3;
    for (auto k : known) {
        if (!list.empty())
            list += ' ';
        list += k;
        size_t d = w.size() < 64 ? edit_distance(w, k) : best_d;
        if (d < best_d) {
            best_d = d;
            best = k;
        }
    }
    if (!best.empty())
        return c.fail("unknown word " + shown(w) + "; did you mean '" + std::string(best) + "'?");
    return c.fail("unknown word " + shown(w) + "; expected one of: " + list);
}

}  // namespace xfrm

}  // namespace xesp
