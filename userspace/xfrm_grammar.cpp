// Reading and writing `ip xfrm state` / `ip xfrm policy` words (ip-xfrm(8)).
//
// A line that parses is a complete and consistent SA or policy: what the kernel's xfrm_user
// would refuse (a wrong key length, ESN without a replay window, a change of family in
// transport mode...) is refused here, with a message that names the word and, where it can,
// the fix. Messages never contain key material: keys are never echoed, and a word echoed
// because it is misplaced is hidden when it looks like a key (see shown()).
#include "userspace/xfrm_grammar.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <initializer_list>
#include <set>

namespace xesp {

// ---- words ---------------------------------------------------------------------------------

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
        if (c == '\\' && i + 1 < line.size() && std::string_view("\\\"$`").find(line[i + 1]) !=
                                                       std::string_view::npos) {
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

} // namespace

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

// ---- values --------------------------------------------------------------------------------

namespace {

bool has_hex_prefix(std::string_view w)
{
    return w.size() > 2 && w[0] == '0' && (w[1] == 'x' || w[1] == 'X');
}

// A word as quoted in an error message. A key typed in the wrong place ends up here as an
// "unknown word" or "not a number", and messages go to terminals and logs: words that look
// like key material (long hex, long strings) are described instead of shown.
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

std::string hex32(uint32_t v)
{
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", v);
    return buf;
}

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

// Numbers are decimal or 0x hex. ip xfrm reads them with strtoul(..., 0), where a leading 0
// means octal: such words are refused rather than read differently from ip xfrm.
Result<uint64_t> to_number(std::string_view w, std::string_view what, uint64_t max)
{
    bool hex = has_hex_prefix(w);
    std::string_view digits = hex ? w.substr(2) : w;
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, hex ? 16 : 10);
    bool range = ec == std::errc::result_out_of_range;
    if (digits.empty() || end != digits.data() + digits.size() || (ec != std::errc() && !range))
        return make_error(std::string(what) + " " + shown(w) + " is not a number (decimal or 0x hex)");
    if (!hex && w.size() > 1 && w[0] == '0')
        return make_error(std::string(what) + " " + shown(w) +
                          " has a leading zero, which ip xfrm reads as octal; write it in decimal "
                          "without the zero or in 0x hex");
    if (range || v > max)
        return make_error(std::string(what) + " " + shown(w) + " is out of range (0.." +
                          std::to_string(max) + ")");
    return v;
}

// ALGO-KEYMAT: 0x followed by hex digits (any case), else the bytes of the word (ip xfrm's
// xfrm_algo_parse). ip xfrm pads an odd number of digits with a leading 0; a digit missing
// from a key is a typo, so that is refused.
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

std::string key_text(const uint8_t *p, size_t n, const uint8_t *p2, size_t n2, bool show)
{
    if (n + n2 == 0)
        return "\"\"";
    if (!show)
        return std::string(kHiddenKey);
    static const char digits[] = "0123456789abcdef";
    std::string out = "0x";
    for (size_t i = 0; i < n + n2; i++) {
        uint8_t b = i < n ? p[i] : p2[i - n];
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

// ---- algorithms ----------------------------------------------------------------------------

enum class Kind : uint8_t { Aead, Enc, Auth };

struct AlgInfo {
    Kind kind;
    uint8_t id;                          // AeadAlg / EncAlg / AuthAlg
    std::string_view name;               // as ip xfrm and the kernel spell it
    std::string_view alias;              // the short name ip xfrm also accepts, if any
    std::array<uint16_t, 3> key_bytes;   // valid key sizes (0 = end of list, except for NULL)
    std::array<uint16_t, 3> icv_bits;    // aead: allowed ICV bits; auth: {ICV bits of `auth`}
};

// `auth NAME KEY` gives the ICV length the kernel gives it, so that one line means the same SA
// to xesp and to `ip xfrm`: for hmac(sha256) that is 96 bits (a pre-RFC 4868 draft value the
// kernel keeps), not RFC 4868's 128. Peers other than Linux want `auth-trunc hmac(sha256) KEY
// 128`. format_sa always writes auth-trunc with explicit bits.
constexpr std::array<AlgInfo, 9> kAlgs{{
    {Kind::Aead, uint8_t(AeadAlg::AesGcm), "rfc4106(gcm(aes))", "", {16, 24, 32}, {64, 96, 128}},
    {Kind::Aead, uint8_t(AeadAlg::AesGmac), "rfc4543(gcm(aes))", "", {16, 24, 32}, {128, 0, 0}},
    {Kind::Aead, uint8_t(AeadAlg::ChaCha20Poly1305), "rfc7539esp(chacha20,poly1305)", "",
     {32, 0, 0}, {128, 0, 0}},
    {Kind::Enc, uint8_t(EncAlg::AesCbc), "cbc(aes)", "aes", {16, 24, 32}, {}},
    {Kind::Enc, uint8_t(EncAlg::Null), "ecb(cipher_null)", "cipher_null", {0, 0, 0}, {}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha1), "hmac(sha1)", "sha1", {}, {96, 0, 0}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha256), "hmac(sha256)", "sha256", {}, {96, 0, 0}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha384), "hmac(sha384)", "sha384", {}, {192, 0, 0}},
    {Kind::Auth, uint8_t(AuthAlg::HmacSha512), "hmac(sha512)", "sha512", {}, {256, 0, 0}},
}};

// Digest bits of an HMAC: the longest auth-trunc.
unsigned digest_bits(AuthAlg a)
{
    switch (a) {
    case AuthAlg::HmacSha1: return 160;
    case AuthAlg::HmacSha256: return 256;
    case AuthAlg::HmacSha384: return 384;
    case AuthAlg::HmacSha512: return 512;
    case AuthAlg::None: break;
    }
    return 0;
}

const AlgInfo *find_alg(std::string_view name)
{
    for (const auto &a : kAlgs)
        if (a.name == name || (!a.alias.empty() && a.alias == name))
            return &a;
    return nullptr;
}

