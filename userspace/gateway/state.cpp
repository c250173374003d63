#include "userspace/gateway/state.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "userspace/base/private_file.h"
#include "userspace/base/sys_util.h"
#include "userspace/base/wiped.h"
#include "userspace/config/xfrm_grammar.h"
#include "userspace/config/xfrm_selector.h"
#include "userspace/config/xfrm_words.h"
#include "userspace/control/control_text.h"

namespace xesp {

namespace {

void copy_sequence(SaConfig &to, const SaConfig &from)
{
    to.seq = from.seq;
    to.seq_hi = from.seq_hi;
    to.oseq = from.oseq;
    to.oseq_hi = from.oseq_hi;
}

bool unhex(const std::string &hex, std::vector<uint8_t> &out)
{
    if (hex.size() % 2)
        return false;
    for (size_t i = 0; i < hex.size(); i += 2) {
        char *end = nullptr;
        std::string byte = hex.substr(i, 2);
        unsigned long v = std::strtoul(byte.c_str(), &end, 16);
        if (end != byte.c_str() + 2)
            return false;
        out.push_back(uint8_t(v));
    }
    return true;
}

std::string hex_of(const uint8_t *p, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(2 * n);
    for (size_t i = 0; i < n; i++) {
        s += digits[p[i] >> 4];
        s += digits[p[i] & 15];
    }
    return s;
}

// The ledger and the replay windows; absent from files older than them.
Result<void> load_sequences(const nlohmann::json &j, GatewayState &st)
{
    if (auto seqs = j.find("sequences"); seqs != j.end()) {
        if (!seqs->is_object() || !seqs->contains("secret") || !(*seqs)["secret"].is_string() ||
            !st.ledger.set_secret_hex((*seqs)["secret"].get<std::string>()))
            return make_error("\"sequences\" needs \"secret\", 64 hex digits");
        if (auto round = seqs->find("round"); round != seqs->end()) {
            if (!round->is_number_unsigned())
                return make_error("\"sequences.round\" must be a number");
            st.ledger.set_round(round->get<uint64_t>());
        }
        if (auto used = seqs->find("used"); used != seqs->end()) {
            if (!used->is_object())
                return make_error("\"sequences.used\" must be an object");
            for (const auto &[fp, r] : used->items())
                if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() ||
                    !r[1].is_number_unsigned() ||
                    !st.ledger.add_record_hex(fp, r[0].get<uint64_t>(), r[1].get<uint64_t>()))
                    return make_error("\"sequences.used\": a record needs a 64-hex-digit key "
                                      "fingerprint and [highest number, round]");
        }
    }
    if (auto rep = j.find("replay"); rep != j.end()) {
        if (!rep->is_array())
            return make_error("\"replay\" must be an array");
        for (const auto &r : *rep) {
            SavedReplay s;
            auto dst = r.is_object() && r.contains("dst") && r["dst"].is_string()
                           ? IpAddr::parse(r["dst"].get<std::string>())
                           : std::nullopt;
            if (!dst || !r.contains("spi") || !r["spi"].is_number_unsigned() ||
                !r.contains("top") || !r["top"].is_number_unsigned() || !r.contains("seen") ||
                !r["seen"].is_string() || r["seen"].get_ref<const std::string &>().size() % 2)
                return make_error("a replay entry needs dst, spi, top and seen (hex)");
            s.dst = *dst;
            s.spi = r["spi"].get<uint32_t>();
            s.window.top = r["top"].get<uint64_t>();
            if (!unhex(r["seen"].get_ref<const std::string &>(), s.window.seen))
                return make_error("a replay entry's seen is not hex");
            st.replay.push_back(std::move(s));
        }
    }
    return {};
}

Result<Command> parse_line(const std::string &line)
{
    auto words = split_words(line);
    if (!words)
        return words.error();
    auto cmd = parse_command(*words);
    for (auto &w : *words)
        wipe(w);
    return cmd;
}

Result<void> load_journal(const std::string &path, GatewayState &st)
{
    std::ifstream in(path, std::ios::binary);
    if (!in)
        return {};  // none: the file is whole
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t pos = 0, lineno = 0;
    Result<void> out;
    WindowIndex windows;
    for (size_t i = 0; i < st.replay.size(); i++)
        windows[SaKey{st.replay[i].dst, st.replay[i].spi}] = i;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        lineno++;
        if (nl == std::string::npos)
            break;  // cut short by a crash: never acknowledged
        auto r = apply_journal_line(std::string_view(text).substr(pos, nl - pos), st, &windows);
        if (!r) {
            out = make_error(path + ":" + std::to_string(lineno) + ": " + r.error().message);
            break;
        }
        pos = nl + 1;
    }
    wipe(text);
    return out;
}

}  // namespace

