// Sequence numbers that never repeat under one key: the reservation an SA may not send beyond,
// the ledger that carries a key's counter over to a new SA, the replay window saved whole,
// the state file's round trip, and the guards on the file (directory, lock, O_EXCL write).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "esp_fixture.h"
#include "userspace/esp/esp.h"
#include "userspace/gateway/state.h"
#include "userspace/gateway/state_keeper.h"
#include "userspace/base/private_file.h"
#include "userspace/esp/seq_reserve.h"

using namespace xesp;
using namespace xesp::test;

namespace {

struct TempDir {
    std::string path;
    TempDir()
    {
        std::string tmpl = "/tmp/xesp-state.XXXXXX";
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
};

std::string slurp(const std::string &path)
{
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const TransformCase &gcm()
{
    return all_transforms()[0];
}

// Encrypts one packet with sa; returns its drop reason, or Drop::Count when it was sent.
Drop send_one(Sa &sa)
{
    auto bytes = udp_packet(4, "10.1.0.2", "10.2.0.2", 64);
    std::vector<uint8_t> frame(4096);
    std::memcpy(frame.data() + 256, bytes.data(), bytes.size());
    Pkt p{frame.data(), uint32_t(frame.size()), 256, uint32_t(bytes.size())};
    Pkt *pp = &p;
    esp_encap_burst(sa, &pp, 1);
    return p.verdict == Verdict::Encrypted ? Drop::Count : p.drop;
}

}  // namespace

TEST_CASE("reservation: an SA never sends beyond its bound, and counts what it holds back",
          "[state]")
{
    auto sa = Sa::create(make_sa(gcm(), Mode::Tunnel, 4), Backend::Auto);
    REQUIRE(sa);
    Sa &s = **sa;
    CHECK(send_one(s) == Drop::Count);  // unbound (xesp pcap): the space only
    s.bind_reservation(0);              // the counter stays at 1: above 0
    CHECK(s.oseq() == 1);
    CHECK(send_one(s) == Drop::OutSeqUnreserved);
    s.reserve_to(3);
    CHECK(send_one(s) == Drop::Count);
    CHECK(send_one(s) == Drop::Count);
    CHECK(s.oseq() == 3);
    CHECK(send_one(s) == Drop::OutSeqUnreserved);
    CHECK(s.oseq() == 3);
    s.reserve_to(2);  // a bound never goes down
    CHECK(s.reserved() == 3);
    CHECK_FALSE(s.seq_exhausted());
}

TEST_CASE("reservation: the SA lists itself once at its low-water mark, again after more",
          "[state]")
{
    auto sa = Sa::create(make_sa(gcm(), Mode::Tunnel, 4), Backend::Auto);
    REQUIRE(sa);
    Sa &s = **sa;
    SaNotify notify;
    s.bind_reservation(0, &notify);
    s.reserve_to(10, 5);
    uint64_t seq = 0;
    for (int i = 0; i < 4; i++)
        REQUIRE(s.next_seq(&seq));
    CHECK_FALSE(notify.wake.load());
    REQUIRE(s.next_seq(&seq));  // number 5: the low-water mark
    CHECK(notify.wake.exchange(false));
    REQUIRE(notify.asking.size() == 1);
    CHECK(notify.asking[0].key.spi == s.config().spi);
    CHECK(notify.asking[0].serial == s.serial());
    for (int i = 0; i < 5; i++)
        REQUIRE(s.next_seq(&seq));
    CHECK_FALSE(s.next_seq(&seq));  // held back at the bound: still listed once
    CHECK(seq == 10);
    CHECK(notify.asking.size() == 1);
    CHECK_FALSE(notify.wake.load());
    s.reserve_to(20, 15);  // the owner's answer: the next mark lists it again
    REQUIRE(s.next_seq(&seq));
    CHECK(seq == 11);
    for (int i = 0; i < 4; i++)
        REQUIRE(s.next_seq(&seq));
    CHECK(notify.asking.size() == 2);

    // A replay window that moves is listed once until the owner saves it.
    s.window_moved();
    s.window_moved();
    CHECK(notify.moved.size() == 1);
    s.window_saved();
    s.window_moved();
    CHECK(notify.moved.size() == 2);
}

TEST_CASE("reservation: a new SA starts where the ledger says its key stopped", "[state]")
{
    auto cfg = make_sa(gcm(), Mode::Tunnel, 4);
    cfg.oseq = 100;  // configured below what was used
    auto sa = Sa::create(cfg, Backend::Auto);
    REQUIRE(sa);
    (*sa)->bind_reservation(5000);
    CHECK((*sa)->oseq() == 5000);
    (*sa)->reserve_to(5001);
    uint64_t seq = 0;
    REQUIRE((*sa)->next_seq(&seq));
    CHECK(seq == 5001);
    (*sa)->bind_reservation(10);  // configured above the record: kept
    CHECK((*sa)->oseq() == 5001);
}

TEST_CASE("reservation: how far ahead, and when to ask for more", "[state]")
{
    ReservePolicy p;
    p.min_ahead = 1000;
    p.ahead_ns = 4'000'000'000;
    p.refill_ns = 2'000'000'000;
    struct Case {
        uint64_t oseq, rate, limit, target;
    } cases[] = {
        {0, 0, UINT32_MAX, 1000},                      // idle: the minimum
        {500, 10, UINT32_MAX, 1500},                   // slow: the minimum
        {0, 20'000'000, UINT32_MAX, 80'000'000},       // 20 Mpps: 4 s of it
        {UINT32_MAX - 10, 0, UINT32_MAX, UINT32_MAX},  // never past the space
        {UINT32_MAX, 0, UINT32_MAX, UINT32_MAX},
        {uint64_t(1) << 40, 50'000'000, UINT64_MAX, (uint64_t(1) << 40) + 200'000'000},
    };
    for (const auto &c : cases) {
        INFO("oseq " << c.oseq << " rate " << c.rate);
        CHECK(reservation_target(c.oseq, c.rate, c.limit, p) == c.target);
    }
    // The low-water mark: 2 s at the SA's rate, or half the minimum, before the bound.
    CHECK(reservation_low_water(0, 1000, 0, UINT32_MAX, p) == 500);
    CHECK(reservation_low_water(0, 1000, 400, UINT32_MAX, p) == 500);
    CHECK(reservation_low_water(0, 80'000'000, 20'000'000, UINT32_MAX, p) == 40'000'000);
    CHECK(reservation_low_water(900, 1000, 0, UINT32_MAX, p) == 950);  // less left: halfway
    CHECK(reservation_low_water(10, UINT32_MAX, 0, UINT32_MAX, p) == UINT64_MAX);  // the end
    // Under load the file is written about every (ahead - refill) = 2 s, not per packet.
    uint64_t rate = 10'000'000, t = reservation_target(0, rate, UINT64_MAX, p);
    CHECK(reservation_low_water(0, t, rate, UINT64_MAX, p) == 2 * rate);
}

TEST_CASE("ledger: one record per key and salt, the highest kept, no key stored", "[state]")
{
    SeqLedger l;
    Transform a = make_transform(gcm(), 1), b = make_transform(gcm(), 1),
              other_salt = make_transform(gcm(), 1), other_key = make_transform(gcm(), 2);
    other_salt.salt[3] ^= 1;
    b.icv_len = 8;  // same key and salt under another ICV
    CHECK(l.fingerprint(a) == l.fingerprint(b));
    CHECK(l.fingerprint(a) != l.fingerprint(other_salt));
    CHECK(l.fingerprint(a) != l.fingerprint(other_key));
    CHECK(l.floor(l.fingerprint(a)) == 0);
    l.record(l.fingerprint(a), 700);
    l.record(l.fingerprint(a), 300);
    CHECK(l.floor(l.fingerprint(b)) == 700);
    CHECK(l.floor(l.fingerprint(other_salt)) == 0);

    // Another secret, other fingerprints; the same secret read back, the same ones.
    SeqLedger fresh, copy;
    CHECK(fresh.fingerprint(a) != l.fingerprint(a));
    REQUIRE(copy.set_secret_hex(l.secret_hex()));
    CHECK(copy.fingerprint(a) == l.fingerprint(a));
    CHECK_FALSE(copy.set_secret_hex("zz"));
    CHECK_FALSE(copy.add_record_hex("00", 1, 0));
    CHECK(copy.fingerprint(a) == l.fingerprint(a));

    std::string key_hex;
    for (size_t i = 0; i < a.enc_key.size(); i++) {
        char h[3];
        std::snprintf(h, sizeof h, "%02x", a.enc_key.data()[i]);
        key_hex += h;
    }
    GatewayState st;
    st.ledger = l;
    CHECK(format_state(st).find(key_hex) == std::string::npos);
}

TEST_CASE("ledger: a fingerprint is HMAC-SHA-256 of the key material under the secret", "[state]")
{
    // State files written before keep their records: the fingerprint is the same HMAC
    // however it is computed.
    SeqLedger l;
    std::array<uint8_t, 32> secret{};
    std::string hex = l.secret_hex();
    for (size_t i = 0; i < secret.size(); i++)
        secret[i] = uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    for (const TransformCase &t : all_transforms()) {
        Transform x = make_transform(t, 7);
        std::vector<uint8_t> m;
        m.push_back(uint8_t(x.enc_key.size()));
        m.insert(m.end(), x.enc_key.data(), x.enc_key.data() + x.enc_key.size());
        m.push_back(uint8_t(x.is_aead() ? 4 : 0));
        if (x.is_aead())
            m.insert(m.end(), x.salt.begin(), x.salt.end());
        m.push_back(uint8_t(x.auth_key.size()));
        m.insert(m.end(), x.auth_key.data(), x.auth_key.data() + x.auth_key.size());
        KeyFingerprint want{};
        unsigned len = 0;
        HMAC(EVP_sha256(), secret.data(), int(secret.size()), m.data(), m.size(), want.data(),
             &len);
        CHECK(l.fingerprint(x) == want);
        SeqLedger copy = l;  // a copy, and a ledger given the secret, give the same
        CHECK(copy.fingerprint(x) == want);
        SeqLedger reread;
        REQUIRE(reread.set_secret_hex(hex));
        CHECK(reread.fingerprint(x) == want);
    }
}

TEST_CASE("ledger: keys no SA uses are forgotten oldest first, beyond a bound", "[state]")
{
    SeqLedger l;
    std::vector<KeyFingerprint> fps;
    for (uint8_t seed = 1; seed <= 5; seed++)
        fps.push_back(l.fingerprint(make_transform(gcm(), seed)));
    for (size_t i = 0; i < fps.size(); i++) {  // key i last running in round i + 1
        l.new_round();
        for (size_t k = i; k < fps.size(); k++)
            l.record(fps[k], 100 * (k + 1));
    }
    l.forget_oldest(10);  // within the bound: nothing goes
    CHECK(l.records().size() == 5);
    l.forget_oldest(3);
    CHECK(l.records().size() == 3);
    CHECK(l.floor(fps[0]) == 0);  // retired first, forgotten first
    CHECK(l.floor(fps[1]) == 0);
    CHECK(l.floor(fps[2]) == 300);
    l.forget_oldest(0);  // this round's record always stays
    CHECK(l.records().size() == 1);
    CHECK(l.floor(fps[4]) == 500);
}

TEST_CASE("ledger: sa update, delete and re-add, restart: the counter carries over", "[state]")
{
    // What the daemon does with each new SA: bound at the ledger's record for its key, the
    // record raised to each reservation it grants.
    SeqLedger ledger;
    auto cfg = make_sa(gcm(), Mode::Tunnel, 4);
    auto first = Sa::create(cfg, Backend::Auto);
    REQUIRE(first);
    KeyFingerprint fp = ledger.fingerprint(cfg.xf);
    (*first)->bind_reservation(ledger.floor(fp));
    ledger.record(fp, 64);
    (*first)->reserve_to(64);
    uint64_t last = 0;
    for (int i = 0; i < 40; i++)
        REQUIRE((*first)->next_seq(&last));
    first->reset();  // deleted (or replaced by an update)

    for (const char *how : {"update with new limits", "delete and re-add", "restart"}) {
        INFO(how);
        SaConfig again = cfg;
        again.lifetime.hard_packets = 1'000'000;
        SeqLedger &l = ledger;
        SeqLedger reread;  // a restart reads the ledger back
        if (std::string(how) == "restart") {
            REQUIRE(reread.set_secret_hex(ledger.secret_hex()));
            for (const auto &[k, v] : ledger.records())
                reread.record(k, v.last);
        }
        SeqLedger &use = std::string(how) == "restart" ? reread : l;
        auto next = Sa::create(again, Backend::Auto);
        REQUIRE(next);
        (*next)->bind_reservation(use.floor(use.fingerprint(again.xf)));
        (*next)->reserve_to((*next)->oseq() + 10);
        uint64_t seq = 0;
        REQUIRE((*next)->next_seq(&seq));
        CHECK(seq > last);
        CHECK(seq == 65);
    }
}

TEST_CASE("shared keys: two SAs with one key and salt are found", "[state]")
{
    Config c;
    c.sas.push_back(make_sa(gcm(), Mode::Tunnel, 4));
    SaConfig back = make_sa(gcm(), Mode::Tunnel, 4);
    back.spi = 0x2000;
    std::swap(back.src, back.dst);
    c.sas.push_back(back);
    SaConfig own = make_sa(gcm(), Mode::Tunnel, 4);
    own.spi = 0x3000;
    own.xf = make_transform(gcm(), 7);
    c.sas.push_back(own);
    auto twin = nonce_key_twins(c);
    CHECK(twin == std::vector<size_t>{SIZE_MAX, 0, SIZE_MAX});
    std::string w = shared_key_warnings(c);
    CHECK(w.find("warning: SA dst 192.0.2.1 spi 0x00002000 has the same key and salt as "
                 "SA dst 192.0.2.2 spi 0x00001000") == 0);
    CHECK(std::count(w.begin(), w.end(), '\n') == 1);
    CHECK(shared_key_warnings(c, &own).empty());
    c.sas.nth(1).xf.salt[0] ^= 1;  // another salt: other nonces
    CHECK(shared_key_warnings(c).empty());
}

TEST_CASE("replay window: saved whole and restored whole", "[state][replay]")
{
    std::mt19937_64 rng(7);
    for (uint32_t window : {0u, 32u, 64u, 100u, 1024u}) {
        for (bool esn : {false, true}) {
            INFO("window " << window << " esn " << esn);
            ReplayWindow w;
            uint64_t base = esn ? (uint64_t(3) << 32) - 500 : 1000;
            w.init(window, esn, base);
            for (int i = 0; i < 3000; i++) {
                uint64_t s = base + rng() % 1500;
                uint64_t full = 0;
                if (w.check(uint32_t(s), &full) == ReplayWindow::Verdict::Ok)
                    w.update(full);
            }
            ReplayWindow back;
            back.init(window, esn, 0);
            REQUIRE(back.restore(w.snapshot()));
            CHECK(back.highest() == w.highest());
            for (uint64_t s = w.highest() > 2000 ? w.highest() - 2000 : 1; s <= w.highest() + 5;
                 s++) {
                uint64_t a = 0, b = 0;
                REQUIRE(w.check(uint32_t(s), &a) == back.check(uint32_t(s), &b));
            }
            ReplayWindow other;
            other.init(window + 64, esn, 0);
            CHECK_FALSE(other.restore(w.snapshot()));
        }
    }
}

TEST_CASE("state file: sequences, ledger and replay windows read back as written", "[state]")
{
    TempDir d;
    std::string path = d.path + "/gw.state";
    GatewayState st;
    auto loaded =
        load_batch("sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1001 mode tunnel "
                   "aead 'rfc4106(gcm(aes))' 0x00112233445566778899aabbccddeeff01020304 128 "
                   "replay-window 64 replay-seq 90 replay-oseq 4096\n",
                   "t");
    REQUIRE(loaded);
    st.config = *loaded;
    st.ifaces.push_back({"eth0", IfaceRole::Public});
    st.ifaces.push_back({"eth1", IfaceRole::Protected, IfaceMode::Tun});
    st.renamed.push_back({"eth1", 7});  // eth1's device, under another name now
    KeyFingerprint fp = st.ledger.fingerprint(st.config.sas.nth(0).xf);
    st.ledger.new_round();
    st.ledger.new_round();
    st.ledger.record(fp, 4096);
    ReplayWindow w;
    w.init(64, false, 90);
    w.update(85);
    w.update(60);
    st.replay.push_back({st.config.sas.nth(0).dst, 0x1001, w.snapshot()});
    REQUIRE(save_state(path, st));

    auto back = load_state(path);
    REQUIRE(back);
    REQUIRE(*back);
    const GatewayState &b = **back;
    CHECK(b.config == st.config);
    CHECK(b.config.sas.nth(0).oseq == 4096);
    CHECK(b.ifaces == st.ifaces);
    REQUIRE(b.renamed.size() == 1);
    CHECK(b.renamed[0].was == "eth1");
    CHECK(b.renamed[0].ifindex == 7);
    CHECK(b.ledger.floor(b.ledger.fingerprint(st.config.sas.nth(0).xf)) == 4096);
    CHECK(b.ledger.round() == st.ledger.round());
    CHECK(b.ledger.records().begin()->second.round == st.ledger.records().begin()->second.round);
    REQUIRE(b.replay.size() == 1);
    CHECK(b.replay[0].spi == 0x1001);
    CHECK(b.replay[0].window.top == 90);
    CHECK(b.replay[0].window.seen == w.snapshot().seen);
    ReplayWindow r;
    r.init(64, false, 0);
    REQUIRE(r.restore(b.replay[0].window));
    uint64_t s = 0;
    CHECK(r.check(85, &s) == ReplayWindow::Verdict::Replay);
    CHECK(r.check(60, &s) == ReplayWindow::Verdict::Replay);
    CHECK(r.check(86, &s) == ReplayWindow::Verdict::Ok);

    // A file written before the ledger and the windows existed still loads.
    {
        std::ofstream old(path, std::ios::trunc);
        old << "{\"config\": \"\", \"ifaces\": []}";
    }
    auto older = load_state(path);
    REQUIRE(older);
    REQUIRE(*older);
    CHECK((*older)->replay.empty());
    CHECK((*older)->ledger.records().empty());
    CHECK((*older)->renamed.empty());

    // A renamed entry without its index, or with index 0, is refused, naming the file.
    for (const char *bad :
         {R"({"config": "", "ifaces": [], "renamed": [{"was": "eth1"}]})",
          R"({"config": "", "ifaces": [], "renamed": [{"was": "eth1", "ifindex": 0}]})",
          R"({"config": "", "ifaces": [], "renamed": {}})"}) {
        {
            std::ofstream f(path, std::ios::trunc);
            f << bad;
        }
        auto bad_load = load_state(path);
        REQUIRE_FALSE(bad_load);
        CHECK(bad_load.error().message.find(path) != std::string::npos);
    }
}

namespace {

// The state file as it was written through a JSON document: format_state() writes the same
// text directly.
std::string format_state_by_document(const GatewayState &st)
{
    auto hex = [](const uint8_t *p, size_t n) {
        std::string s;
        char h[3];
        for (size_t i = 0; i < n; i++) {
            std::snprintf(h, sizeof h, "%02x", p[i]);
            s += h;
        }
        return s;
    };
    nlohmann::json j;
    j["version"] = 2;
    j["config"] = to_batch(st.config, true);
    j["ifaces"] = nlohmann::json::array();
    for (const auto &i : st.ifaces)
        j["ifaces"].push_back({{"name", i.name},
                               {"role", iface_role_name(i.role)},
                               {"mode", iface_mode_name(i.mode)}});
    if (st.netns)
        j["netns"] = *st.netns;
    if (!st.renamed.empty()) {
        j["renamed"] = nlohmann::json::array();
        for (const auto &r : st.renamed)
            j["renamed"].push_back({{"was", r.was}, {"ifindex", r.ifindex}});
    }
    j["journal"] = st.journal;
    nlohmann::json used = nlohmann::json::object();
    for (const auto &[fp, r] : st.ledger.records())
        used[hex(fp.data(), fp.size())] = {r.last, r.round};
    j["sequences"] = {
        {"secret", st.ledger.secret_hex()}, {"round", st.ledger.round()}, {"used", used}};
    j["replay"] = nlohmann::json::array();
    for (const auto &r : st.replay)
        j["replay"].push_back({{"dst", r.dst.str()},
                               {"spi", r.spi},
                               {"top", r.window.top},
                               {"seen", hex(r.window.seen.data(), r.window.seen.size())}});
    return j.dump(1) + "\n";
}

}  // namespace

TEST_CASE("state file: its text is the JSON document's, written without building one", "[state]")
{
    GatewayState st;
    CHECK(format_state(st) == format_state_by_document(st));  // empty: [] and {}

    std::string batch;
    for (uint32_t i = 0; i < 50; i++) {
        char line[400];
        std::snprintf(line, sizeof line,
                      "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x%x reqid %u mode "
                      "tunnel aead 'rfc4106(gcm(aes))' 0x%032x%08x 128 replay-window 64 "
                      "replay-oseq %u\n"
                      "policy add src 10.1.%u.0/24 dst 10.2.%u.0/24 dir out tmpl src 192.0.2.1 "
                      "dst 192.0.2.2 proto esp reqid %u mode tunnel\n",
                      0x1000 + i, i + 1, i * 7919 + 1, i, i * 100, i, i, i + 1);
        batch += line;
    }
    auto cfg = load_batch(batch, "t");
    REQUIRE(cfg);
    st.config = *cfg;
    for (const SaConfig &c : st.config.sas)
        st.ledger.record(st.ledger.fingerprint(c.xf), uint64_t(c.oseq) << 20);
    st.ledger.new_round();
    st.ifaces = {{"eth0", IfaceRole::Public},
                 {"we\"ird\\na\tme\x01\x7f", IfaceRole::Protected},
                 {"caf\xc3\xa9", IfaceRole::Protected, IfaceMode::Tun}};
    st.netns = "blue";
    st.renamed = {{"eth1", 12}, {"we\"ird", 4294967295u}};
    st.journal = 7;
    ReplayWindow w;
    w.init(64, false, 90);
    w.update(85);
    st.replay.push_back({st.config.sas.nth(3).dst, st.config.sas.nth(3).spi, w.snapshot()});
    st.replay.push_back({st.config.sas.nth(1).dst, st.config.sas.nth(1).spi, w.snapshot()});
    CHECK(format_state(st) == format_state_by_document(st));

    st.netns.reset();
    st.ifaces.push_back({"bad\xff", IfaceRole::Public});  // not UTF-8: refused as dump() does
    CHECK_THROWS(format_state(st));
}

TEST_CASE("state journal: changes and reservations on top of the file, a torn last line ignored",
          "[state][journal]")
{
    TempDir d;
    std::string path = d.path + "/gw.state";
    GatewayState st;
    auto base = load_batch(
        "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1001 mode tunnel reqid 1 "
        "aead 'rfc4106(gcm(aes))' 0x00112233445566778899aabbccddeeff01020304 128 "
        "replay-oseq 4096\n"
        "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1002 mode tunnel reqid 2 "
        "aead 'rfc4106(gcm(aes))' 0x00112233445566778899aabbccddeeff01020305 128\n"
        "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out tmpl src 192.0.2.1 dst 192.0.2.2 "
        "proto esp reqid 1 mode tunnel\n"
        "policy add src 10.3.0.0/16 dst 10.4.0.0/16 dir out tmpl src 192.0.2.1 dst 192.0.2.2 "
        "proto esp reqid 2 mode tunnel\n",
        "t");
    REQUIRE(base);
    st.config = *base;
    REQUIRE(save_state(path, st));

    // A rekey: a new SA with the first one's reqid, the second SA and its policy gone, the
    // first policy updated; the new SA's reservation and its key's ledger record.
    auto rekey = batch_change(
        "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x2001 mode tunnel reqid 1 "
        "aead 'rfc4106(gcm(aes))' 0xffeeddccbbaa99887766554433221100a0b0c0d0 128\n"
        "sa del dst 192.0.2.2 proto esp spi 0x1002\n"
        "policy del src 10.3.0.0/16 dst 10.4.0.0/16 dir out\n"
        "policy update src 10.1.0.0/16 dst 10.2.0.0/16 dir out priority 7 tmpl src 192.0.2.1 "
        "dst 192.0.2.2 proto esp reqid 1 mode tunnel\n",
        "t", st.config);
    REQUIRE(rekey);
    JournalEntry e;
    e.change = *rekey;
    SaConfig fresh = rekey->put_sas.at(0);
    KeyFingerprint fp = st.ledger.fingerprint(fresh.xf);
    e.reserved.emplace_back(SaKey{fresh.dst, fresh.spi}, (uint64_t(1) << 32) + 5);
    e.ledger.emplace_back(fp, SeqLedger::Record{(uint64_t(1) << 32) + 5, 3});
    std::string line = format_journal_entry(e);
    CHECK(line.back() == '\n');
    CHECK(std::count(line.begin(), line.end(), '\n') == 1);

    auto expect = [&](const GatewayState &b) {
        CHECK(b.config.sas.size() == 2);
        const SaConfig *n = b.config.find_sa(fresh.dst, 0x2001);
        REQUIRE(n);
        CHECK(same_keys(*n, fresh));
        CHECK(n->oseq == 5);
        CHECK(n->oseq_hi == 1);
        CHECK(b.config.find_sa(fresh.dst, 0x1002) == nullptr);
        CHECK(b.config.policies.size() == 1);
        CHECK(b.config.policies.front().priority == 7);
        CHECK(b.ledger.floor(b.ledger.fingerprint(fresh.xf)) == (uint64_t(1) << 32) + 5);
    };
    auto append = [&](std::string_view text) {
        auto j = Journal::open(journal_path(path));
        REQUIRE(j);
        REQUIRE(j->append(text));
        return j->size();
    };
    CHECK(append(line) == line.size());
    auto back = load_state(path);
    REQUIRE(back);
    REQUIRE(*back);
    expect(**back);

    SECTION("the same entry twice (a crash between the whole write and emptying the journal)")
    {
        append(line);
        auto again = load_state(path);
        REQUIRE(again);
        expect(**again);
    }
    SECTION("a last line cut short was never acknowledged: ignored")
    {
        append(line.substr(0, line.size() / 2));
        auto torn = load_state(path);
        REQUIRE(torn);
        expect(**torn);
        // Opened again (a restart), the journal drops it: the next entry starts a line.
        auto reopened = Journal::open(journal_path(path));
        REQUIRE(reopened);
        CHECK(reopened->size() == line.size());
        REQUIRE(reopened->append(line));
        auto after = load_state(path);
        REQUIRE(after);
        expect(**after);
    }
    SECTION("a bad line before the last refuses the file")
    {
        append("{\"put_sas\": 7}\n");
        auto bad = load_state(path);
        REQUIRE_FALSE(bad);
        CHECK(bad.error().message.find(".journal:2") != std::string::npos);
    }
    SECTION("lines older than the file (a crash before the journal was emptied) are ignored")
    {
        GatewayState newer = st;
        newer.journal = 1;  // the file written after the journal's lines
        REQUIRE(save_state(path, newer));
        auto b = load_state(path);
        REQUIRE(b);
        CHECK((*b)->config.sas.size() == 2);
        CHECK((*b)->config.find_sa(fresh.dst, 0x1002) != nullptr);  // the old line not applied
        CHECK((*b)->config.find_sa(fresh.dst, 0x2001) == nullptr);
    }
    SECTION("a window saved for an SA that is then deleted does not come back")
    {
        JournalEntry w;
        ReplayWindow win;
        win.init(64, false, 90);
        w.windows.push_back({fresh.dst, 0x2001, win.snapshot()});
        JournalEntry del;
        del.change.del_sas.push_back(SaKey{fresh.dst, 0x2001});
        append(format_journal_entry(w));
        auto with = load_state(path);
        REQUIRE(with);
        CHECK((*with)->replay.size() == 1);
        append(format_journal_entry(del));
        auto without = load_state(path);
        REQUIRE(without);
        CHECK((*without)->replay.empty());
    }
    SECTION("emptied once the file is whole")
    {
        auto j = Journal::open(journal_path(path));
        REQUIRE(j);
        REQUIRE(j->reset());
        CHECK(j->size() == 0);
        auto plain = load_state(path);
        REQUIRE(plain);
        CHECK((*plain)->config.sas.size() == 2);
        CHECK((*plain)->config.find_sa(fresh.dst, 0x1002) != nullptr);
    }
}

TEST_CASE("state file: written 0600 through an O_EXCL temporary, never through a link", "[state]")
{
    TempDir d;
    std::string path = d.path + "/gw.state", victim = d.path + "/victim";
    {
        std::ofstream v(victim);
        v << "untouched";
    }
    // A link where the temporary goes (a crash left one, or someone planted it): removed,
    // not followed.
    REQUIRE(::symlink(victim.c_str(), (path + ".tmp").c_str()) == 0);
    mode_t old_mask = ::umask(0);
    auto r = write_private_file(path, "first");
    ::umask(old_mask);
    REQUIRE(r);
    CHECK(slurp(victim) == "untouched");
    CHECK(slurp(path) == "first");
    struct stat st;
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0600);
    CHECK(::access((path + ".tmp").c_str(), F_OK) != 0);
    REQUIRE(::chmod(path.c_str(), 0644) == 0);  // replaced, not rewritten: 0600 again
    REQUIRE(write_private_file(path, "second"));
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0600);
    CHECK(slurp(path) == "second");
    // Where the directory is gone, an error naming the file.
    auto bad = write_private_file(d.path + "/none/gw.state", "x");
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.find(d.path + "/none/gw.state") != std::string::npos);
}