const AlgInfo *alg_of(Kind k, uint8_t id)
{
    for (const auto &a : kAlgs)
        if (a.kind == k && a.id == id)
            return &a;
    return nullptr;
}

std::string_view kind_word(Kind k)
{
    return k == Kind::Aead ? "aead" : k == Kind::Enc ? "enc" : "auth";
}

std::string names_of(Kind k)
{
    std::string out;
    for (const auto &a : kAlgs)
        if (a.kind == k)
            out += (out.empty() ? "" : ", ") + std::string(a.name);
    return out;
}

// The algorithm a misspelt or foreign name (gcm(aes), aes-gcm, hmac-sha256, chacha20poly1305,
// aes256...) most likely means.
const AlgInfo *guess_alg(std::string_view name, Kind wanted)
{
    std::string n;
    for (char c : name)
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
            n += c;
        else if (c >= 'A' && c <= 'Z')
            n += char(c - 'A' + 'a');
    auto has = [&](std::string_view s) { return n.find(s) != std::string::npos; };
    auto aes_only = [&] {
        return n.rfind("aes", 0) == 0 && n.find_first_not_of("0123456789", 3) == std::string::npos;
    };
    if (has("gmac") || has("4543"))
        return find_alg("rfc4543(gcm(aes))");
    if (has("gcm") || has("4106"))
        return find_alg("rfc4106(gcm(aes))");
    if (has("chacha") || has("poly1305") || has("7539") || has("7634"))
        return find_alg("rfc7539esp(chacha20,poly1305)");
    if (has("cbc") && has("aes"))
        return find_alg("cbc(aes)");
    if (aes_only())
        return find_alg(wanted == Kind::Aead ? "rfc4106(gcm(aes))" : "cbc(aes)");
    if (has("null") && wanted != Kind::Auth)
        return find_alg("ecb(cipher_null)");
    if (has("sha1") || has("sha160"))
        return find_alg("hmac(sha1)");
    for (std::string_view bits : {"256", "384", "512"})
        if (has("sha" + std::string(bits)) || has("sha2" + std::string(bits)))
            return find_alg("hmac(sha" + std::string(bits) + ")");
    return nullptr;
}

// How the algorithm `a` is written in full, as advice.
std::string usage_of(const AlgInfo &a)
{
    std::string n(a.name);
    switch (a.kind) {
    case Kind::Aead: return "aead " + n + " KEY ICV-BITS";
    case Kind::Enc: return "enc " + n + " KEY auth ALGO KEY";
    case Kind::Auth: break;
    }
    return "enc ALGO KEY auth " + n + " KEY";
}

std::string unknown_alg(Kind wanted, std::string_view name)
{
    if (const AlgInfo *a = find_alg(name))     // a known name in the wrong place
        return shown(name) + " is not an " + std::string(kind_word(wanted)) +
               " algorithm; did you mean '" + usage_of(*a) + "'?";
    if (wanted == Kind::Auth && name.find("null") != std::string_view::npos)
        return "auth " + shown(name) + " gives no integrity, and ESP without integrity is not "
               "offered; use one of " + names_of(Kind::Auth);
    const AlgInfo *g = guess_alg(name, wanted);
    if (g && g->kind == wanted)
        return "unknown algorithm " + shown(name) + "; did you mean '" + std::string(g->name) + "'?";
    if (g)
        return "unknown " + std::string(kind_word(wanted)) + " algorithm " + shown(name) +
               "; did you mean '" + usage_of(*g) + "'?";
    return "unknown algorithm " + shown(name) + "; " + std::string(kind_word(wanted)) +
           " algorithms are " + names_of(wanted);
}

std::string list_sizes(const std::array<uint16_t, 3> &v, unsigned add, const char *unit)
{
    std::string out;
    size_t n = 0;
    for (uint16_t x : v)
        n += x != 0;
    for (size_t i = 0; i < n; i++) {
        if (i)
            out += i + 1 == n ? " or " : ", ";
        out += std::to_string(v[i] + add);
    }
    return out + unit;
}

bool in_list(const std::array<uint16_t, 3> &v, unsigned x)
{
    for (uint16_t y : v)
        if (y != 0 && y == x)
            return true;
    return false;
}

// ---- protocols -----------------------------------------------------------------------------

struct ProtoName {
    std::string_view name;
    uint8_t number;
};

constexpr std::array<ProtoName, 18> kProtos{{
    {"icmp", 1}, {"igmp", 2}, {"ipencap", 4}, {"tcp", 6}, {"udp", 17}, {"dccp", 33},
    {"ipv6", 41}, {"rsvp", 46}, {"gre", 47}, {"esp", 50}, {"ah", 51}, {"ipv6-icmp", 58},
    {"ospf", 89}, {"pim", 103}, {"l2tp", 115}, {"sctp", 132}, {"mobility-header", 135},
    {"udplite", 136},
}};

bool has_ports(uint8_t proto)
{
    return proto == 6 || proto == 17 || proto == 33 || proto == 132 || proto == 136;
}

std::string proto_text(uint8_t p)
{
    for (const auto &e : kProtos)
        if (e.number == p)
            return std::string(e.name);
    return std::to_string(p);
}

std::string_view dir_word(Dir d)
{
    switch (d) {
    case Dir::In: return "in";
    case Dir::Out: return "out";
    case Dir::Fwd: return "fwd";
    case Dir::Unspec: break;
    }
    return "unspec";
}

// ---- the cursor over one command's words ---------------------------------------------------

class Cursor {
public:
    Cursor(const std::vector<std::string> &words, std::string context)
        : w_(words), i_(2), ctx_(std::move(context))
    {
    }

    bool more() const { return i_ < w_.size(); }
    std::string_view peek() const { return w_[i_]; }
    std::string_view take() { return w_[i_++]; }
    void back() { i_--; }
    Error fail(const std::string &msg) const { return make_error(ctx_ + ": " + msg); }
    const std::string &context() const { return ctx_; }

