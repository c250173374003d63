// The ip xfrm grammar: valid lines and the fields they set, invalid lines and what their error
// says, format/parse round trips, batches and the database semantics.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "userspace/config/config.h"
#include "userspace/config/xfrm_grammar.h"

using namespace xesp;

namespace {

// Distinctive key material: the tests look for these hex strings in every message and listing.
const std::string kGcm128 = "0x5ec2e7c0ffee5ec2e7c0ffee5ec2e7c0a1b2c3d4";  // 16 + 4 salt
const std::string kGcm256 = "0x" + std::string(64, 'a') + "5a17f00d";      // 32 + 4 salt
const std::string kAes128 = "0xdeadbeefcafebabe0011223344556677";
const std::string kHmac = "0x0badc0de0badc0de0badc0de0badc0de0badc0de";
const std::string kHead = "sa add src 10.0.0.1 dst 10.0.0.2 proto esp spi 0x1000 ";
const std::string kGcmAlg = "aead 'rfc4106(gcm(aes))' " + kGcm128 + " 128";

std::string key_digits(const std::string &k)
{
    return k.substr(2);
}

Result<Command> parse_line(const std::string &line)
{
    auto words = split_words(line);
    if (!words)
        return words.error();
    return parse_command(*words);
}

SaConfig sa_of(const std::string &line)
{
    auto c = parse_line(line);
    INFO(line);
    INFO((c ? std::string() : c.error().message));
    REQUIRE(c.ok());
    REQUIRE(c->object == Command::Object::Sa);
    return c->sa;
}

PolicyConfig policy_of(const std::string &line)
{
    auto c = parse_line(line);
    INFO(line);
    INFO((c ? std::string() : c.error().message));
    REQUIRE(c.ok());
    REQUIRE(c->object == Command::Object::Policy);
    return c->policy;
}

IpAddr ip(const char *s)
{
    return *IpAddr::parse(s);
}

Prefix pfx(const char *s)
{
    return *Prefix::parse(s);
}

bool no_key_in(const std::string &text)
{
    for (const auto &k : {kGcm128, kGcm256, kAes128, kHmac}) {
        std::string d = key_digits(k);
        if (text.find(d) != std::string::npos || text.find(d.substr(0, 16)) != std::string::npos)
            return false;
    }
    return text.find("s3cr3t-passphrase") == std::string::npos;
}

}  // namespace

TEST_CASE("split_words: quoting, escapes and comments")
{
    struct Case {
        const char *line;
        std::vector<std::string> words;
    };
    const Case cases[] = {
        {"", {}},
        {"   \t ", {}},
        {"# only a comment", {}},
        {"sa add  src\t1.2.3.4", {"sa", "add", "src", "1.2.3.4"}},
        {"a 'b c' \"d e\"", {"a", "b c", "d e"}},
        {"enc cipher_null \"\"", {"enc", "cipher_null", ""}},
        {"x '' y", {"x", "", "y"}},
        {"a\\ b c", {"a b", "c"}},
        {"'it'\\''s'", {"it's"}},
        {"\"a\\\"b\\\\c\\d\"", {"a\"b\\c\\d"}},
        {"a#b c # comment 'unterminated", {"a#b", "c"}},
        {"aead 'rfc4106(gcm(aes))' k 128 # trailing", {"aead", "rfc4106(gcm(aes))", "k", "128"}},
        {"'#not a comment'", {"#not a comment"}},
    };
    for (const auto &c : cases) {
        INFO(c.line);
        auto w = split_words(c.line);
        REQUIRE(w.ok());
        CHECK(*w == c.words);
    }
    CHECK_FALSE(split_words("a 'b").ok());
    CHECK_FALSE(split_words("a \"b").ok());
    CHECK_FALSE(split_words("a b\\").ok());
    bool continues = false;
    auto w = split_words("sa add \\", &continues);
    REQUIRE(w.ok());
    CHECK(continues);
}

TEST_CASE("quote_word reads back through split_words")
{
    for (std::string s : {"plain", "rfc4106(gcm(aes))", "", "it's", "#x", "a b", "\"q\"", "\\"}) {
        auto w = split_words(quote_word(s));
        REQUIRE(w.ok());
        REQUIRE(w->size() == 1);
        CHECK((*w)[0] == s);
    }
}

