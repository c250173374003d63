#include "userspace/config/config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <deque>
#include <future>
#include <iterator>
#include <optional>
#include <vector>

#include "userspace/base/wiped.h"

namespace xesp {

namespace {

const char *verb_word(Command::Verb v)
{
    using V = Command::Verb;
    switch (v) {
    case V::Add:
        return "add";
    case V::Update:
        return "update";
    case V::Del:
        return "del";
    case V::Get:
        return "get";
    case V::Flush:
        return "flush";
    case V::List:
        return "list";
    }
    return "?";
}

// A configuration as a change leaves it: `base` under what the change has done so far, for
// the commands of a batch to see one another without a copy of the base.
class Overlay {
public:
    explicit Overlay(const Config &base) : base_(base) {}

    const SaConfig *find(const SaKey &k) const { return find_in(sas_, base_.sas, k); }
    const PolicyConfig *find(const PolicyKey &k) const
    {
        return find_in(policies_, base_.policies, k);
    }
    void put(const SaConfig &c) { touch(sas_, sa_order_, ConfigKeyHash()(c)).now = c; }
    void put(const PolicyConfig &p) { touch(policies_, policy_order_, ConfigKeyHash()(p)).now = p; }
    void del(const SaKey &k) { gone(touch(sas_, sa_order_, k)); }
    void del(const PolicyKey &k) { gone(touch(policies_, policy_order_, k)); }
    void flush_sas()
    {
        for (const SaConfig &c : base_.sas)
            del(ConfigKeyHash()(c));
        for (auto &[k, e] : sas_)
            gone(e);
    }
    void flush_policies()
    {
        for (const PolicyConfig &p : base_.policies)
            del(ConfigKeyHash()(p));
        for (auto &[k, e] : policies_)
            gone(e);
    }

    // The net change, entries in the order the batch first touched them. An entry deleted
    // and added again goes to the end, as it would by the commands one by one. The entries
    // move into it: the overlay is done with.
    ConfigChange change() &&
    {
        ConfigChange ch;
        ch.put_sas.reserve(sa_order_.size());
        ch.put_policies.reserve(policy_order_.size());
        for (const SaKey &k : sa_order_)
            net(sas_.at(k), base_.sas.find(k), k, ch.put_sas, ch.del_sas, same_sa);
        for (const PolicyKey &k : policy_order_)
            net(policies_.at(k), base_.policies.find(k), k, ch.put_policies, ch.del_policies,
                same_policy);
        return ch;
    }

private:
    template <typename T> struct Entry {
        std::optional<T> now;
        bool deleted = false;  // at some point: an add after it goes to the end
    };
    template <typename K, typename T> using Map = std::unordered_map<K, Entry<T>, ConfigKeyHash>;

    template <typename K, typename T, typename L>
    static const T *find_in(const Map<K, T> &m, const L &base, const K &k)
    {
        auto it = m.find(k);
        if (it != m.end())
            return it->second.now ? &*it->second.now : nullptr;
        return base.find(k);
    }
    template <typename K, typename T>
    Entry<T> &touch(Map<K, T> &m, std::vector<K> &order, const K &k)
    {
        auto [it, fresh] = m.try_emplace(k);
        if (fresh) {
            order.push_back(k);
            if (const auto *b = find_base(k))
                it->second.now = *b;
        }
        return it->second;
    }
    template <typename T> static void gone(Entry<T> &e)
    {
        e.now.reset();
        e.deleted = true;
    }
    const SaConfig *find_base(const SaKey &k) const { return base_.sas.find(k); }
    const PolicyConfig *find_base(const PolicyKey &k) const { return base_.policies.find(k); }
    template <typename K, typename T, typename Same>
    static void net(Entry<T> &e, const T *base, const K &k, std::vector<T> &puts,
                    std::vector<K> &dels, Same same)
    {
        if (base && (!e.now || e.deleted))
            dels.push_back(k);
        if (e.now && !(base && !e.deleted && same(*base, *e.now)))
            puts.push_back(std::move(*e.now));
    }