std::string journal_path(const std::string &state_path)
{
    return state_path + ".journal";
}

std::string format_journal_entry(const JournalEntry &e)
{
    nlohmann::json j = nlohmann::json::object();
    j["gen"] = e.generation;
    auto &dels = j["del_sas"] = nlohmann::json::array();
    for (const SaKey &k : e.change.del_sas)
        dels.push_back({k.dst.str(), k.spi});
    auto &pputs = j["put_policies"] = nlohmann::json::array();
    for (const PolicyConfig &p : e.change.put_policies)
        pputs.push_back(format_policy(p));
    auto &pdels = j["del_policies"] = nlohmann::json::array();
    for (const PolicyKey &k : e.change.del_policies)
        pdels.push_back("policy del " + xfrm::format_selector(k.sel) + " dir " +
                        std::string(xfrm::dir_word(k.dir)));
    auto &res = j["reserved"] = nlohmann::json::array();
    for (const auto &[k, last] : e.reserved)
        res.push_back({k.dst.str(), k.spi, last});
    auto &win = j["windows"] = nlohmann::json::array();
    for (const SavedReplay &w : e.windows)
        win.push_back(
            {w.dst.str(), w.spi, w.window.top, hex_of(w.window.seen.data(), w.window.seen.size())});
    auto &led = j["used"] = nlohmann::json::object();
    for (const auto &[fp, r] : e.ledger)
        led[hex_of(fp.data(), fp.size())] = {r.last, r.round};
    // The SAs, with their keys, are written by hand into a line that wipes what it outgrows;
    // the rest, which holds no key, by nlohmann.
    std::string line;
    line.reserve(e.change.put_sas.size() * 300 + 64);
    append_wiped(line, "{\"put_sas\":[");
    for (size_t i = 0; i < e.change.put_sas.size(); i++) {
        if (i)
            append_wiped(line, ",");
        std::string sa = format_sa(e.change.put_sas[i], true);
        control_text::append_json_string(line, sa);
        wipe(sa);
    }
    append_wiped(line, "],");
    std::string rest = j.dump();  // {"del_policies":...}
    append_wiped(line, std::string_view(rest).substr(1));
    append_wiped(line, "\n");
    return line;
}

