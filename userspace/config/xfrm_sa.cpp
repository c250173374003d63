// SAs: the words of `ip xfrm state add` read into an SaConfig, checked as the kernel's
// xfrm_user would check them, and written back.
#include "userspace/config/xfrm_sa.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "userspace/base/wiped.h"
#include "userspace/config/xfrm_algs.h"
#include "userspace/config/xfrm_grammar.h"
#include "userspace/config/xfrm_selector.h"

namespace xesp {

namespace xfrm {

namespace {

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
        return c.fail(std::string(a->name) + " key is " + std::to_string(n) +
                      " bytes; it must be " + list_sizes(a->key_bytes, 4, " bytes") +
                      ": the cipher key (" + list_sizes(a->key_bytes, 0, " bytes") +
                      ") followed by the 4-byte salt");
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
            return c.fail("auth-trunc " + std::string(a->name) +
                          " BITS must be a multiple of 8 "
                          "from 32 to " +
                          std::to_string(digest) + ", not " + std::to_string(bits));
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
        return c.fail(
            "encap espinudp-nonike (a pre-RFC 3948 draft) is not supported; use espinudp");
    if (*type == "espintcp")
        return c.fail("encap espintcp (RFC 8229) is not supported; use espinudp");
    if (*type != "espinudp")
        return c.fail("encap " + shown(*type) +
                      " is not supported; use espinudp SPORT DPORT OADDR");
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
    auto kind = c.value("limit", "byte-soft|byte-hard|packet-soft|packet-hard|time-soft|"
                                 "time-hard|time-use-soft|time-use-hard N");
    if (!kind)
        return kind.error();
    Lifetime &l = d.sa.lifetime;
    uint64_t *slot = *kind == "byte-soft"       ? &l.soft_bytes
                     : *kind == "byte-hard"     ? &l.hard_bytes
                     : *kind == "packet-soft"   ? &l.soft_packets
                     : *kind == "packet-hard"   ? &l.hard_packets
                     : *kind == "time-soft"     ? &l.soft_add_s
                     : *kind == "time-hard"     ? &l.hard_add_s
                     : *kind == "time-use-soft" ? &l.soft_use_s
                     : *kind == "time-use-hard" ? &l.hard_use_s
                                                : nullptr;
    if (!slot)
        return c.fail("limit " + shown(*kind) +
                      " is not one of byte-soft, byte-hard, packet-soft, packet-hard, "
                      "time-soft, time-hard, time-use-soft, time-use-hard");
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
        return unknown_word(c, w, {"src",        "dst",         "proto",         "spi",
                                   "reqid",      "mode",        "aead",          "enc",
                                   "auth",       "auth-trunc",  "flag",          "replay-window",
                                   "replay-seq", "replay-oseq", "replay-seq-hi", "replay-oseq-hi",
                                   "encap",      "sel",         "limit",         "dir"});
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
        return c.fail(
            "no algorithm; give 'aead NAME KEY ICV-BITS' or 'enc NAME KEY auth NAME KEY'");
    return {};
}

Result<void> check_lifetime(const Cursor &c, const Lifetime &l)
{
    const struct {
        uint64_t soft, hard;
        const char *name;
    } limits[] = {{l.soft_bytes, l.hard_bytes, "byte"},
                  {l.soft_packets, l.hard_packets, "packet"},
                  {l.soft_add_s, l.hard_add_s, "time"},
                  {l.soft_use_s, l.hard_use_s, "time-use"}};
    for (const auto &x : limits)
        if (x.soft != UINT64_MAX && x.hard != UINT64_MAX && x.soft > x.hard)
            return c.fail(std::string("limit ") + x.name + "-soft is above " + x.name +
                          "-hard; the soft limit must come first");
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
        return c.fail("sel " + format_selector(*sa.sel) +
                      " is of another family than src/dst; "
                      "only mode tunnel can change the family");
    if (sa.encap && sa.encap->oaddr.family != sa.src.family)
        return c.fail("encap OADDR " + sa.encap->oaddr.str() +
                      " is of another family than src/dst");
    return check_lifetime(c, sa.lifetime);
}

}  // namespace

Result<SaConfig> parse_sa(Cursor &c)
{
    SaDraft d;
    while (c.more())
        XESP_TRY(parse_sa_word(c, d, c.take()));
    XESP_TRY(check_sa(c, d));
    return d.sa;
}

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

}  // namespace xfrm