TEST_CASE("state file: one daemon per file (a lock), in a directory no one else can write",
          "[state]")
{
    TempDir d;
    std::string path = d.path + "/gw.state";
    {
        auto first = PrivateFileLock::acquire(path);
        REQUIRE(first);
        auto second = PrivateFileLock::acquire(path);
        REQUIRE_FALSE(second);
        CHECK(second.error().message == "state file " + path +
                                            " is in use by another xesp daemon (" + path +
                                            ".lock is locked); give this one its own --state");
    }
    CHECK(PrivateFileLock::acquire(path));  // free again once the holder is gone

    REQUIRE(::chmod(d.path.c_str(), 0700) == 0);
    CHECK(check_private_dir(d.path));
    REQUIRE(::chmod(d.path.c_str(), 0755) == 0);
    CHECK(check_private_dir(d.path));  // others may read the directory, not write
    for (mode_t m : {0770, 0757, 0777, 01777}) {
        INFO("mode " << std::oct << m);
        REQUIRE(::chmod(d.path.c_str(), m) == 0);
        auto r = check_private_dir(d.path);
        REQUIRE_FALSE(r);
        CHECK(r.error().message.find("state directory " + d.path + " is writable by others") == 0);
    }
    REQUIRE(::chmod(d.path.c_str(), 0700) == 0);
    if (::geteuid() == 0) {  // only root can give a directory away
        REQUIRE(::chown(d.path.c_str(), 12345, 12345) == 0);
        auto r = check_private_dir(d.path);
        REQUIRE_FALSE(r);
        CHECK(r.error().message.find("belongs to uid 12345") != std::string::npos);
        REQUIRE(::chown(d.path.c_str(), 0, 0) == 0);
    }
    auto missing = check_private_dir(d.path + "/none");
    REQUIRE_FALSE(missing);
    CHECK(missing.error().message.find(d.path + "/none") != std::string::npos);
}