TEST_CASE("valid SA lines set the fields")
{
    struct Case {
        std::string line;
        std::function<void(const SaConfig &)> check;
    };
    const std::vector<Case> cases = {
        {kHead + kGcmAlg,
         [](const SaConfig &s) {
             CHECK(s.src == ip("10.0.0.1"));
             CHECK(s.dst == ip("10.0.0.2"));
             CHECK(s.spi == 0x1000);
             CHECK(s.mode == Mode::Transport);
             CHECK(s.xf.aead == AeadAlg::AesGcm);
             CHECK(s.xf.enc_key.size() == 16);
             CHECK(s.xf.enc_key.data()[0] == 0x5e);
             CHECK(s.xf.salt == std::array<uint8_t, 4>{0xa1, 0xb2, 0xc3, 0xd4});
             CHECK(s.xf.icv_len == 16);
             CHECK(s.xf.iv_len() == 8);
             CHECK(s.xf.name() == "rfc4106(gcm(aes)) 128-bit key, 128-bit ICV");
             CHECK_FALSE(s.sel.has_value());
             CHECK(s.dir == Dir::Unspec);
         }},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto esp spi 4096 aead rfc4106(gcm(aes)) 0x" +
             std::string(48, 'b') + "01020304 64",
         [](const SaConfig &s) {
             CHECK(s.spi == 4096);
             CHECK(s.xf.enc_key.size() == 24);
             CHECK(s.xf.icv_len == 8);
         }},
        {kHead + "aead rfc4106(gcm(aes)) " + kGcm256 + " 96",
         [](const SaConfig &s) {
             CHECK(s.xf.enc_key.size() == 32);
             CHECK(s.xf.icv_len == 12);
             CHECK(s.xf.salt == std::array<uint8_t, 4>{0x5a, 0x17, 0xf0, 0x0d});
         }},
        {kHead + "aead rfc4543(gcm(aes)) " + kGcm128 + " 128",
         [](const SaConfig &s) {
             CHECK(s.xf.aead == AeadAlg::AesGmac);
             CHECK(s.xf.name() == "rfc4543(gcm(aes)) 128-bit key, 128-bit ICV");
         }},
        {kHead + "aead 'rfc7539esp(chacha20,poly1305)' " + kGcm256 + " 128",
         [](const SaConfig &s) {
             CHECK(s.xf.aead == AeadAlg::ChaCha20Poly1305);
             CHECK(s.xf.enc_key.size() == 32);
         }},
        {kHead + "aead rfc4106(gcm(aes)) 0123456789abcdefghij 128",  // a string key: its bytes
         [](const SaConfig &s) {
             CHECK(s.xf.enc_key.size() == 16);
             CHECK(s.xf.enc_key.data()[0] == '0');
             CHECK(s.xf.salt == std::array<uint8_t, 4>{'g', 'h', 'i', 'j'});
         }},
        {kHead + "enc 'cbc(aes)' " + kAes128 + " auth 'hmac(sha256)' " + kHmac,
         [](const SaConfig &s) {
             CHECK(s.xf.enc == EncAlg::AesCbc);
             CHECK(s.xf.auth == AuthAlg::HmacSha256);
             CHECK(s.xf.enc_key.size() == 16);
             CHECK(s.xf.auth_key.size() == 20);
             CHECK(s.xf.icv_len == 12);  // what the kernel's `auth hmac(sha256)` gives
             CHECK(s.xf.iv_len() == 16);
             CHECK(s.xf.name() == "cbc(aes)+hmac(sha256) 128-bit key, 96-bit ICV");
         }},
        {kHead + "enc aes 0X" + std::string(64, 'C') + " auth sha1 " + kHmac,
         [](const SaConfig &s) {
             CHECK(s.xf.enc == EncAlg::AesCbc);
             CHECK(s.xf.enc_key.size() == 32);
             CHECK(s.xf.enc_key.data()[0] == 0xcc);
             CHECK(s.xf.auth == AuthAlg::HmacSha1);
             CHECK(s.xf.icv_len == 12);
         }},
        {kHead + "enc cbc(aes) 0x" + std::string(48, '1') + " auth sha384 " + kHmac,
         [](const SaConfig &s) {
             CHECK(s.xf.enc_key.size() == 24);
             CHECK(s.xf.icv_len == 24);
         }},
        {kHead + "enc cbc(aes) " + kAes128 + " auth hmac(sha512) " + kHmac,
         [](const SaConfig &s) { CHECK(s.xf.icv_len == 32); }},
        {kHead + "enc cbc(aes) " + kAes128 + " auth-trunc hmac(sha256) " + kHmac + " 96",
         [](const SaConfig &s) { CHECK(s.xf.icv_len == 12); }},
        {kHead + "enc cbc(aes) " + kAes128 + " auth-trunc sha512 " + kHmac + " 512",
         [](const SaConfig &s) { CHECK(s.xf.icv_len == 64); }},
        {kHead + "enc cipher_null \"\" auth sha1 s3cr3t-passphrase",
         [](const SaConfig &s) {
             CHECK(s.xf.enc == EncAlg::Null);
             CHECK(s.xf.enc_key.size() == 0);
             CHECK(s.xf.auth_key.size() == 17);
             CHECK(s.xf.block_size() == 4);
             CHECK(s.xf.name() == "ecb(cipher_null)+hmac(sha1) 96-bit ICV");
         }},
        {kHead + "enc \"ecb(cipher_null)\" '' auth-trunc sha256 " + kHmac + " 32",
         [](const SaConfig &s) {
             CHECK(s.xf.enc == EncAlg::Null);
             CHECK(s.xf.icv_len == 4);
         }},
        {kHead + "reqid 7 mode tunnel " + kGcmAlg +
             " flag esn replay-window 4096 replay-seq 5 "
             "replay-oseq 6 replay-seq-hi 1 replay-oseq-hi 2 dir out",
         [](const SaConfig &s) {
             CHECK(s.reqid == 7);
             CHECK(s.mode == Mode::Tunnel);
             CHECK(s.esn);
             CHECK(s.replay_window == 4096);
             CHECK(s.seq == 5);
             CHECK(s.oseq == 6);
             CHECK(s.seq_hi == 1);
             CHECK(s.oseq_hi == 2);
             CHECK(s.dir == Dir::Out);
         }},
        {kHead + kGcmAlg + " replay-window 0 dir in encap espinudp 4500 4501 192.0.2.1",
         [](const SaConfig &s) {
             CHECK(s.dir == Dir::In);
             REQUIRE(s.encap.has_value());
             CHECK(s.encap->sport == 4500);
             CHECK(s.encap->dport == 4501);
             CHECK(s.encap->oaddr == ip("192.0.2.1"));
         }},
        {kHead + kGcmAlg + " sel src 192.168.1.0/24 dst 192.168.2.7 proto tcp sport 1024 dport 443",
         [](const SaConfig &s) {
             REQUIRE(s.sel.has_value());
             CHECK(s.sel->src == pfx("192.168.1.0/24"));
             CHECK(s.sel->dst == pfx("192.168.2.7/32"));
             CHECK(s.sel->proto == 6);
             CHECK(s.sel->sport_set);
             CHECK(s.sel->sport == 1024);
             CHECK(s.sel->dport_set);
             CHECK(s.sel->dport == 443);
         }},
        {kHead + kGcmAlg + " sel src 10.1.0.0/16 proto 17 dport 53",
         [](const SaConfig &s) {
             REQUIRE(s.sel.has_value());
             CHECK(s.sel->dst == pfx("0.0.0.0/0"));
             CHECK(s.sel->proto == 17);
             CHECK_FALSE(s.sel->sport_set);
             CHECK(s.sel->dport == 53);
         }},
        {kHead + "mode tunnel " + kGcmAlg +
             " sel src 2001:db8:1::/48 dst 2001:db8:2::/48 proto ipv6-icmp",
         [](const SaConfig &s) {  // 6in4
             CHECK(s.sel->src.addr.family == 6);
             CHECK(s.sel->proto == 58);
         }},
        {"sa add src 2001:db8::1 dst 2001:db8::2 proto esp spi 1 mode tunnel " + kGcmAlg +
             " sel src 10.0.0.0/8 dst 10.0.0.0/8 proto gre",
         [](const SaConfig &s) {  // 4in6
             CHECK(s.dst.family == 6);
             CHECK(s.sel->src.addr.family == 4);
             CHECK(s.sel->proto == 47);
         }},
        {kHead + kGcmAlg +
             " limit byte-soft 1000 limit byte-hard 0x2000 limit packet-soft 10 "
             "limit packet-hard 20",
         [](const SaConfig &s) {
             CHECK(s.lifetime.soft_bytes == 1000);
             CHECK(s.lifetime.hard_bytes == 0x2000);
             CHECK(s.lifetime.soft_packets == 10);
             CHECK(s.lifetime.hard_packets == 20);
         }},
        {kHead + kGcmAlg + " limit packet-hard 18446744073709551615",
         [](const SaConfig &s) { CHECK(s.lifetime.hard_packets == UINT64_MAX); }},
        {kHead + kGcmAlg +
             " limit time-soft 3000 limit time-hard 3600 limit time-use-soft 50 "
             "limit time-use-hard 60",
         [](const SaConfig &s) {
             CHECK(s.lifetime.soft_add_s == 3000);
             CHECK(s.lifetime.hard_add_s == 3600);
             CHECK(s.lifetime.soft_use_s == 50);
             CHECK(s.lifetime.hard_use_s == 60);
             CHECK(s.lifetime.has_time());
             CHECK(s.lifetime.soft_bytes == UINT64_MAX);
         }},
        {kHead + kGcmAlg + " limit byte-hard 10",
         [](const SaConfig &s) { CHECK(!s.lifetime.has_time()); }},
        {"state add spi 0xffffffff " + kGcmAlg + " dst ::1 src ::2",  // any order, like ip xfrm
         [](const SaConfig &s) {
             CHECK(s.spi == 0xffffffff);
             CHECK(s.src == ip("::2"));
         }},
        {"sa add src 10.0.0.1 dst 10.0.0.2 spi 1 " + kGcmAlg,  // proto esp may be left out
         [](const SaConfig &s) { CHECK(s.spi == 1); }},
    };
    for (const auto &c : cases) {
        INFO(c.line);
        c.check(sa_of(c.line));
    }
}