Result<void> apply_journal_line(std::string_view line, GatewayState &st, WindowIndex *windows)
{
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    auto bad = [] { return make_error("not a journal entry"); };
    if (!j.is_object())
        return bad();
    for (const char *k : {"put_sas", "del_sas", "put_policies", "del_policies", "reserved"})
        if (!j.contains(k) || !j[k].is_array())
            return bad();
    if (!j.contains("used") || !j["used"].is_object())
        return bad();
    // Older than the file: in it. A line of a later generation was appended while the file
    // of that generation was being written, and the crash came before it was renamed.
    if (auto g = j.find("gen");
        g != j.end() && (!g->is_number_unsigned() || g->get<uint64_t>() < st.journal))
        return g->is_number_unsigned() ? Result<void>() : bad();
    Result<void> out;
    // A window saved for an SA that is gone, or back under other keys, is not its window.
    auto forget_window = [&](const SaKey &k) {
        if (windows) {
            auto at = windows->find(k);
            if (at == windows->end())
                return;
            size_t i = at->second, last = st.replay.size() - 1;
            windows->erase(at);
            if (i != last) {
                st.replay[i] = std::move(st.replay[last]);
                (*windows)[SaKey{st.replay[i].dst, st.replay[i].spi}] = i;
            }
            st.replay.pop_back();
            return;
        }
        std::erase_if(st.replay,
                      [&](const SavedReplay &r) { return r.dst == k.dst && r.spi == k.spi; });
    };
    for (const auto &d : j["del_sas"]) {
        auto dst = d.is_array() && d.size() == 2 && d[0].is_string()
                       ? IpAddr::parse(d[0].get<std::string>())
                       : std::nullopt;
        if (!dst || !d[1].is_number_unsigned())
            return bad();
        SaKey k{*dst, d[1].get<uint32_t>()};
        st.config.sas.erase(k);  // gone already: fine
        forget_window(k);
    }
    for (const auto &d : j["del_policies"]) {
        if (!d.is_string())
            return bad();
        auto cmd = parse_line(d.get<std::string>());
        if (!cmd)
            return make_error(cmd.error().message);
        st.config.policies.erase(PolicyKey{cmd->policy.sel, cmd->policy.dir});
    }
    for (auto &p : j["put_sas"]) {
        if (!p.is_string())
            return bad();
        auto cmd = parse_line(p.get_ref<std::string &>());
        wipe(p.get_ref<std::string &>());
        if (!cmd || cmd->object != Command::Object::Sa)
            return cmd ? bad() : make_error(cmd.error().message);
        const SaConfig *before = st.config.sas.find(SaKey{cmd->sa.dst, cmd->sa.spi});
        if (before && !same_keys(*before, cmd->sa))
            forget_window(SaKey{cmd->sa.dst, cmd->sa.spi});
        st.config.sas.push_back(cmd->sa);  // replaces one of the same key where it is
    }
    for (const auto &p : j["put_policies"]) {
        if (!p.is_string())
            return bad();
        auto cmd = parse_line(p.get<std::string>());
        if (!cmd || cmd->object != Command::Object::Policy)
            return cmd ? bad() : make_error(cmd.error().message);
        st.config.policies.push_back(cmd->policy);
    }
    for (const auto &r : j["reserved"]) {
        auto dst = r.is_array() && r.size() == 3 && r[0].is_string()
                       ? IpAddr::parse(r[0].get<std::string>())
                       : std::nullopt;
        if (!dst || !r[1].is_number_unsigned() || !r[2].is_number_unsigned())
            return bad();
        SaConfig *sa = st.config.sas.find(SaKey{*dst, r[1].get<uint32_t>()});
        uint64_t last = r[2].get<uint64_t>();
        if (sa && last > (uint64_t(sa->oseq_hi) << 32 | sa->oseq)) {
            sa->oseq = uint32_t(last);
            sa->oseq_hi = uint32_t(last >> 32);
        }
    }
    if (auto w = j.find("windows"); w != j.end()) {
        if (!w->is_array())
            return bad();
        for (const auto &r : *w) {
            auto dst = r.is_array() && r.size() == 4 && r[0].is_string()
                           ? IpAddr::parse(r[0].get<std::string>())
                           : std::nullopt;
            if (!dst || !r[1].is_number_unsigned() || !r[2].is_number_unsigned() ||
                !r[3].is_string())
                return bad();
            SavedReplay s{*dst, r[1].get<uint32_t>(), {}};
            s.window.top = r[2].get<uint64_t>();
            if (!unhex(r[3].get_ref<const std::string &>(), s.window.seen))
                return bad();
            SaKey key{s.dst, s.spi};
            if (SaConfig *sa = st.config.sas.find(key)) {
                sa->seq = uint32_t(s.window.top);
                sa->seq_hi = uint32_t(s.window.top >> 32);
            }
            auto at = windows ? windows->find(key) : WindowIndex::iterator();
            if (windows && at != windows->end()) {
                st.replay[at->second] = std::move(s);
                continue;
            }
            auto same = std::find_if(st.replay.begin(), st.replay.end(), [&](const SavedReplay &x) {
                return !windows && x.dst == key.dst && x.spi == key.spi;
            });
            if (same != st.replay.end()) {
                *same = std::move(s);
                continue;
            }
            if (windows)
                (*windows)[key] = st.replay.size();
            st.replay.push_back(std::move(s));
        }
    }
    for (const auto &[fp, r] : j["used"].items())
        if (!r.is_array() || r.size() != 2 || !r[0].is_number_unsigned() ||
            !r[1].is_number_unsigned() ||
            !st.ledger.add_record_hex(fp, r[0].get<uint64_t>(), r[1].get<uint64_t>()))
            return bad();
    return out;
}