namespace {

std::string sa_add(uint32_t spi, uint32_t reqid)
{
    char key[64];
    std::snprintf(key, sizeof key, "0x00112233445566778899aabb%08x01020304", spi);
    return "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi " + std::to_string(spi) +
           " mode tunnel reqid " + std::to_string(reqid) + " aead 'rfc4106(gcm(aes))' " + key +
           " 128\n";
}

std::string sa_del(uint32_t spi)
{
    return "sa del dst 192.0.2.2 proto esp spi " + std::to_string(spi) + "\n";
}

// A journal line of generation `gen`: `text` as a change of cfg (then applied to it), and the
// reservation `last` for each SA it puts.
std::string journal_line(Config &cfg, const std::string &text, uint64_t gen, uint64_t last)
{
    auto ch = batch_change(text, "t", cfg);
    REQUIRE(ch);
    JournalEntry e;
    e.generation = gen;
    e.change = *ch;
    for (const SaConfig &c : ch->put_sas)
        e.reserved.emplace_back(SaKey{c.dst, c.spi}, last);
    apply_change(cfg, *ch);
    return format_journal_entry(e);
}

void write_text(const std::string &path, const std::string &text)
{
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
}

}  // namespace

TEST_CASE("state journal: a compaction that stops at any point loses no acknowledged change",
          "[state][journal]")
{
    // The file of generation 0, lines of generation 0 on top; a snapshot of it all is written
    // as the file of generation 1 while lines of generation 1 are appended; then the journal
    // is cut to those. Whatever point a crash stops that at, the same state comes back.
    TempDir d;
    std::string path = d.path + "/gw.state", jpath = journal_path(path);
    GatewayState st;
    auto base = load_batch(sa_add(0x1001, 1) + sa_add(0x1002, 2), "t");
    REQUIRE(base);
    st.config = *base;
    REQUIRE(save_state(path, st));
    std::string old_file = slurp(path);

    Config cfg = st.config;
    std::string before = journal_line(cfg, sa_add(0x2001, 1) + sa_del(0x1001), 0, 100);
    GatewayState snap = st;  // the compaction's snapshot
    snap.config = cfg;
    snap.journal = 1;
    std::string after = journal_line(cfg, sa_add(0x3001, 1) + sa_del(0x2001), 1, 200) +
                        journal_line(cfg, sa_add(0x3002, 2) + sa_del(0x1002), 1, 300);
    std::string new_file = format_state(snap);

    auto expect = [&] {
        auto b = load_state(path);
        REQUIRE(b);
        REQUIRE(*b);
        const Config &c = (*b)->config;
        CHECK(c.sas.size() == 2);
        CHECK(c.find_sa(IpAddr::parse("192.0.2.2").value(), 0x1001) == nullptr);
        CHECK(c.find_sa(IpAddr::parse("192.0.2.2").value(), 0x2001) == nullptr);
        const SaConfig *a = c.find_sa(IpAddr::parse("192.0.2.2").value(), 0x3001);
        const SaConfig *z = c.find_sa(IpAddr::parse("192.0.2.2").value(), 0x3002);
        REQUIRE(a);
        REQUIRE(z);
        CHECK(a->oseq == 200);  // the reservations given after the snapshot hold
        CHECK(z->oseq == 300);
    };
    SECTION("before the new file's rename: the old file, then every line")
    {
        write_text(jpath, before + after);
        expect();
    }
    SECTION("with the new file's temporary half written")
    {
        write_text(jpath, before + after);
        write_text(path + ".tmp", new_file.substr(0, new_file.size() / 2));
        expect();
    }
    SECTION("after the rename, before the journal is cut: its older lines are skipped")
    {
        write_text(path, new_file);
        write_text(jpath, before + after);
        expect();
    }
    SECTION("the journal cut to the lines after the snapshot, a temporary of it left over too")
    {
        write_text(path, new_file);
        write_text(jpath, before + after);
        auto j = Journal::open(jpath);
        REQUIRE(j);
        REQUIRE(j->drop_before(before.size()));
        CHECK(j->size() == after.size());
        CHECK(slurp(jpath) == after);
        struct stat sb {};
        REQUIRE(::stat(jpath.c_str(), &sb) == 0);
        CHECK((sb.st_mode & 0777) == 0600);
        expect();
        write_text(jpath + ".tmp", before);
        expect();
        // Appends go on after what was kept.
        std::string more = journal_line(cfg, sa_del(0x3002), 1, 0);
        REQUIRE(j->append(more));
        CHECK(slurp(jpath) == after + more);
    }
    SECTION("the old file with the new lines alone cannot happen: the cut waits for the rename")
    {
        // What the order protects against: the old file and only the lines after the
        // snapshot lose the changes in between.
        write_text(path, old_file);
        write_text(jpath, after);
        auto b = load_state(path);
        REQUIRE(b);
        CHECK((*b)->config.find_sa(IpAddr::parse("192.0.2.2").value(), 0x1001) != nullptr);
    }
}