using xfrm::alg_of;
using xfrm::AlgInfo;
using xfrm::append_key_text;
using xfrm::dir_word;
using xfrm::format_selector;
using xfrm::Kind;

// With keys shown, the line is the caller's to wipe, and nothing else holds them: every piece
// goes through append_wiped, so the storage the line outgrows is wiped before it is freed.
std::string format_sa(const SaConfig &sa, bool show_keys)
{
    const Transform &x = sa.xf;
    std::string out;
    out.reserve(512);
    auto add = [&out](std::string_view s) { append_wiped(out, s); };
    auto add_key = [&](const KeyBytes &k, const uint8_t *salt, size_t salt_len) {
        append_key_text(out, k.data(), k.size(), salt, salt_len, show_keys);
    };
    add("sa add src " + sa.src.str() + " dst " + sa.dst.str() + " proto esp spi " + hex32(sa.spi));
    if (sa.reqid)
        add(" reqid " + std::to_string(sa.reqid));
    add(sa.mode == Mode::Tunnel ? " mode tunnel" : " mode transport");
    if (const AlgInfo *a = alg_of(Kind::Aead, uint8_t(x.aead)); a && x.is_aead()) {
        add(" aead " + quote_word(a->name) + " ");
        add_key(x.enc_key, x.salt.data(), 4);
        add(" " + std::to_string(x.icv_len * 8));
    } else {
        if (const AlgInfo *e = alg_of(Kind::Enc, uint8_t(x.enc)); e && x.enc != EncAlg::None) {
            add(" enc " + quote_word(e->name) + " ");
            add_key(x.enc_key, nullptr, 0);
        }
        if (const AlgInfo *h = alg_of(Kind::Auth, uint8_t(x.auth)); h && x.auth != AuthAlg::None) {
            add(" auth-trunc " + quote_word(h->name) + " ");
            add_key(x.auth_key, nullptr, 0);
            add(" " + std::to_string(x.icv_len * 8));
        }
    }
    if (sa.esn)
        add(" flag esn");
    if (sa.replay_window)
        add(" replay-window " + std::to_string(sa.replay_window));
    const std::pair<const char *, uint32_t> replay[] = {{"replay-seq", sa.seq},
                                                        {"replay-oseq", sa.oseq},
                                                        {"replay-seq-hi", sa.seq_hi},
                                                        {"replay-oseq-hi", sa.oseq_hi}};
    for (const auto &[word, v] : replay)
        if (v)
            add(std::string(" ") + word + " " + std::to_string(v));
    if (sa.encap)
        add(" encap espinudp " + std::to_string(sa.encap->sport) + " " +
            std::to_string(sa.encap->dport) + " " + sa.encap->oaddr.str());
    if (sa.sel)
        add(" sel " + format_selector(*sa.sel));
    const Lifetime &l = sa.lifetime;
    const std::pair<const char *, uint64_t> limits[] = {
        {"byte-soft", l.soft_bytes},     {"byte-hard", l.hard_bytes},
        {"packet-soft", l.soft_packets}, {"packet-hard", l.hard_packets},
        {"time-soft", l.soft_add_s},     {"time-hard", l.hard_add_s},
        {"time-use-soft", l.soft_use_s}, {"time-use-hard", l.hard_use_s}};
    for (const auto &[word, v] : limits)
        if (v != UINT64_MAX)
            add(std::string(" limit ") + word + " " + std::to_string(v));
    if (sa.dir != Dir::Unspec)
        add(" dir " + std::string(dir_word(sa.dir)));
    return out;
}

}  // namespace xesp