Result<Journal> Journal::open(const std::string &path)
{
    Journal j;
    j.path_ = path;
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return make_error(sys_error("cannot open the state journal", path), errno);
    off_t end = ::lseek(fd, 0, SEEK_END);
    j.size_ = end > 0 ? uint64_t(end) : 0;
    ::close(fd);
    // A last line cut short by a crash is dropped, or the next entry would be glued to it.
    if (j.size_) {
        std::ifstream in(path, std::ios::binary);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        size_t keep = text.rfind('\n');
        keep = keep == std::string::npos ? 0 : keep + 1;
        wipe(text);
        if (keep != j.size_) {
            if (::truncate(path.c_str(), off_t(keep)) != 0)
                return make_error(sys_error("cannot cut the state journal", path), errno);
            j.size_ = keep;
        }
    }
    return j;
}

Result<void> Journal::append(std::string_view line)
{
    int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return make_error(sys_error("cannot open the state journal", path_), errno);
    size_t done = 0;
    Result<void> r;
    while (done < line.size()) {
        ssize_t n = ::write(fd, line.data() + done, line.size() - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = make_error(sys_error("cannot write the state journal", path_), errno);
            break;
        }
        done += size_t(n);
    }
    if (!r && done && ::ftruncate(fd, off_t(size_)) == 0)  // no half line left behind
        done = 0;
    size_ += done;
    if (r && ::fdatasync(fd) != 0) {
        r = make_error(sys_error("cannot sync the state journal", path_), errno);
        if (::ftruncate(fd, off_t(size_ - done)) == 0)  // refused: not to come back at a restart
            size_ -= done;
    }
    ::close(fd);
    return r;
}