// A private directory whose state file holds SA 1, as the keeper's journal tests start.
struct SavedOne {
    TempDir d;
    std::string path = d.path + "/gw.state", jpath = journal_path(path);
    Config cfg;
    SavedOne()
    {
        ::chmod(d.path.c_str(), 0700);
        GatewayState st;
        auto base = load_batch(sa_add(1, 1), "t");
        REQUIRE(base);
        st.config = *base;
        REQUIRE(save_state(path, st));
        cfg = st.config;
    }
};

TEST_CASE("state keeper: compactions run beside the changes, and the file and journal hold "
          "every change",
          "[state][journal]")
{
    SavedOne saved;
    const std::string &path = saved.path, &jpath = saved.jpath;
    Config &cfg = saved.cfg;
    const int kChanges = 300;
    {
        // Compacts whenever the journal holds more than 2 KiB: many times over, each while
        // the following changes are appended.
        auto k = StateKeeper::open(path, ReservePolicy{}, 2048);
        REQUIRE(k);
        (*k)->set_config(cfg);
        for (int i = 0; i < kChanges; i++) {
            uint32_t spi = 100 + i;
            std::string text = sa_add(spi, 1) + (i ? sa_del(spi - 1) : std::string());
            auto ch = batch_change(text, "t", cfg);
            REQUIRE(ch);
            REQUIRE((*k)->record_change(*ch, {}));
            apply_change(cfg, *ch);
        }
    }                                        // waits for the compaction in flight
    CHECK(slurp(jpath).size() < 64 * 1024);  // cut, again and again
    auto check = [&](const GatewayState &b) {
        CHECK(b.config.sas.size() == 2);
        CHECK(b.config.find_sa(IpAddr::parse("192.0.2.2").value(), 1) != nullptr);
        CHECK(b.config.find_sa(IpAddr::parse("192.0.2.2").value(), 100 + kChanges - 1) != nullptr);
        CHECK(b.config.find_sa(IpAddr::parse("192.0.2.2").value(), 100 + kChanges - 2) == nullptr);
    };
    auto b = load_state(path);
    REQUIRE(b);
    REQUIRE(*b);
    check(**b);
    CHECK((*b)->journal > 1);
    // A restart over it: the same state.
    auto again = StateKeeper::open(path, ReservePolicy{});
    REQUIRE(again);
    REQUIRE((*again)->loaded());
    check(*(*again)->loaded());
}