TEST_CASE("valid policy lines set the fields")
{
    struct Case {
        std::string line;
        std::function<void(const PolicyConfig &)> check;
    };
    const std::vector<Case> cases = {
        {"policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out",
         [](const PolicyConfig &p) {
             CHECK(p.sel.src == pfx("10.1.0.0/16"));
             CHECK(p.sel.dst == pfx("10.2.0.0/16"));
             CHECK(p.dir == Dir::Out);
             CHECK(p.priority == 0);
             CHECK(p.action == Action::Allow);
             CHECK_FALSE(p.tmpl.has_value());
         }},
        {"policy add src 10.1.0.0/16 dst 10.2.0.0/16 proto udp sport 500 dport 500 dir in "
         "priority 100 action block ptype main",
         [](const PolicyConfig &p) {
             CHECK(p.sel.proto == 17);
             CHECK(p.sel.sport == 500);
             CHECK(p.sel.dport_set);
             CHECK(p.dir == Dir::In);
             CHECK(p.priority == 100);
             CHECK(p.action == Action::Block);
         }},
        {"policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir fwd tmpl src 192.0.2.1 dst 192.0.2.2 "
         "proto esp spi 0x1000 reqid 3 mode tunnel level required",
         [](const PolicyConfig &p) {
             CHECK(p.dir == Dir::Fwd);
             REQUIRE(p.tmpl.has_value());
             CHECK(p.tmpl->src == ip("192.0.2.1"));
             CHECK(p.tmpl->dst == ip("192.0.2.2"));
             CHECK(p.tmpl->spi == 0x1000);
             CHECK(p.tmpl->reqid == 3);
             CHECK(p.tmpl->mode == Mode::Tunnel);
         }},
        {"policy add src 2001:db8::/64 dst ::/0 dir out tmpl proto esp mode transport",
         [](const PolicyConfig &p) {
             REQUIRE(p.tmpl.has_value());
             CHECK(p.tmpl->src.family == 0);
             CHECK(p.tmpl->mode == Mode::Transport);
         }},
        {"policy add dir out dst 10.0.0.0/8",
         [](const PolicyConfig &p) { CHECK(p.sel.src == pfx("0.0.0.0/0")); }},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out tmpl src 2001:db8::1 dst 2001:db8::2 "
         "mode tunnel",
         [](const PolicyConfig &p) { CHECK(p.tmpl->dst.family == 6); }},
    };
    for (const auto &c : cases) {
        INFO(c.line);
        c.check(policy_of(c.line));
    }
}