    const Config &base_;
    Map<SaKey, SaConfig> sas_;
    Map<PolicyKey, PolicyConfig> policies_;
    std::vector<SaKey> sa_order_;
    std::vector<PolicyKey> policy_order_;
};

Result<void> apply_sa(Overlay &cfg, const Command &cmd)
{
    using V = Command::Verb;
    const SaConfig &sa = cmd.sa;
    std::string ctx = std::string("sa ") + verb_word(cmd.verb) + ": ";
    if (cmd.verb == V::Flush) {
        cfg.flush_sas();
        return {};
    }
    if (cmd.verb == V::List)
        return {};
    SaKey key{sa.dst, sa.spi};
    const SaConfig *found = cfg.find(key);
    // del/get may name the source too, as ip xfrm's ID does; it must then match.
    bool src_differs = cmd.verb != V::Add && cmd.verb != V::Update && sa.src.family && found &&
                       !(found->src == sa.src);
    if (cmd.verb == V::Add) {
        if (found)
            return make_error(ctx + describe_sa(sa.dst, sa.spi) +
                              " already exists; use 'sa update' to replace it");
        cfg.put(sa);
        return {};
    }
    if (!found || src_differs)
        return make_error(ctx + "no " + describe_sa(sa.dst, sa.spi) +
                          (src_differs ? " with src " + sa.src.str() : std::string()) +
                          (cmd.verb == V::Update ? "; use 'sa add' to create it" : ""));
    if (cmd.verb == V::Update)
        cfg.put(sa);
    else if (cmd.verb == V::Del)
        cfg.del(key);
    return {};
}

Result<void> apply_policy(Overlay &cfg, const Command &cmd)
{
    using V = Command::Verb;
    const PolicyConfig &p = cmd.policy;
    std::string ctx = std::string("policy ") + verb_word(cmd.verb) + ": ";
    if (cmd.verb == V::Flush) {
        cfg.flush_policies();
        return {};
    }
    if (cmd.verb == V::List)
        return {};
    PolicyKey key{p.sel, p.dir};
    const PolicyConfig *found = cfg.find(key);
    if (cmd.verb == V::Add) {
        if (found)
            return make_error(ctx + describe_policy(p.sel, p.dir) +
                              " already exists; use 'policy update' to replace it");
        cfg.put(p);
        return {};
    }
    if (!found)
        return make_error(ctx + "no " + describe_policy(p.sel, p.dir) +
                          (cmd.verb == V::Update ? "; use 'policy add' to create it" : ""));
    if (cmd.verb == V::Update)
        cfg.put(p);
    else if (cmd.verb == V::Del)
        cfg.del(key);
    return {};
}

Result<void> apply_to(Overlay &o, const Command &cmd)
{
    return cmd.object == Command::Object::Sa ? apply_sa(o, cmd) : apply_policy(o, cmd);
}

// The commands of some lines of a batch, each with its first line, and the error that
// stopped the reading, if any.
struct ParsedLines {
    std::vector<std::pair<size_t, Command>> cmds;
    std::optional<Error> error;
};

// Lines of a batch (starting at line number first_line + 1) into commands, up to the first
// error.
ParsedLines parse_lines(std::string_view text, std::string_view name, size_t first_line)
{
    ParsedLines out;
    std::string logical;  // the line being read, joined across trailing backslashes
    size_t lineno = first_line, first = 0;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
        pos = nl == std::string_view::npos ? text.size() : nl + 1;
        lineno++;
        if (!line.empty() && line.back() == '\r')
            line.remove_suffix(1);
        if (logical.empty())
            first = lineno;
        logical += line;
        auto fail = [&](const std::string &msg) {
            out.error = make_error(std::string(name) + ":" + std::to_string(first) + ": " + msg);
            return std::move(out);
        };
        bool continues = false;
        auto words = split_words(logical, &continues);
        if (!words)
            return fail(words.error().message);
        if (continues) {
            logical.pop_back();
            if (pos < text.size())
                continue;
            return fail("the last line ends with a backslash");
        }
        logical.clear();
        if (words->empty())
            continue;
        auto cmd = parse_command(*words);
        if (!cmd)
            return fail(cmd.error().message);
        out.cmds.emplace_back(first, std::move(*cmd));
    }
    return out;
}

// Where the batch can be cut into pieces read apart: after lines that do not continue on
// the next one, about every kPieceBytes.
constexpr size_t kPieceBytes = size_t(1) << 19;

std::vector<std::pair<size_t, size_t>> pieces(std::string_view text)
{
    std::vector<std::pair<size_t, size_t>> out;
    size_t from = 0;
    while (from < text.size()) {
        size_t cut = from + kPieceBytes;
        while (cut < text.size()) {
            size_t nl = text.find('\n', cut);
            if (nl == std::string_view::npos) {
                cut = text.size();
                break;
            }
            size_t end = nl > from && text[nl - 1] == '\r' ? nl - 1 : nl;
            if (end > from && text[end - 1] != '\\') {
                cut = nl + 1;
                break;
            }
            cut = nl + 1;
        }
        cut = std::min(cut, text.size());
        out.emplace_back(from, cut);
        from = cut;
    }
    return out;
}

// The lines of a batch, one command at a time, into `on`, in order; the first error (of
// reading or of `on`) stops it. A batch of many lines (a config of 100,000 tunnels) is read
// in pieces on two threads while `on` takes the commands of the pieces already read.
template <typename F>
Result<void> each_command(std::string_view text, std::string_view name, F &&on)
{
    auto take = [&](ParsedLines &&p) -> Result<void> {
        for (auto &[line, cmd] : p.cmds)
            if (auto applied = on(cmd); !applied)
                return make_error(std::string(name) + ":" + std::to_string(line) + ": " +
                                  applied.error().message);
        if (p.error)
            return *p.error;
        return {};
    };
    auto cuts = pieces(text);
    if (cuts.size() < 4)
        return take(parse_lines(text, name, 0));
    // Line numbers: each piece starts after the newlines of those before it.
    std::vector<size_t> first_line(cuts.size(), 0);
    for (size_t i = 1; i < cuts.size(); i++) {
        auto prev = text.substr(cuts[i - 1].first, cuts[i - 1].second - cuts[i - 1].first);
        first_line[i] = first_line[i - 1] + size_t(std::count(prev.begin(), prev.end(), '\n'));
    }
    auto read = [&](size_t i) {
        return std::async(std::launch::async, [&, i] {
            ParsedLines p = parse_lines(text.substr(cuts[i].first, cuts[i].second - cuts[i].first),
                                        name, first_line[i]);
            wipe_stack();  // the keys it read; a finished thread's stack is kept for the next
            return p;
        });
    };
    // Two pieces read ahead of the one being taken.
    std::deque<std::future<ParsedLines>> ahead;
    size_t next = 0;
    Result<void> out;
    for (size_t i = 0; i < cuts.size(); i++) {
        while (next < cuts.size() && ahead.size() < 2)
            ahead.push_back(read(next++));
        ParsedLines p = ahead.front().get();
        ahead.pop_front();
        if (out = take(std::move(p)); !out)
            break;
    }
    for (auto &f : ahead)  // after an error: let those read ahead finish, unused
        f.wait();
    return out;
}

}  // namespace