TEST_CASE("state keeper: a compaction that cannot start loses no change, and the next one runs",
          "[state][journal]")
{
    SavedOne saved;
    const std::string &path = saved.path, &jpath = saved.jpath;
    Config &cfg = saved.cfg;
    std::atomic<bool> may_start{false};
    std::atomic<int> refused{0}, started{0};
    uint32_t spi = 100;
    auto change = [&](StateKeeper &k) {
        std::string text = sa_add(spi, 1) + (spi > 100 ? sa_del(spi - 1) : std::string());
        auto ch = batch_change(text, "t", cfg);
        REQUIRE(ch);
        REQUIRE(k.record_change(*ch, {}));  // acknowledged: it must survive
        apply_change(cfg, *ch);
        spi++;
    };
    {
        auto k = StateKeeper::open(path, ReservePolicy{}, 2048);
        REQUIRE(k);
        // As std::thread when the process is out of threads (pthread_create's EAGAIN).
        (*k)->set_spawn([&](std::function<void()> body) {
            if (!may_start) {
                refused++;
                throw std::system_error(EAGAIN, std::generic_category(), "pthread_create");
            }
            started++;
            return std::thread(std::move(body));
        });
        (*k)->set_config(cfg);
        for (int i = 0; i < 100; i++)
            change(**k);
        CHECK(refused > 0);
        CHECK(started == 0);
        CHECK(slurp(jpath).size() > 2048);  // not cut: it goes on growing
        // Threads again: a compaction starts at the first change after the retry delay.
        may_start = true;
        for (int i = 0; i < 300 && started == 0; i++) {
            change(**k);
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        CHECK(started > 0);
    }  // and the keeper ends cleanly, the compaction in flight waited for
    CHECK(slurp(jpath).size() < 2048 * 4);
    auto b = load_state(path);
    REQUIRE(b);
    REQUIRE(*b);
    CHECK((*b)->config.sas.size() == 2);
    CHECK((*b)->config.find_sa(IpAddr::parse("192.0.2.2").value(), 1) != nullptr);
    CHECK((*b)->config.find_sa(IpAddr::parse("192.0.2.2").value(), spi - 1) != nullptr);
    CHECK((*b)->config.find_sa(IpAddr::parse("192.0.2.2").value(), spi - 2) == nullptr);
}

TEST_CASE("state keeper: no change is recorded before a whole file is on disk", "[state][journal]")
{
    TempDir d;
    ::chmod(d.path.c_str(), 0700);
    std::string path = d.path + "/gw.state", jpath = journal_path(path);
    Config cfg;
    auto ch = batch_change(sa_add(7, 1), "t", cfg);
    REQUIRE(ch);
    {
        // No file (the daemon's first whole write failed, as on a full disk): a journal line
        // would be thrown away at the next start, with the reservation it gave.
        auto k = StateKeeper::open(path, ReservePolicy{});
        REQUIRE(k);
        (*k)->set_config(cfg);
        auto r = (*k)->record_change(*ch, {});
        REQUIRE_FALSE(r);
        CHECK(r.error().message.find(path) != std::string::npos);
        CHECK(slurp(jpath).empty());
    }
    // With a file, the same change is recorded.
    GatewayState st;
    REQUIRE(save_state(path, st));
    auto k = StateKeeper::open(path, ReservePolicy{});
    REQUIRE(k);
    (*k)->set_config(cfg);
    REQUIRE((*k)->record_change(*ch, {}));
    CHECK_FALSE(slurp(jpath).empty());
}

TEST_CASE("state keeper: a journal without its file is emptied at start", "[state][journal]")
{
    TempDir d;
    ::chmod(d.path.c_str(), 0700);
    std::string path = d.path + "/gw.state", jpath = journal_path(path);
    Config cfg;
    write_text(jpath, journal_line(cfg, sa_add(7, 1), 1, 5));
    auto k = StateKeeper::open(path, ReservePolicy{});
    REQUIRE(k);
    CHECK_FALSE((*k)->loaded());
    CHECK(slurp(jpath).empty());
}