TEST_CASE("other verbs")
{
    using V = Command::Verb;
    struct Case {
        std::string line;
        Command::Object object;
        V verb;
    };
    const Case cases[] = {
        {kHead + kGcmAlg, Command::Object::Sa, V::Add},
        {"sa update src 10.0.0.1 dst 10.0.0.2 proto esp spi 1 " + kGcmAlg, Command::Object::Sa,
         V::Update},
        {"sa del dst 10.0.0.2 proto esp spi 1", Command::Object::Sa, V::Del},
        {"sa delete src 10.0.0.1 dst 10.0.0.2 spi 1", Command::Object::Sa, V::Del},
        {"sa get dst 10.0.0.2 spi 1", Command::Object::Sa, V::Get},
        {"sa flush", Command::Object::Sa, V::Flush},
        {"state list", Command::Object::Sa, V::List},
        {"sa show", Command::Object::Sa, V::List},
        {"policy del src 10.0.0.0/8 dst 10.0.0.0/8 dir out", Command::Object::Policy, V::Del},
        {"policy get src 10.0.0.0/8 dst 10.0.0.0/8 dir out ptype main", Command::Object::Policy,
         V::Get},
        {"policy flush", Command::Object::Policy, V::Flush},
        {"policy list", Command::Object::Policy, V::List},
    };
    for (const auto &c : cases) {
        INFO(c.line);
        auto cmd = parse_line(c.line);
        INFO((cmd ? std::string() : cmd.error().message));
        REQUIRE(cmd.ok());
        CHECK(cmd->object == c.object);
        CHECK(cmd->verb == c.verb);
    }
    auto del = parse_line("sa del dst 10.0.0.2 spi 0x22");
    REQUIRE(del.ok());
    CHECK(del->sa.src.family == 0);
    CHECK(del->sa.spi == 0x22);
}

TEST_CASE("a key typed where the algorithm's name goes is not quoted back")
{
    for (const char *alg : {"'abcdefghijklmnopqrst'", "abcdefghijklmnopqrst"}) {
        INFO(alg);
        auto r = parse_line(kHead + "aead " + alg + " 128");
        REQUIRE_FALSE(r.ok());
        const std::string &m = r.error().message;
        CHECK(m.find("abcdefghijklmnopqrst") == std::string::npos);
        CHECK(m.find("unknown algorithm (a 20-character word, not shown: it may be a key)") !=
              std::string::npos);
    }
    // A name with parentheses, or a short one, is an algorithm's mistyped: shown.
    auto r = parse_line(kHead + "aead rfc4106(gcm(aes) " + kGcm128 + " 128");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("'rfc4106(gcm(aes)'") != std::string::npos);
}