Result<void> Journal::drop_before(uint64_t offset)
{
    if (offset >= size_)
        return reset();
    if (offset == 0)
        return {};
    std::string tail(size_ - offset, '\0');
    int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return make_error(sys_error("cannot read the state journal", path_), errno);
    size_t done = 0;
    while (done < tail.size()) {
        ssize_t n = ::pread(fd, tail.data() + done, tail.size() - done, off_t(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        done += size_t(n);
    }
    int err = errno;
    ::close(fd);
    Result<void> r;
    if (done != tail.size())
        r = make_error(sys_error("cannot read the state journal", path_), err);
    else
        r = write_private_file(path_, tail);
    wipe(tail);
    if (r)
        size_ -= offset;
    return r;
}

Result<void> Journal::reset()
{
    if (size_ == 0)
        return {};
    int fd = ::open(path_.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno != ENOENT)
        return make_error(sys_error("cannot empty the state journal", path_), errno);
    bool synced = fd < 0 || ::fdatasync(fd) == 0;
    int err = errno;
    if (fd >= 0)
        ::close(fd);
    if (!synced)
        return make_error(sys_error("cannot empty the state journal", path_), err);
    size_ = 0;
    return {};
}

Result<std::optional<GatewayState>> load_state(const std::string &path)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        if (errno == ENOENT)
            return std::optional<GatewayState>();
        return make_error(sys_error("cannot open the state file", path), errno);
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    wipe(text);
    auto bad = [&](const std::string &what) {
        return make_error("state file " + path + ": " + what +
                          "; starting without it would send sequence numbers the peers have "
                          "seen: replace every SA's keys first");
    };
    if (!j.is_object() || !j.contains("config") || !j["config"].is_string() ||
        !j.contains("ifaces") || !j["ifaces"].is_array())
        return bad("not a state file");
    GatewayState st;
    std::string &batch = j["config"].get_ref<std::string &>();
    auto cfg = load_batch(batch, path);
    wipe(batch);
    if (!cfg)
        return bad(cfg.error().message);
    st.config = std::move(*cfg);
    if (auto r = load_sequences(j, st); !r)
        return bad(r.error().message);
    for (const auto &i : j["ifaces"]) {
        if (!i.is_object() || !i.contains("name") || !i["name"].is_string() ||
            !i.contains("role") || !i["role"].is_string())
            return bad("an interface entry needs a name and a role");
        const std::string &role = i["role"].get_ref<const std::string &>();
        if (role != "public" && role != "protected")
            return bad("role " + xfrm::shown(role) + " is neither public nor protected");
        IfaceSpec spec{i["name"].get<std::string>(),
                       role == "public" ? IfaceRole::Public : IfaceRole::Protected};
        if (auto m = i.find("mode"); m != i.end()) {  // absent from older files: xdp
            if (!m->is_string() || (*m != "xdp" && *m != "tun"))
                return make_error("state file " + path + ": interface " + xfrm::shown(spec.name) +
                                  ": mode " +
                                  xfrm::shown(m->is_string() ? m->get<std::string>() : m->dump()) +
                                  " is neither xdp nor tun");
            spec.mode = *m == "tun" ? IfaceMode::Tun : IfaceMode::Xdp;
        }
        st.ifaces.push_back(std::move(spec));
    }
    if (auto rn = j.find("renamed"); rn != j.end()) {
        if (!rn->is_array())
            return make_error("state file " + path + ": renamed is not a list");
        for (const auto &r : *rn) {
            if (!r.is_object() || !r.contains("was") || !r["was"].is_string() ||
                !r.contains("ifindex") || !r["ifindex"].is_number_unsigned() ||
                r["ifindex"].get<uint64_t>() == 0 || r["ifindex"].get<uint64_t>() > INT32_MAX)
                return make_error("state file " + path +
                                  ": a renamed entry needs the name it was and an index");
            st.renamed.push_back({r["was"].get<std::string>(), r["ifindex"].get<uint32_t>()});
        }
    }
    if (j.contains("netns")) {
        if (!j["netns"].is_string())
            return bad("netns is not a string");
        st.netns = j["netns"].get<std::string>();
    }
    if (auto g = j.find("journal"); g != j.end()) {
        if (!g->is_number_unsigned())
            return bad("journal is not a number");
        st.journal = g->get<uint64_t>();
    }
    if (auto r = load_journal(journal_path(path), st); !r)
        return bad(r.error().message);
    return std::optional<GatewayState>(std::move(st));
}

namespace {

// JSON text as nlohmann::json's dump(1) writes it: members in key order, one a line, each
// level indented one more space, empty arrays and objects as [] and {}. The text holds keys:
// when it outgrows its buffer, the old one is wiped before it is freed.
class JsonText {
public:
    explicit JsonText(std::string &out) : out_(out) {}

    // A string: escaped as dump() escapes it. Bytes outside ASCII go through nlohmann, which
    // checks that they are UTF-8 (and throws, as dump() does, when they are not).
    void str(std::string_view s)
    {
        put('"');
        escape(s);
        put('"');
    }
    void num(uint64_t v)
    {
        char buf[24];
        auto r = std::to_chars(buf, buf + sizeof(buf), v);
        put(std::string_view(buf, size_t(r.ptr - buf)));
    }
    // Opens an object or array; its members follow with key() and its elements with item(),
    // and close() ends it.
    void open(char c)
    {
        put(c);
        first_.push_back(true);
    }
    void key(std::string_view k)
    {
        item();
        str(k);
        put(": ");
    }
    void item()
    {
        put(first_.back() ? "\n" : ",\n");
        first_.back() = false;
        indent();
    }
    void close(char c)
    {
        bool empty = first_.back();
        first_.pop_back();
        if (!empty) {
            put('\n');
            indent();
        }
        put(c);
    }
    void put(char c)
    {
        room(1);
        out_ += c;
    }
    void put(std::string_view s)
    {
        room(s.size());
        out_.append(s);
    }
    // The inside of a string (without its quotes), escaped: for a string written in pieces.
    void escape(std::string_view s)
    {
        for (unsigned char c : s)
            if (c >= 0x80)
                return escape_utf8(s);
        size_t from = 0;
        for (size_t i = 0; i < s.size(); i++) {
            unsigned char c = static_cast<unsigned char>(s[i]);
            if (c >= 0x20 && c != '"' && c != '\\')
                continue;
            put(s.substr(from, i - from));
            from = i + 1;
            switch (c) {
            case '"':
                put("\\\"");
                break;
            case '\\':
                put("\\\\");
                break;
            case '\b':
                put("\\b");
                break;
            case '\f':
                put("\\f");
                break;
            case '\n':
                put("\\n");
                break;
            case '\r':
                put("\\r");
                break;
            case '\t':
                put("\\t");
                break;
            default: {
                char buf[8];
                std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                put(buf);
            }
            }
        }
        put(s.substr(from));
    }

private:
    void indent()
    {
        room(first_.size());
        out_.append(first_.size(), ' ');
    }
    void room(size_t n) { reserve_wiped(out_, n); }
    void escape_utf8(std::string_view s)
    {
        nlohmann::json j = std::string(s);
        std::string quoted = j.dump();
        put(std::string_view(quoted).substr(1, quoted.size() - 2));
        wipe(quoted);
        wipe(j.get_ref<std::string &>());
    }

    std::string &out_;
    std::vector<bool> first_;
};

}  // namespace

std::string format_state(const StateView &st)
{
    std::string out;
    out.reserve(st.config.sas.size() * 300 + st.config.policies.size() * 160 +
                st.ledger.records().size() * 150 + st.replay.size() * 120 + 4096);
    JsonText j(out);
    j.open('{');
    // The configuration as one string of `sa add` and `policy add` lines (to_batch()), each
    // line escaped as it is made and wiped.
    j.key("config");
    j.put('"');
    for (const SaConfig &sa : st.config.sas) {
        std::string line = format_sa(sa, true);
        j.escape(line);
        j.escape("\n");
        wipe(line);
    }
    for (const PolicyConfig &p : st.config.policies)
        j.escape(format_policy(p) + "\n");
    j.put('"');
    j.key("ifaces");
    j.open('[');
    for (const auto &i : st.ifaces) {
        j.item();
        j.open('{');
        j.key("mode");  // the keys in the order a JSON document keeps them
        j.str(iface_mode_name(i.mode));
        j.key("name");
        j.str(i.name);
        j.key("role");
        j.str(iface_role_name(i.role));
        j.close('}');
    }
    j.close(']');
    j.key("journal");
    j.num(st.journal);
    if (st.netns) {
        j.key("netns");
        j.str(*st.netns);
    }
    if (!st.renamed.empty()) {
        j.key("renamed");
        j.open('[');
        for (const auto &r : st.renamed) {
            j.item();
            j.open('{');
            j.key("ifindex");
            j.num(r.ifindex);
            j.key("was");
            j.str(r.was);
            j.close('}');
        }
        j.close(']');
    }
    j.key("replay");
    j.open('[');
    for (const auto &r : st.replay) {
        j.item();
        j.open('{');
        j.key("dst");
        j.str(r.dst.str());
        j.key("seen");
        j.str(hex_of(r.window.seen.data(), r.window.seen.size()));
        j.key("spi");
        j.num(r.spi);
        j.key("top");
        j.num(r.window.top);
        j.close('}');
    }
    j.close(']');
    j.key("sequences");
    j.open('{');
    j.key("round");
    j.num(st.ledger.round());
    j.key("secret");
    std::string secret = st.ledger.secret_hex();
    j.str(secret);
    wipe(secret);
    // The records by fingerprint, in the order of their hex (a JSON object's keys are sorted).
    std::vector<const std::pair<const KeyFingerprint, SeqLedger::Record> *> used;
    used.reserve(st.ledger.records().size());
    for (const auto &rec : st.ledger.records())
        used.push_back(&rec);
    std::sort(used.begin(), used.end(),
              [](const auto *a, const auto *b) { return a->first < b->first; });
    j.key("used");
    j.open('{');
    for (const auto *rec : used) {
        j.key(hex_of(rec->first.data(), rec->first.size()));
        j.open('[');
        j.item();
        j.num(rec->second.last);
        j.item();
        j.num(rec->second.round);
        j.close(']');
    }
    j.close('}');
    j.close('}');
    j.key("version");
    j.num(2);
    j.close('}');
    j.put('\n');
    return out;
}

std::string format_state(const GatewayState &st)
{
    return format_state(
        StateView{st.config, st.ifaces, st.renamed, st.ledger, st.replay, st.netns, st.journal});
}

Result<void> save_state(const std::string &path, const StateView &st)
{
    std::string text = format_state(st);
    auto r = write_private_file(path, text);
    wipe(text);
    return r;
}

Result<void> save_state(const std::string &path, const GatewayState &st)
{
    return save_state(path, StateView{st.config, st.ifaces, st.renamed, st.ledger, st.replay,
                                      st.netns, st.journal});
}

Config with_saved_sequence(Config configured, const Config &saved)
{
    for (SaConfig &c : configured.sas) {
        const SaConfig *s = saved.find_sa(c.dst, c.spi);
        if (!s)
            continue;
        SaConfig probe = c;
        copy_sequence(probe, *s);
        if (same_sa(probe, *s))
            copy_sequence(c, *s);
    }
    return configured;
}

}  // namespace xesp