Result<ConfigChange> change_of(const Config &cfg, const Command &cmd)
{
    Overlay o(cfg);
    if (auto r = apply_to(o, cmd); !r)
        return r.error();
    return std::move(o).change();
}

Result<void> apply_command(Config &cfg, const Command &cmd)
{
    auto ch = change_of(cfg, cmd);
    if (!ch)
        return ch.error();
    apply_change(cfg, *ch);
    return {};
}

Result<ConfigChange> batch_change(std::string_view text, std::string_view name, const Config &base,
                                  const CommandCheck &check)
{
    Overlay o(base);
    auto take = [&](const Command &cmd) -> Result<void> {
        if (check)
            if (auto r = check(cmd); !r)
                return r;
        return apply_to(o, cmd);
    };
    if (auto r = each_command(text, name, take); !r)
        return r.error();
    return std::move(o).change();
}

std::string to_batch(const Config &cfg, bool show_keys)
{
    std::string out;
    for (const auto &sa : cfg.sas) {
        append_secret(out, format_sa(sa, show_keys));
        append_wiped(out, "\n");
    }
    for (const auto &p : cfg.policies) {
        append_wiped(out, format_policy(p));
        append_wiped(out, "\n");
    }
    return out;
}

Result<Config> load_batch(std::string_view text, std::string_view name, Config base,
                          const CommandCheck &check)
{
    auto ch = batch_change(text, name, base, check);
    if (!ch)
        return ch.error();
    apply_change(base, std::move(*ch));
    return base;
}

Result<Config> load_batch_file(const std::string &path, Config base, const CommandCheck &check)
{
    std::ifstream in(path, std::ios::binary);
    if (!in)
        return make_error("cannot open " + path + ": " + std::strerror(errno), errno);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad())
        return make_error("cannot read " + path + ": " + std::strerror(errno), errno);
    auto cfg = load_batch(text, path, std::move(base), check);
    OPENSSL_cleanse(text.data(), text.size());
    return cfg;
}

}  // namespace xesp