    // The value after `key`; `meta` says what was expected ("an address", "SPI", ...).
    Result<std::string_view> value(std::string_view key, std::string_view meta)
    {
        if (!more())
            return fail("'" + std::string(key) + "' needs " + std::string(meta));
        return take();
    }
    Result<uint64_t> number(std::string_view key, uint64_t max)
    {
        auto v = value(key, "a number");
        if (!v)
            return v.error();
        auto n = to_number(*v, key, max);
        if (!n)
            return fail(n.error().message);
        return n;
    }
    Result<IpAddr> address(std::string_view key)
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
    Result<Prefix> prefix(std::string_view key)
    {
        auto v = value(key, "a prefix");
        if (!v)
            return v.error();
        if (auto p = Prefix::parse(*v))
            return *p;
        return fail(std::string(key) + " " + shown(*v) +
                    " is not a prefix (ADDR or ADDR/LEN, IPv4 or IPv6)");
    }
    Result<KeyBytes> key(std::string_view alg_word)
    {
        auto v = value(alg_word, "a key");
        if (!v)
            return v.error();
        auto k = to_key(*v, alg_word);
        if (!k)
            return fail(k.error().message);
        return k;
    }
    // The value after `key`, one of `choices` (index returned).
    Result<size_t> choice(std::string_view key, std::initializer_list<std::string_view> choices)
    {
        std::string list;
        for (auto c : choices)
            list += (list.empty() ? "" : "|") + std::string(c);
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
    // Refuses a word given twice.
    Result<void> once(std::string_view word)
    {
        if (!seen_.insert(std::string(word)).second)
            return fail("'" + std::string(word) + "' is given twice");
        return {};
    }

private:
    const std::vector<std::string> &w_;
    size_t i_;
    std::string ctx_;
    std::set<std::string, std::less<>> seen_;
};

#define XESP_TRY(expr)                                                                         \
    do {                                                                                       \
        auto xesp_try_r_ = (expr);                                                             \
        if (!xesp_try_r_)                                                                      \
            return xesp_try_r_.error();                                                        \
    } while (0)

// Sets `out` from a Result, or returns its error.
#define XESP_SET(out, expr)                                                                    \
    do {                                                                                       \
        auto xesp_set_r_ = (expr);                                                             \
        if (!xesp_set_r_)                                                                      \
            return xesp_set_r_.error();                                                        \
        out = std::move(*xesp_set_r_);                                                         \
    } while (0)

// ip xfrm words that xesp knows but does not implement, with what to say about them.
std::string unsupported(std::string_view w)
{
    static const std::array<std::string_view, 14> kIpWords{
        "mark", "if_id", "ctx", "coa", "output-mark", "offload", "tfcpad", "extra-flag",
        "seq", "comp", "index", "dev", "nat-keepalive-interval", "pcpu-num"};
    for (auto k : kIpWords)
        if (w == k)
            return "'" + std::string(w) + "' (an ip xfrm option) is not supported by xesp";
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

Error unknown_word(const Cursor &c, std::string_view w, std::initializer_list<std::string_view> known)
{
    std::string u = unsupported(w);
    if (!u.empty())
        return c.fail(u);
    std::string list;
    std::string_view best;
    size_t best_d = 3;
    for (auto k : known) {
        list += (list.empty() ? "" : " ") + std::string(k);
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

// ---- selectors -----------------------------------------------------------------------------

struct SelectorDraft {
    std::optional<Prefix> src, dst;
    uint8_t proto = 0;
    std::optional<uint16_t> sport, dport;
};

Result<uint8_t> parse_upper_proto(Cursor &c)
{
    auto v = c.value("proto", "a protocol name or number");
    if (!v)
        return v.error();
    for (const auto &e : kProtos)
        if (*v == e.name)
            return e.number;
    auto n = to_number(*v, "proto", 255);
    if (!n)
        return c.fail("proto " + shown(*v) + " is neither a number (0..255) nor a protocol name "
                      "(tcp, udp, icmp, ipv6-icmp, sctp, gre, esp...)");
    return uint8_t(*n);
}

// One selector word (src, dst, proto, sport, dport), if `w` is one that is not yet set.
// Returns false when `w` belongs to whatever follows the selector.
Result<bool> selector_word(Cursor &c, SelectorDraft &s, std::string_view w)
{
    if (w == "src" && !s.src) {
        XESP_SET(s.src, c.prefix("src"));
    } else if (w == "dst" && !s.dst) {
        XESP_SET(s.dst, c.prefix("dst"));
    } else if (w == "proto" && !s.proto) {
        XESP_SET(s.proto, parse_upper_proto(c));
        if (s.proto == 0)
            return c.fail("proto 0 means any protocol; leave proto out instead");
    } else if ((w == "sport" && !s.sport) || (w == "dport" && !s.dport)) {
        auto n = c.number(w, 65535);
        if (!n)
            return n.error();
        (w == "sport" ? s.sport : s.dport) = uint16_t(*n);
    } else if (w == "type" || w == "code" || w == "key") {
        return c.fail("selector '" + std::string(w) + "' (ICMP type/code, GRE key) is not supported");
    } else {
        return false;
    }
    return true;
}

Result<Selector> finish_selector(const Cursor &c, const SelectorDraft &d, std::string_view what)
{
    if (!d.src && !d.dst)
        return c.fail(std::string(what) + " needs src PREFIX and dst PREFIX");
    Selector s;
    uint8_t family = d.src ? d.src->addr.family : d.dst->addr.family;
    auto any = [&] {
        Prefix p;
        p.addr.family = family;
        return p;
    };
    s.src = d.src ? *d.src : any();
    s.dst = d.dst ? *d.dst : any();
    if (s.src.addr.family != s.dst.addr.family)
        return c.fail(std::string(what) + " src " + s.src.str() + " and dst " + s.dst.str() +
                      " are of different families");
    s.proto = d.proto;
    if ((d.sport || d.dport) && !has_ports(d.proto))
        return c.fail(std::string(what) + " sport/dport need proto tcp, udp, sctp, dccp or udplite" +
                      (d.proto ? " (not " + proto_text(d.proto) + ")" : std::string()));
    s.sport_set = d.sport.has_value();
    s.dport_set = d.dport.has_value();
    s.sport = d.sport.value_or(0);
    s.dport = d.dport.value_or(0);
    return s;
}

std::string format_selector(const Selector &s)
{
    std::string out = "src " + s.src.str() + " dst " + s.dst.str();
    if (s.proto)
        out += " proto " + proto_text(s.proto);
    if (s.sport_set)
        out += " sport " + std::to_string(s.sport);
    if (s.dport_set)
        out += " dport " + std::to_string(s.dport);
    return out;
}

// ---- SAs -----------------------------------------------------------------------------------

Result<Mode> parse_mode(Cursor &c)
{
    auto v = c.value("mode", "tunnel or transport");
    if (!v)
        return v.error();
    if (*v == "tunnel")
        return Mode::Tunnel;
    if (*v == "transport")
        return Mode::Transport;
    if (*v == "beet" || *v == "ro" || *v == "in_trigger")
        return c.fail("mode " + std::string(*v) + " is not supported; use tunnel or transport");
    return c.fail("mode " + shown(*v) + " is not one of tunnel, transport");
}

Result<void> parse_xfrm_proto(Cursor &c)
{
    auto v = c.value("proto", "esp");
    if (!v)
        return v.error();
    if (*v == "esp")
        return {};
    if (*v == "ah" || *v == "comp" || *v == "route2" || *v == "hao")
        return c.fail("proto " + std::string(*v) + " is not supported; xesp does proto esp only");
    return c.fail("unknown proto " + shown(*v) + "; use proto esp");
}

struct SaDraft {
    SaConfig sa;
    bool have_src = false, have_dst = false, have_spi = false;
    bool have_aead = false, have_enc = false, have_auth = false;
};

// `aead NAME KEY ICV-BITS`: the key is the cipher key followed by the 4-byte salt.
Result<void> parse_aead(Cursor &c, SaDraft &d)
{
    auto name = c.value("aead", "an algorithm name, a key and ICV bits");
    if (!name)
        return name.error();
    const AlgInfo *a = find_alg(*name);
    if (!a || a->kind != Kind::Aead)
        return c.fail(unknown_alg(Kind::Aead, *name));
    auto key = c.key("aead");
    if (!key)
        return key.error();
    auto bits = c.number("aead ICV-BITS", 255);
    if (!bits)
        return bits.error();
    size_t n = key->size();
    if (n < 4 || !in_list(a->key_bytes, unsigned(n - 4)))
        return c.fail(std::string(a->name) + " key is " + std::to_string(n) + " bytes; it must be " +
                      list_sizes(a->key_bytes, 4, " bytes") + ": the cipher key (" +
                      list_sizes(a->key_bytes, 0, " bytes") + ") followed by the 4-byte salt");
    if (!in_list(a->icv_bits, unsigned(*bits)))
        return c.fail(std::string(a->name) + " ICV of " + std::to_string(*bits) + " bits is not " +
                      "valid; use " + list_sizes(a->icv_bits, 0, " bits"));
    Transform &x = d.sa.xf;
    x.aead = AeadAlg(a->id);
    x.enc_key.assign(key->data(), n - 4);
    std::memcpy(x.salt.data(), key->data() + n - 4, 4);
    x.icv_len = uint8_t(*bits / 8);
    d.have_aead = true;
    return {};
}

Result<void> parse_enc(Cursor &c, SaDraft &d)
{
    auto name = c.value("enc", "an algorithm name and a key");
    if (!name)
        return name.error();
    const AlgInfo *a = find_alg(*name);
    if (!a || a->kind != Kind::Enc)
        return c.fail(unknown_alg(Kind::Enc, *name));
    auto key = c.key("enc");
    if (!key)
        return key.error();
    bool null = EncAlg(a->id) == EncAlg::Null;
    if (null ? key->size() != 0 : !in_list(a->key_bytes, unsigned(key->size())))
        return c.fail(std::string(a->name) + " key is " + std::to_string(key->size()) +
                      " bytes; it must be " +
                      (null ? std::string("empty (\"\")") : list_sizes(a->key_bytes, 0, " bytes")));
    d.sa.xf.enc = EncAlg(a->id);
    d.sa.xf.enc_key = *key;
    d.have_enc = true;
    return {};
}

// `auth NAME KEY` or `auth-trunc NAME KEY BITS`.
Result<void> parse_auth(Cursor &c, SaDraft &d, bool trunc)
{
    std::string_view word = trunc ? "auth-trunc" : "auth";
    auto name = c.value(word, trunc ? "an algorithm name, a key and ICV bits"
                                    : "an algorithm name and a key");
    if (!name)
        return name.error();
    const AlgInfo *a = find_alg(*name);
    if (!a || a->kind != Kind::Auth)
        return c.fail(unknown_alg(Kind::Auth, *name));
    auto key = c.key(word);
    if (!key)
        return key.error();
    if (key->size() == 0)
        return c.fail(std::string(a->name) + " key is empty");
    unsigned bits = a->icv_bits[0];
    unsigned digest = digest_bits(AuthAlg(a->id));
    if (trunc) {
        auto n = c.number("auth-trunc BITS", digest);
        if (!n)
            return n.error();
        bits = unsigned(*n);
        if (bits < 32 || bits % 8)
            return c.fail("auth-trunc " + std::string(a->name) + " BITS must be a multiple of 8 "
                          "from 32 to " + std::to_string(digest) + ", not " + std::to_string(bits));
    }
    d.sa.xf.auth = AuthAlg(a->id);
    d.sa.xf.auth_key = *key;
    d.sa.xf.icv_len = uint8_t(bits / 8);
    d.have_auth = true;
    return {};
}

// `flag FLAG...`: ip xfrm reads flag words until one is not a flag.
Result<void> parse_flags(Cursor &c, SaDraft &d)
{
    static const std::array<std::string_view, 7> kOther{
        "noecn", "decap-dscp", "nopmtudisc", "wildrecv", "icmp", "af-unspec", "align4"};
    auto first = c.value("flag", "a flag (esn)");
    if (!first)
        return first.error();
    c.back();
    size_t n = 0;
    while (c.more()) {
        std::string_view w = c.peek();
        bool other = std::find(kOther.begin(), kOther.end(), w) != kOther.end();
        if (w == "esn") {
            d.sa.esn = true;
        } else if (other || (n == 0 && has_hex_prefix(w))) {
            return c.fail("flag " + shown(w) + " is not supported; the only flag is esn");
        } else if (n == 0) {
            return c.fail("unknown flag " + shown(w) + "; the only flag is esn");
        } else {
            break;
        }
        c.take();
        n++;
    }
    return {};
}

Result<void> parse_encap(Cursor &c, SaDraft &d)
{
    auto type = c.value("encap", "espinudp SPORT DPORT OADDR");
    if (!type)
        return type.error();
    if (*type == "espinudp-nonike")
        return c.fail("encap espinudp-nonike (a pre-RFC 3948 draft) is not supported; use espinudp");
    if (*type == "espintcp")
        return c.fail("encap espintcp (RFC 8229) is not supported; use espinudp");
    if (*type != "espinudp")
        return c.fail("encap " + shown(*type) + " is not supported; use espinudp SPORT DPORT OADDR");
    NatTEncap e;
    auto sport = c.number("encap SPORT", 65535);
    if (!sport)
        return sport.error();
    auto dport = c.number("encap DPORT", 65535);
    if (!dport)
        return dport.error();
    XESP_SET(e.oaddr, c.address("encap OADDR"));
    e.sport = uint16_t(*sport);
    e.dport = uint16_t(*dport);
    d.sa.encap = e;
    return {};
}

Result<void> parse_sel(Cursor &c, SaDraft &d)
{
    SelectorDraft s;
    size_t n = 0;
    while (c.more()) {
        std::string_view w = c.take();
        auto used = selector_word(c, s, w);
        if (!used)
            return used.error();
        if (!*used) {
            c.back();
            break;
        }
        n++;
    }
    if (n == 0)
        return c.fail("'sel' needs src PREFIX dst PREFIX [proto P] [sport N] [dport N]");
    XESP_SET(d.sa.sel, finish_selector(c, s, "sel"));
    return {};
}

Result<void> parse_limit(Cursor &c, SaDraft &d)
{
    auto kind = c.value("limit", "byte-soft|byte-hard|packet-soft|packet-hard N");
    if (!kind)
        return kind.error();
    Lifetime &l = d.sa.lifetime;
    uint64_t *slot = *kind == "byte-soft"     ? &l.soft_bytes
                     : *kind == "byte-hard"   ? &l.hard_bytes
                     : *kind == "packet-soft" ? &l.soft_packets
                     : *kind == "packet-hard" ? &l.hard_packets
                                              : nullptr;
    if (!slot && kind->substr(0, 5) == "time-")
        return c.fail("limit " + shown(*kind) +
                      ": time limits are not supported; use byte-* or packet-* limits");
    if (!slot)
        return c.fail("limit " + shown(*kind) +
                      " is not one of byte-soft, byte-hard, packet-soft, packet-hard");
    XESP_TRY(c.once("limit " + std::string(*kind)));
    auto n = c.number("limit " + std::string(*kind), UINT64_MAX);
    if (!n)
        return n.error();
    *slot = *n;
    return {};
}

Result<void> parse_sa_word(Cursor &c, SaDraft &d, std::string_view w)
{
    SaConfig &sa = d.sa;
    if (w != "limit" && w != "flag")
        XESP_TRY(c.once(w == "auth-trunc" ? "auth" : w));
    if (w == "src") {
        XESP_SET(sa.src, c.address("src"));
        d.have_src = true;
    } else if (w == "dst") {
        XESP_SET(sa.dst, c.address("dst"));
        d.have_dst = true;
    } else if (w == "proto") {
        return parse_xfrm_proto(c);
    } else if (w == "spi") {
        XESP_SET(sa.spi, c.number("spi", UINT32_MAX));
        d.have_spi = true;
    } else if (w == "reqid") {
        XESP_SET(sa.reqid, c.number("reqid", UINT32_MAX));
    } else if (w == "mode") {
        XESP_SET(sa.mode, parse_mode(c));
    } else if (w == "aead") {
        return parse_aead(c, d);
    } else if (w == "enc") {
        return parse_enc(c, d);
    } else if (w == "auth" || w == "auth-trunc") {
        return parse_auth(c, d, w == "auth-trunc");
    } else if (w == "flag") {
        return parse_flags(c, d);
    } else if (w == "replay-window") {
        XESP_SET(sa.replay_window, c.number("replay-window", 4096));
    } else if (w == "replay-seq") {
        XESP_SET(sa.seq, c.number("replay-seq", UINT32_MAX));
    } else if (w == "replay-oseq") {
        XESP_SET(sa.oseq, c.number("replay-oseq", UINT32_MAX));
    } else if (w == "replay-seq-hi") {
        XESP_SET(sa.seq_hi, c.number("replay-seq-hi", UINT32_MAX));
    } else if (w == "replay-oseq-hi") {
        XESP_SET(sa.oseq_hi, c.number("replay-oseq-hi", UINT32_MAX));
    } else if (w == "encap") {
        return parse_encap(c, d);
    } else if (w == "sel") {
        return parse_sel(c, d);
    } else if (w == "limit") {
        return parse_limit(c, d);
    } else if (w == "dir") {
        auto i = c.choice("dir", {"in", "out"});
        if (!i)
            return i.error();
        sa.dir = *i == 0 ? Dir::In : Dir::Out;
    } else {
        return unknown_word(c, w, {"src", "dst", "proto", "spi", "reqid", "mode", "aead", "enc",
                                   "auth", "auth-trunc", "flag", "replay-window", "replay-seq",
                                   "replay-oseq", "replay-seq-hi", "replay-oseq-hi", "encap",
                                   "sel", "limit", "dir"});
    }
    return {};
}

Result<void> check_transform(const Cursor &c, const SaDraft &d)
{
    const Transform &x = d.sa.xf;
    if (d.have_aead && (d.have_enc || d.have_auth))
        return c.fail("aead cannot be combined with enc or auth: an AEAD both encrypts and "
                      "authenticates");
    if (d.have_aead)
        return {};
    if (d.have_enc && !d.have_auth)
        return c.fail(std::string(alg_of(Kind::Enc, uint8_t(x.enc))->name) +
                      " needs auth: ESP without integrity is not offered; add 'auth hmac(sha256) "
                      "KEY' or use aead");
    if (d.have_auth && !d.have_enc)
        return c.fail("auth without enc; for integrity only, add 'enc cipher_null \"\"'");
    if (!d.have_enc)
        return c.fail("no algorithm; give 'aead NAME KEY ICV-BITS' or 'enc NAME KEY auth NAME KEY'");
    return {};
}

Result<void> check_lifetime(const Cursor &c, const Lifetime &l)
{
    if (l.soft_bytes != UINT64_MAX && l.hard_bytes != UINT64_MAX && l.soft_bytes > l.hard_bytes)
        return c.fail("limit byte-soft is above byte-hard; the soft limit must come first");
    if (l.soft_packets != UINT64_MAX && l.hard_packets != UINT64_MAX &&
        l.soft_packets > l.hard_packets)
        return c.fail("limit packet-soft is above packet-hard; the soft limit must come first");
    return {};
}

// What the kernel's xfrm_user (verify_newsa_info, xfrm_init_state) would refuse.
Result<void> check_sa(const Cursor &c, const SaDraft &d)
{
    const SaConfig &sa = d.sa;
    if (!d.have_src || !d.have_dst)
        return c.fail(std::string("missing ") + (d.have_src ? "dst" : "src") + " ADDR");
    if (sa.src.family != sa.dst.family)
        return c.fail("src " + sa.src.str() + " and dst " + sa.dst.str() +
                      " are of different families");
    if (!d.have_spi)
        return c.fail("missing spi SPI");
    if (sa.spi == 0)
        return c.fail("spi 0 is reserved (RFC 4303 2.1)");
    XESP_TRY(check_transform(c, d));
    if (sa.esn && sa.replay_window == 0)
        return c.fail("flag esn needs replay-window greater than 0 (the kernel refuses ESN "
                      "without one)");
    if (!sa.esn && (sa.seq_hi || sa.oseq_hi))
        return c.fail("replay-seq-hi and replay-oseq-hi need flag esn");
    if (sa.sel && sa.sel->src.addr.family != sa.src.family && sa.mode != Mode::Tunnel)
        return c.fail("sel " + format_selector(*sa.sel) + " is of another family than src/dst; "
                      "only mode tunnel can change the family");
    if (sa.encap && sa.encap->oaddr.family != sa.src.family)
        return c.fail("encap OADDR " + sa.encap->oaddr.str() +
                      " is of another family than src/dst");
    return check_lifetime(c, sa.lifetime);
}

Result<SaConfig> parse_sa(Cursor &c)
{
    SaDraft d;
    while (c.more())
        XESP_TRY(parse_sa_word(c, d, c.take()));
    XESP_TRY(check_sa(c, d));
    return d.sa;
}

// `sa del|get [src ADDR] dst ADDR [proto esp] spi SPI`
Result<SaConfig> parse_sa_id(Cursor &c)
{
    SaDraft d;
    while (c.more()) {
        std::string_view w = c.take();
        if (w != "src" && w != "dst" && w != "proto" && w != "spi")
            return unknown_word(c, w, {"src", "dst", "proto", "spi"});
        XESP_TRY(parse_sa_word(c, d, w));
    }
    if (!d.have_dst)
        return c.fail("missing dst ADDR");
    if (d.have_src && d.sa.src.family != d.sa.dst.family)
        return c.fail("src " + d.sa.src.str() + " and dst " + d.sa.dst.str() +
                      " are of different families");
    if (!d.have_spi)
        return c.fail("missing spi SPI");
    return d.sa;
}

// ---- policies ------------------------------------------------------------------------------

// `tmpl [src A] [dst B] [proto esp] [spi S] [reqid R] [mode M] [level required]`
Result<PolicyTmpl> parse_tmpl(Cursor &c)
{
    PolicyTmpl t;
    std::set<std::string, std::less<>> seen;
    static const std::array<std::string_view, 7> kWords{"src", "dst", "proto", "spi",
                                                        "reqid", "mode", "level"};
    while (c.more()) {
        std::string_view w = c.peek();
        if (std::find(kWords.begin(), kWords.end(), w) == kWords.end() || seen.count(w))
            break;
        seen.insert(std::string(w));
        c.take();
        if (w == "src") {
            XESP_SET(t.src, c.address("tmpl src"));
        } else if (w == "dst") {
            XESP_SET(t.dst, c.address("tmpl dst"));
        } else if (w == "proto") {
            XESP_TRY(parse_xfrm_proto(c));
        } else if (w == "spi") {
            XESP_SET(t.spi, c.number("tmpl spi", UINT32_MAX));
        } else if (w == "reqid") {
            XESP_SET(t.reqid, c.number("tmpl reqid", UINT32_MAX));
        } else if (w == "mode") {
            XESP_SET(t.mode, parse_mode(c));
        } else {
            auto level = c.choice("level", {"required", "use"});
            if (!level)
                return level.error();
            if (*level == 1)
                return c.fail("tmpl level use (IPsec if an SA exists, else clear text) is not "
                              "supported; templates are level required");
        }
    }
    if (t.mode == Mode::Tunnel && (!t.src.family || !t.dst.family))
        return c.fail("a mode tunnel tmpl needs src ADDR and dst ADDR (the tunnel endpoints)");
    if (t.src.family && t.dst.family && t.src.family != t.dst.family)
        return c.fail("tmpl src " + t.src.str() + " and dst " + t.dst.str() +
                      " are of different families");
    return t;
}

struct PolicyDraft {
    PolicyConfig p;
    SelectorDraft sel;
    bool have_dir = false;
};

Result<void> parse_policy_word(Cursor &c, PolicyDraft &d, std::string_view w, bool id_only)
{
    auto used = selector_word(c, d.sel, w);
    if (!used)
        return used.error();
    if (*used)
        return {};
    if (w == "src" || w == "dst" || w == "proto" || w == "sport" || w == "dport")
        return c.fail("'" + std::string(w) + "' is given twice");
    if (w == "dir") {
        XESP_TRY(c.once(w));
        auto i = c.choice("dir", {"in", "out", "fwd"});
        if (!i)
            return i.error();
        d.p.dir = *i == 0 ? Dir::In : *i == 1 ? Dir::Out : Dir::Fwd;
        d.have_dir = true;
    } else if (w == "ptype") {
        XESP_TRY(c.once(w));
        auto i = c.choice("ptype", {"main", "sub"});
        if (!i)
            return i.error();
        if (*i == 1)
            return c.fail("ptype sub (MIGRATE sub-policies) is not supported; use ptype main");
    } else if (id_only) {
        return unknown_word(c, w, {"src", "dst", "proto", "sport", "dport", "dir", "ptype"});
    } else if (w == "priority") {
        XESP_TRY(c.once(w));
        XESP_SET(d.p.priority, c.number("priority", UINT32_MAX));
    } else if (w == "action") {
        XESP_TRY(c.once(w));
        auto i = c.choice("action", {"allow", "block"});
        if (!i)
            return i.error();
        d.p.action = *i == 0 ? Action::Allow : Action::Block;
    } else if (w == "tmpl") {
        if (d.p.tmpl)
            return c.fail("only one tmpl per policy is supported (no SA bundles)");
        XESP_SET(d.p.tmpl, parse_tmpl(c));
    } else if (w == "index") {
        return c.fail("'index' is not supported: policies are named by selector and dir");
    } else if (w == "limit" || w == "flag") {
        return c.fail("policy '" + std::string(w) + "' is not supported");
    } else {
        return unknown_word(c, w, {"src", "dst", "proto", "sport", "dport", "dir", "priority",
                                   "action", "tmpl", "ptype"});
    }
    return {};
}

Result<PolicyConfig> parse_policy(Cursor &c, bool id_only)
{
    PolicyDraft d;
    while (c.more())
        XESP_TRY(parse_policy_word(c, d, c.take(), id_only));
    XESP_SET(d.p.sel, finish_selector(c, d.sel, "selector"));
    if (!d.have_dir)
        return c.fail("missing dir in|out|fwd");
    if (d.p.action == Action::Block && d.p.tmpl)
        return c.fail("action block drops the traffic; it takes no tmpl");
    return d.p;
}

Result<Command::Verb> parse_verb(std::string_view w)
{
    using V = Command::Verb;
    if (w == "add")
        return V::Add;
    if (w == "update")
        return V::Update;
    if (w == "del" || w == "delete")
        return V::Del;
    if (w == "get")
        return V::Get;
    if (w == "flush")
        return V::Flush;
    if (w == "list" || w == "show")
        return V::List;
    return make_error("unknown command " + shown(w) + "; expected add, update, del, get, flush or list");
}

} // namespace

// ---- the public entry points ---------------------------------------------------------------

Result<Command> parse_command(const std::vector<std::string> &words)
{
    Command cmd;
    if (words.empty())
        return make_error("empty command; expected sa ... or policy ...");
    std::string_view obj = words[0];
    if (obj == "sa" || obj == "state")
        cmd.object = Command::Object::Sa;
    else if (obj == "policy")
        cmd.object = Command::Object::Policy;
    else
        return make_error("unknown object " + shown(obj) + "; expected sa or policy");
    if (words.size() < 2)
        return make_error(std::string(obj) + ": missing command: add, update, del, get, flush or list");
    XESP_SET(cmd.verb, parse_verb(words[1]));
    bool sa = cmd.object == Command::Object::Sa;
    Cursor c(words, std::string(sa ? "sa " : "policy ") + words[1]);
    using V = Command::Verb;
    switch (cmd.verb) {
    case V::Add:
    case V::Update:
        if (sa)
            XESP_SET(cmd.sa, parse_sa(c));
        else
            XESP_SET(cmd.policy, parse_policy(c, false));
        break;
    case V::Del:
    case V::Get:
        if (sa)
            XESP_SET(cmd.sa, parse_sa_id(c));
        else
            XESP_SET(cmd.policy, parse_policy(c, true));
        break;
    case V::Flush:
    case V::List:
        if (c.more())
            return c.fail("takes no arguments, not " + shown(c.peek()));
        break;
    }
    return cmd;
}

std::string format_sa(const SaConfig &sa, bool show_keys)
{
    const Transform &x = sa.xf;
    std::string out = "sa add src " + sa.src.str() + " dst " + sa.dst.str() + " proto esp spi " +
                      hex32(sa.spi);
    if (sa.reqid)
        out += " reqid " + std::to_string(sa.reqid);
    out += sa.mode == Mode::Tunnel ? " mode tunnel" : " mode transport";
    if (const AlgInfo *a = alg_of(Kind::Aead, uint8_t(x.aead)); a && x.is_aead()) {
        out += " aead " + quote_word(a->name) + " " +
               key_text(x.enc_key.data(), x.enc_key.size(), x.salt.data(), 4, show_keys) + " " +
               std::to_string(x.icv_len * 8);
    } else {
        if (const AlgInfo *e = alg_of(Kind::Enc, uint8_t(x.enc)); e && x.enc != EncAlg::None)
            out += " enc " + quote_word(e->name) + " " +
                   key_text(x.enc_key.data(), x.enc_key.size(), nullptr, 0, show_keys);
        if (const AlgInfo *h = alg_of(Kind::Auth, uint8_t(x.auth)); h && x.auth != AuthAlg::None)
            out += " auth-trunc " + quote_word(h->name) + " " +
                   key_text(x.auth_key.data(), x.auth_key.size(), nullptr, 0, show_keys) + " " +
                   std::to_string(x.icv_len * 8);
    }
    if (sa.esn)
        out += " flag esn";
    if (sa.replay_window)
        out += " replay-window " + std::to_string(sa.replay_window);
    const std::pair<const char *, uint32_t> replay[] = {
        {"replay-seq", sa.seq}, {"replay-oseq", sa.oseq},
        {"replay-seq-hi", sa.seq_hi}, {"replay-oseq-hi", sa.oseq_hi}};
    for (const auto &[word, v] : replay)
        if (v)
            out += std::string(" ") + word + " " + std::to_string(v);
    if (sa.encap)
        out += " encap espinudp " + std::to_string(sa.encap->sport) + " " +
               std::to_string(sa.encap->dport) + " " + sa.encap->oaddr.str();
    if (sa.sel)
        out += " sel " + format_selector(*sa.sel);
    const std::pair<const char *, uint64_t> limits[] = {
        {"byte-soft", sa.lifetime.soft_bytes}, {"byte-hard", sa.lifetime.hard_bytes},
        {"packet-soft", sa.lifetime.soft_packets}, {"packet-hard", sa.lifetime.hard_packets}};
    for (const auto &[word, v] : limits)
        if (v != UINT64_MAX)
            out += std::string(" limit ") + word + " " + std::to_string(v);
    if (sa.dir != Dir::Unspec)
        out += " dir " + std::string(dir_word(sa.dir));
    return out;
}

std::string format_policy(const PolicyConfig &p)
{
    std::string out = "policy add " + format_selector(p.sel) + " dir " +
                      std::string(dir_word(p.dir));
    if (p.priority)
        out += " priority " + std::to_string(p.priority);
    if (p.action == Action::Block)
        out += " action block";
    if (p.tmpl) {
        const PolicyTmpl &t = *p.tmpl;
        out += " tmpl";
        if (t.src.family)
            out += " src " + t.src.str();
        if (t.dst.family)
            out += " dst " + t.dst.str();
        out += " proto esp";
        if (t.spi)
            out += " spi " + hex32(t.spi);
        if (t.reqid)
            out += " reqid " + std::to_string(t.reqid);
        out += t.mode == Mode::Tunnel ? " mode tunnel" : " mode transport";
    }
    return out;
}

std::string describe_sa(const IpAddr &dst, uint32_t spi)
{
    return "SA dst " + dst.str() + " spi " + hex32(spi);
}

std::string describe_policy(const Selector &sel, Dir dir)
{
    return "policy " + format_selector(sel) + " dir " + std::string(dir_word(dir));
}

std::string Transform::name() const
{
    if (is_aead()) {
        const AlgInfo *a = alg_of(Kind::Aead, uint8_t(aead));
        return std::string(a ? a->name : "?") + " " + std::to_string(enc_key.size() * 8) +
               "-bit key, " + std::to_string(icv_len * 8) + "-bit ICV";
    }
    if (enc == EncAlg::None && auth == AuthAlg::None)
        return "none";
    const AlgInfo *e = alg_of(Kind::Enc, uint8_t(enc));
    const AlgInfo *h = alg_of(Kind::Auth, uint8_t(auth));
    std::string out = std::string(e ? e->name : "none") + "+" + std::string(h ? h->name : "none");
    if (enc == EncAlg::AesCbc)
        out += " " + std::to_string(enc_key.size() * 8) + "-bit key,";
    return out + " " + std::to_string(icv_len * 8) + "-bit ICV";
}

bool same_sa(const SaConfig &a, const SaConfig &b)
{
    const Transform &x = a.xf, &y = b.xf;
    bool xf = x.aead == y.aead && x.enc == y.enc && x.auth == y.auth && x.enc_key == y.enc_key &&
              CRYPTO_memcmp(x.salt.data(), y.salt.data(), x.salt.size()) == 0 &&
              x.auth_key == y.auth_key && x.icv_len == y.icv_len;
    bool encap = a.encap.has_value() == b.encap.has_value() &&
                 (!a.encap || (a.encap->sport == b.encap->sport && a.encap->dport == b.encap->dport &&
                               a.encap->oaddr == b.encap->oaddr));
    const Lifetime &l = a.lifetime, &m = b.lifetime;
    bool life = l.soft_bytes == m.soft_bytes && l.hard_bytes == m.hard_bytes &&
                l.soft_packets == m.soft_packets && l.hard_packets == m.hard_packets;
    return xf && encap && life && a.src == b.src && a.dst == b.dst && a.spi == b.spi &&
           a.reqid == b.reqid && a.mode == b.mode && a.esn == b.esn &&
           a.replay_window == b.replay_window && a.seq == b.seq && a.seq_hi == b.seq_hi &&
           a.oseq == b.oseq && a.oseq_hi == b.oseq_hi && a.sel == b.sel && a.dir == b.dir;
}

bool same_policy(const PolicyConfig &a, const PolicyConfig &b)
{
    bool tmpl = a.tmpl.has_value() == b.tmpl.has_value() &&
                (!a.tmpl || (a.tmpl->src == b.tmpl->src && a.tmpl->dst == b.tmpl->dst &&
                             a.tmpl->spi == b.tmpl->spi && a.tmpl->reqid == b.tmpl->reqid &&
                             a.tmpl->mode == b.tmpl->mode));
    return tmpl && a.sel == b.sel && a.dir == b.dir && a.priority == b.priority &&
           a.action == b.action;
}

} // namespace xesp