TEST_CASE("invalid lines say what is wrong")
{
    const std::string sel_head = kHead + kGcmAlg + " sel ";
    struct Case {
        std::string line;
        std::string fragment;
    };
    const std::vector<Case> cases = {
        {kHead + "aead 'gcm(aes)' " + kGcm128 + " 128",
         "unknown algorithm 'gcm(aes)'; did you mean 'rfc4106(gcm(aes))'?"},
        {kHead + "aead aes-gcm " + kGcm128 + " 128", "did you mean 'rfc4106(gcm(aes))'?"},
        {kHead + "aead gmac " + kGcm128 + " 128", "did you mean 'rfc4543(gcm(aes))'?"},
        {kHead + "aead chacha20poly1305 " + kGcm256 + " 128",
         "did you mean 'rfc7539esp(chacha20,poly1305)'?"},
        {kHead + "enc aes-cbc " + kAes128 + " auth sha1 " + kHmac, "did you mean 'cbc(aes)'?"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth hmac-sha256 " + kHmac,
         "did you mean 'hmac(sha256)'?"},
        {kHead + "enc gcm(aes) " + kGcm128, "did you mean 'aead rfc4106(gcm(aes)) KEY ICV-BITS'?"},
        {kHead + "enc rfc4106(gcm(aes)) " + kGcm128, "is not an enc algorithm"},
        {kHead + "aead cbc(aes) " + kAes128 + " 128", "is not an aead algorithm"},
        {kHead + "aead rfc4309(ccm(aes)) " + kGcm128 + " 128",
         "aead algorithms are rfc4106(gcm(aes))"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth md5 " + kHmac, "unknown algorithm 'md5'"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth digest_null ''", "ESP without integrity"},
        {kHead + "aead rfc4106(gcm(aes)) " + kAes128 + " 128",
         "key is 16 bytes; it must be 20, 28 or 36 bytes"},
        {kHead + "aead rfc7539esp(chacha20,poly1305) " + kGcm128 + " 128", "it must be 36 bytes"},
        {kHead + "enc cbc(aes) " + kGcm128 + " auth sha1 " + kHmac,
         "cbc(aes) key is 20 bytes; it must be 16, 24 or 32 bytes"},
        {kHead + "enc cipher_null " + kAes128 + " auth sha1 " + kHmac, "must be empty"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth sha1 ''", "hmac(sha1) key is empty"},
        {kHead + "aead rfc4106(gcm(aes)) 0x123 128", "odd number of hex digits"},
        {kHead + "aead rfc4106(gcm(aes)) 0x" + std::string(38, 'a') + "zz 128", "not valid hex"},
        {kHead + "aead rfc4106(gcm(aes)) " + kGcm128 + " 100",
         "ICV of 100 bits is not valid; use 64, 96 or 128 bits"},
        {kHead + "aead rfc4543(gcm(aes)) " + kGcm128 + " 96", "use 128 bits"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth-trunc sha1 " + kHmac + " 92", "multiple of 8"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth-trunc sha1 " + kHmac + " 24", "from 32 to 160"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth-trunc sha1 " + kHmac + " 168",
         "out of range (0..160)"},
        {kHead + "auth sha1 " + kHmac, "auth without enc"},
        {kHead + "enc cbc(aes) " + kAes128, "cbc(aes) needs auth"},
        {kHead + "enc cipher_null ''", "ecb(cipher_null) needs auth"},
        {kHead + kGcmAlg + " enc cbc(aes) " + kAes128, "aead cannot be combined with enc or auth"},
        {kHead + kGcmAlg + " " + kGcmAlg, "'aead' is given twice"},
        {kHead + "enc cbc(aes) " + kAes128 + " auth sha1 " + kHmac + " auth-trunc sha1 " + kHmac +
             " 96",
         "'auth' is given twice"},
        {kHead, "no algorithm"},
        {"sa add src 10.0.0.1 dst 2001:db8::1 proto esp spi 1 " + kGcmAlg, "different families"},
        {kHead + "mode tunnel " + kGcmAlg + " sel src 10.0.0.0/8 dst ::/0", "different families"},
        {kHead + kGcmAlg + " sel src ::/0 dst ::/0", "only mode tunnel can change the family"},
        {kHead + kGcmAlg + " encap espinudp 4500 4500 ::", "encap OADDR :: is of another family"},
        {"sa add src 10.0.0.1 dst 10.0.0.300 proto esp spi 1 " + kGcmAlg,
         "dst '10.0.0.300' is not an IPv4 or IPv6 address"},
        {"sa add src 10.0.0.0/24 dst 10.0.0.1 proto esp spi 1 " + kGcmAlg,
         "src takes an address, not a prefix"},
        {sel_head + "src 10.0.0.0/33 dst 10.0.0.0/8", "src '10.0.0.0/33' is not a prefix"},
        {sel_head + "src 10.0.0.0/8 dst bogus/8", "dst 'bogus/8' is not a prefix"},
        {sel_head + "src 10.0.0.0/8 dst 10.0.0.0/8 sport 80", "sport/dport need proto tcp"},
        {sel_head + "src 10.0.0.0/8 dst 10.0.0.0/8 proto icmp dport 80", "(not icmp)"},
        {sel_head + "src 10.0.0.0/8 proto tcp sport 70000", "out of range (0..65535)"},
        {sel_head + "src 10.0.0.0/8 proto frob", "proto 'frob' is neither a number"},
        {sel_head + "proto tcp", "needs src PREFIX and dst PREFIX"},
        {sel_head + "src 10.0.0.0/8 proto icmp type 8", "ICMP type/code"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto esp " + kGcmAlg, "missing spi SPI"},
        {"sa add dst 10.0.0.2 proto esp spi 1 " + kGcmAlg, "missing src ADDR"},
        {"sa add src 10.0.0.2 proto esp spi 1 " + kGcmAlg, "missing dst ADDR"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto esp spi 0 " + kGcmAlg, "spi 0 is reserved"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto esp spi 0x100000000 " + kGcmAlg, "out of range"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto esp spi 12ab " + kGcmAlg,
         "spi '12ab' is not a number"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto esp spi 010 " + kGcmAlg, "leading zero"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto esp spi", "'spi' needs a number"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto ah spi 1 " + kGcmAlg, "proto ah is not supported"},
        {"sa add src 10.0.0.1 dst 10.0.0.2 proto udp spi 1 " + kGcmAlg,
         "unknown proto 'udp'; use proto esp"},
        {kHead + kGcmAlg + " replay-window 4097", "replay-window '4097' is out of range (0..4096)"},
        {kHead + kGcmAlg + " flag esn", "flag esn needs replay-window greater than 0"},
        {kHead + kGcmAlg + " replay-seq-hi 1", "need flag esn"},
        {kHead + kGcmAlg + " replay-oseq-hi 1 replay-window 32", "need flag esn"},
        {kHead + kGcmAlg + " flag noecn", "flag 'noecn' is not supported; the only flag is esn"},
        {kHead + kGcmAlg + " flag bogus", "unknown flag 'bogus'"},
        {kHead + kGcmAlg + " encap espinudp-nonike 4500 4500 0.0.0.0", "espinudp-nonike"},
        {kHead + kGcmAlg + " encap espintcp 4500 4500 0.0.0.0", "RFC 8229"},
        {kHead + kGcmAlg + " encap espinudp 4500", "'encap DPORT' needs a number"},
        {kHead + kGcmAlg + " limit time-soft 61 limit time-hard 60",
         "time-soft is above time-hard"},
        {kHead + kGcmAlg + " limit time-use-soft 9 limit time-use-hard 8",
         "time-use-soft is above time-use-hard"},
        {kHead + kGcmAlg + " limit time-hard -1", "limit time-hard"},
        {kHead + kGcmAlg + " limit byte-soft 10 limit byte-soft 20",
         "'limit byte-soft' is given twice"},
        {kHead + kGcmAlg + " limit bytes 10", "is not one of byte-soft"},
        {kHead + kGcmAlg + " limit packet-soft 10 limit packet-hard 5",
         "packet-soft is above packet-hard"},
        {kHead + kGcmAlg + " mode beet", "mode beet is not supported"},
        {kHead + kGcmAlg + " dir fwd", "dir 'fwd' is not one of in|out"},
        {kHead + kGcmAlg + " replay-windw 32",
         "unknown word 'replay-windw'; did you mean 'replay-window'?"},
        {kHead + kGcmAlg + " frobnicate", "unknown word 'frobnicate'; expected one of: src dst"},
        {kHead + kGcmAlg + " mark 7", "'mark' (an ip xfrm option) is not supported"},
        {kHead + kGcmAlg + " src 10.0.0.3", "'src' is given twice"},
        {kHead + "aead rfc4106(gcm(aes)) <hidden> 128", "keys are hidden in listings"},
        {"sa del src 10.0.0.1 spi 1", "missing dst ADDR"},
        {"sa get dst 10.0.0.1", "missing spi SPI"},
        {"sa del dst 10.0.0.1 spi 1 reqid 3", "unknown word 'reqid'"},
        {"sa flush now", "takes no arguments"},
        {"policy list all", "takes no arguments"},
        {"sa", "missing command"},
        {"sa frob", "unknown command 'frob'"},
        {"route add", "unknown object 'route'"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8", "missing dir in|out|fwd"},
        {"policy add dir out", "needs src PREFIX and dst PREFIX"},
        {"policy add src 10.0.0.0/8 dst ::/0 dir out", "different families"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir sideways",
         "dir 'sideways' is not one of in|out|fwd"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out action drop", "not one of allow|block"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out ptype sub", "ptype sub"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out index 8", "'index' is not supported"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out tmpl mode tunnel",
         "needs src ADDR and dst ADDR"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out tmpl src 1.1.1.1 dst ::1 mode tunnel",
         "tmpl src 1.1.1.1 and dst ::1 are of different families"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out tmpl proto ah",
         "proto ah is not supported"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out tmpl mode transport level use",
         "level use"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out tmpl mode transport tmpl mode transport",
         "only one tmpl"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out action block tmpl mode transport",
         "takes no tmpl"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out dir in", "'dir' is given twice"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 src 10.0.0.0/8 dir in", "'src' is given twice"},
        {"policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir in priorty 5", "did you mean 'priority'?"},
        {"policy del src 10.0.0.0/8 dst 10.0.0.0/8 dir in priority 5", "unknown word 'priority'"},
    };
    for (const auto &c : cases) {
        INFO(c.line);
        auto cmd = parse_line(c.line);
        REQUIRE_FALSE(cmd.ok());
        const std::string &msg = cmd.error().message;
        INFO(msg);
        CHECK(msg.find(c.fragment) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);
        CHECK(no_key_in(msg));
    }
}

TEST_CASE("keys stay out of messages, even when misplaced")
{
    const std::string lines[] = {
        kHead + "aead rfc4106(gcm(aes)) " + kGcm128 + " " + kGcm128,              // key as ICV
        kHead + "aead " + kGcm128 + " " + kGcm128 + " 128",                       // key as name
        kHead + "enc cbc(aes) " + kAes128 + " " + kHmac + " auth sha1 " + kHmac,  // stray key
        kHead + "enc cbc(aes) " + kGcm128 + " auth sha1 " + kHmac,                // wrong length
        kHead + "enc cbc(aes) " + kAes128 +
            " auth sha1 s3cr3t-passphrase auth sha1 s3cr3t-passphrase",
        kHead + "aead rfc4106(gcm(aes)) " + kGcm128 + " 128 spi " + kHmac,
    };
    for (const auto &line : lines) {
        INFO(line);
        auto cmd = parse_line(line);
        REQUIRE_FALSE(cmd.ok());
        INFO(cmd.error().message);
        CHECK(no_key_in(cmd.error().message));
    }
}

TEST_CASE("format_sa hides keys unless asked, and never prints them in a form that loads")
{
    SaConfig sa = sa_of(kHead + "enc cbc(aes) " + kAes128 + " auth sha256 " + kHmac);
    std::string hidden = format_sa(sa, false);
    CHECK(no_key_in(hidden));
    CHECK(hidden.find("<hidden>") != std::string::npos);
    CHECK_FALSE(parse_line(hidden).ok());
    std::string shown = format_sa(sa, true);
    CHECK(shown.find(key_digits(kAes128)) != std::string::npos);
    CHECK(no_key_in(format_sa(sa_of(kHead + kGcmAlg), false)));
    CHECK(no_key_in(
        format_sa(sa_of(kHead + "enc cipher_null '' auth sha1 s3cr3t-passphrase"), false)));
}

TEST_CASE("format then parse gives the same config")
{
    const std::vector<std::string> sas = {
        kHead + kGcmAlg,
        kHead + "reqid 9 mode tunnel aead rfc4106(gcm(aes)) " + kGcm256 +
            " 64 flag esn replay-window 128 "
            "replay-seq 1 replay-oseq 2 replay-seq-hi 3 replay-oseq-hi 4 encap espinudp 4500 4500 "
            "0.0.0.0 "
            "sel src 10.0.0.0/8 dst 10.0.0.0/8 proto udp sport 1 dport 2 limit byte-soft 5 "
            "limit packet-hard 9 limit time-soft 10 limit time-use-hard 20 dir in",
        kHead + "aead rfc4543(gcm(aes)) " + kGcm128 + " 128 dir out",
        kHead + "aead rfc7539esp(chacha20,poly1305) " + kGcm256 + " 128",
        kHead + "enc cbc(aes) " + kAes128 + " auth sha1 " + kHmac,
        kHead + "enc cbc(aes) " + kAes128 + " auth sha256 " + kHmac,
        kHead + "enc cbc(aes) " + kAes128 + " auth-trunc sha256 " + kHmac + " 96",
        kHead + "enc cbc(aes) " + kAes128 + " auth sha384 " + kHmac,
        kHead + "enc cbc(aes) " + kAes128 + " auth sha512 plain-string-key",
        kHead + "enc cipher_null '' auth sha1 s3cr3t-passphrase",
        "sa add src 2001:db8::1 dst 2001:db8::2 proto esp spi 0xffffffff mode tunnel " + kGcmAlg +
            " sel src 192.168.0.0/16 dst 0.0.0.0/0 proto 200",
    };
    for (const auto &line : sas) {
        INFO(line);
        SaConfig a = sa_of(line);
        std::string text = format_sa(a, true);
        INFO(text);
        SaConfig b = sa_of(text);
        CHECK(same_sa(a, b));
        CHECK(format_sa(b, true) == text);
    }
    const std::vector<std::string> policies = {
        "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out",
        "policy add src 10.1.0.0/16 dst 10.2.0.0/16 proto tcp sport 0 dport 22 dir in priority 4 "
        "action block",
        "policy add src 2001:db8::/32 dst ::/0 dir fwd tmpl src 10.0.0.1 dst 10.0.0.2 spi 7 reqid "
        "8 mode tunnel",
        "policy add src 10.0.0.1 dst 10.0.0.2 dir out tmpl dst 10.0.0.2 proto esp mode transport",
    };
    for (const auto &line : policies) {
        INFO(line);
        PolicyConfig a = policy_of(line);
        std::string text = format_policy(a);
        INFO(text);
        PolicyConfig b = policy_of(text);
        CHECK(same_policy(a, b));
        CHECK(format_policy(b) == text);
    }
}

TEST_CASE("apply_command: add, duplicate, update, del, get, flush")
{
    Config cfg;
    auto apply = [&](const std::string &line) {
        auto cmd = parse_line(line);
        INFO(line);
        REQUIRE(cmd.ok());
        return apply_command(cfg, *cmd);
    };
    REQUIRE(apply(kHead + kGcmAlg).ok());
    REQUIRE(cfg.sas.size() == 1);
    REQUIRE(cfg.find_sa(ip("10.0.0.2"), 0x1000) != nullptr);
    CHECK(cfg.find_sa(ip("10.0.0.2"), 0x1001) == nullptr);

    auto dup = apply(kHead + "reqid 2 " + kGcmAlg);
    REQUIRE_FALSE(dup.ok());
    CHECK(dup.error().message.find("sa add: SA dst 10.0.0.2 spi 0x00001000 already exists") == 0);
    CHECK(cfg.sas.size() == 1);
    CHECK(cfg.sas.nth(0).reqid == 0);

    REQUIRE(
        apply("sa update src 10.0.0.1 dst 10.0.0.2 proto esp spi 0x1000 reqid 2 " + kGcmAlg).ok());
    CHECK(cfg.sas.nth(0).reqid == 2);
    auto upd = apply("sa update src 10.0.0.1 dst 10.0.0.2 proto esp spi 0x2000 " + kGcmAlg);
    REQUIRE_FALSE(upd.ok());
    CHECK(upd.error().message.find("no SA dst 10.0.0.2 spi 0x00002000") != std::string::npos);

    CHECK(apply("sa get dst 10.0.0.2 spi 0x1000").ok());
    CHECK_FALSE(apply("sa get dst 10.0.0.2 spi 0x1001").ok());
    CHECK_FALSE(apply("sa del src 10.9.9.9 dst 10.0.0.2 spi 0x1000").ok());  // src must match
    auto missing = apply("sa del dst 10.0.0.3 spi 0x1000");
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message == "sa del: no SA dst 10.0.0.3 spi 0x00001000");
    REQUIRE(apply("sa del src 10.0.0.1 dst 10.0.0.2 spi 0x1000").ok());
    CHECK(cfg.sas.empty());

    const std::string pol = "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out";
    REQUIRE(apply(pol).ok());
    REQUIRE(apply("policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir in").ok());  // other dir
    auto pdup = apply(pol + " priority 5");
    REQUIRE_FALSE(pdup.ok());
    CHECK(pdup.error().message.find("already exists") != std::string::npos);
    REQUIRE(apply("policy update src 10.1.0.0/16 dst 10.2.0.0/16 dir out priority 5").ok());
    const PolicyConfig *p = cfg.find_policy(policy_of(pol).sel, Dir::Out);
    REQUIRE(p != nullptr);
    CHECK(p->priority == 5);
    CHECK_FALSE(apply("policy del src 10.1.0.0/16 dst 10.2.0.0/16 proto tcp dir out").ok());
    REQUIRE(apply("policy del src 10.1.0.0/16 dst 10.2.0.0/16 dir out").ok());
    CHECK(cfg.policies.size() == 1);

    REQUIRE(apply(kHead + kGcmAlg).ok());
    REQUIRE(apply("policy flush").ok());
    CHECK(cfg.policies.empty());
    CHECK(cfg.sas.size() == 1);
    REQUIRE(apply("sa list").ok());
    REQUIRE(apply("sa flush").ok());
    CHECK(cfg.sas.empty());
}

TEST_CASE("load_batch is all or nothing and names the line")
{
    Config base;
    auto first = load_batch("policy add src 10.0.0.0/8 dst 10.0.0.0/8 dir out\n", "base.conf");
    REQUIRE(first.ok());
    base = *first;

    const std::string text = "# three lines, the third bad\n" + kHead + kGcmAlg +
                             "\nsa add src 10.0.0.1 dst 10.0.0.2 proto esp spi 1 aead gcm(aes) " +
                             kGcm128 + " 128\n";
    auto r = load_batch(text, "gw.conf", base);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.rfind("gw.conf:3: sa add: unknown algorithm 'gcm(aes)'", 0) == 0);
    CHECK(no_key_in(r.error().message));
    CHECK(base.sas.empty());
    CHECK(base.policies.size() == 1);

    auto applied_error =
        load_batch(kHead + kGcmAlg + "\n\n" + kHead + kGcmAlg + "\n", "dup.conf", base);
    REQUIRE_FALSE(applied_error.ok());
    CHECK(applied_error.error().message.rfind("dup.conf:3: sa add: SA dst 10.0.0.2", 0) == 0);

    auto ok = load_batch(
        "  # comment\r\n" + kHead + "\\\n  " + kGcmAlg +
            " # the SA\r\n\n"
            "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir in\nsa get dst 10.0.0.2 spi 0x1000",
        "ok.conf", base);
    REQUIRE(ok.ok());
    CHECK(ok->sas.size() == 1);
    CHECK(ok->policies.size() == 2);

    auto after_continuation =
        load_batch("sa flush\n" + kHead + "\\\n" + kGcmAlg + "\nbogus\n", "c.conf");
    REQUIRE_FALSE(after_continuation.ok());
    CHECK(after_continuation.error().message.rfind("c.conf:4: unknown object 'bogus'", 0) == 0);

    auto quote = load_batch("sa flush\nsa add 'src\n", "q.conf");
    REQUIRE_FALSE(quote.ok());
    CHECK(quote.error().message.rfind("q.conf:2: unterminated single quote", 0) == 0);

    auto dangling = load_batch("sa flush \\", "d.conf");
    REQUIRE_FALSE(dangling.ok());
    CHECK(dangling.error().message.rfind("d.conf:1:", 0) == 0);
}

TEST_CASE("to_batch loads back into the same Config")
{
    auto cfg =
        load_batch(kHead + kGcmAlg + "\n" + "sa add src 10.0.0.2 dst 10.0.0.1 spi 0x1001 enc aes " +
                       kAes128 + " auth sha1 " + kHmac + " flag esn replay-window 32\n" +
                       "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out tmpl src 10.0.0.1 "
                       "dst 10.0.0.2 mode tunnel\n",
                   "a.conf");
    REQUIRE(cfg.ok());
    auto again = load_batch(to_batch(*cfg, true), "b.conf");
    REQUIRE(again.ok());
    CHECK(*again == *cfg);
    std::string hidden = to_batch(*cfg, false);
    CHECK(no_key_in(hidden));
    CHECK_FALSE(load_batch(hidden, "hidden.conf").ok());
}

TEST_CASE("a batch of many lines, read in pieces, is the batch read line by line")
{
    // About 30,000 lines (several pieces): SAs, policies, comments, continued lines, an
    // update and a delete that reach back to earlier lines.
    std::string text;
    Config one_by_one;
    std::vector<std::string> lines;
    for (uint32_t i = 0; i < 10000; i++) {
        char sa[300], pol[200];
        std::snprintf(sa, sizeof sa,
                      "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x%x reqid %u mode "
                      "tunnel aead 'rfc4106(gcm(aes))' 0x%032x%08x 128",
                      0x10000 + i, i + 1, i * 7919 + 3, i);
        std::snprintf(pol, sizeof pol,
                      "policy add src 10.%u.%u.0/24 dst 10.200.%u.0/24 dir out tmpl src "
                      "192.0.2.1 dst 192.0.2.2 proto esp reqid %u mode tunnel",
                      1 + i / 256, i % 256, i % 256, i + 1);
        lines.push_back(sa);
        lines.push_back(pol);
        lines.push_back(i % 3 ? "# tunnel " + std::to_string(i) : "");
        if (i % 1000 == 999)
            lines.push_back(std::string("sa update src 192.0.2.1 dst 192.0.2.2 proto esp spi ") +
                            "0x10005 reqid 6 mode tunnel \\\r\naead 'rfc4106(gcm(aes))' " +
                            "0x000102030405060708090a0b0c0d0e0f10111213 128 replay-oseq " +
                            std::to_string(i));
        if (i == 5000)
            lines.push_back("policy del src 10.1.7.0/24 dst 10.200.7.0/24 dir out");
    }
    for (const std::string &l : lines) {
        text += l + "\n";
        auto cfg = load_batch(l, "one", one_by_one);
        REQUIRE(cfg);
        one_by_one = std::move(*cfg);
    }
    REQUIRE(text.size() > (size_t(1) << 21));
    auto whole = load_batch(text, "many.conf");
    REQUIRE(whole);
    CHECK(*whole == one_by_one);
    CHECK(whole->sas.size() == 10000);
    CHECK(whole->policies.size() == 9999);

    // The first error in line order is the one reported, whatever piece it falls in: a
    // duplicate at line 20001 before a bad line at 25001; a bad line alone.
    std::string dup = text, bad = text;
    size_t at = 0;
    for (int n = 0; n < 20000; n++)
        at = text.find('\n', at) + 1;
    auto line_count = [](const std::string &t, size_t upto) {
        return size_t(std::count(t.begin(), t.begin() + std::ptrdiff_t(upto), '\n')) + 1;
    };
    size_t dup_line = line_count(text, at);
    dup.insert(at, lines[0] + "\n");
    size_t at2 = at;
    for (int n = 0; n < 5000; n++)
        at2 = dup.find('\n', at2) + 1;
    size_t bad_line = line_count(dup, at2);
    dup.insert(at2, "bogus line\n");
    auto r = load_batch(dup, "many.conf");
    REQUIRE_FALSE(r);
    CHECK(r.error().message.rfind("many.conf:" + std::to_string(dup_line) + ": sa add: SA dst",
                                  0) == 0);
    bad.insert(at, "bogus line\n");
    r = load_batch(bad, "many.conf");
    REQUIRE_FALSE(r);
    CHECK(r.error().message == "many.conf:" + std::to_string(dup_line) +
                                   ": unknown object 'bogus'; expected sa or policy");
    CHECK(bad_line > dup_line);
}
