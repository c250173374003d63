#include "userspace/config/config.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

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

Result<void> apply_sa(Config &cfg, const Command &cmd)
{
    using V = Command::Verb;
    std::vector<SaConfig> &sas = cfg.sas;
    const SaConfig &sa = cmd.sa;
    std::string ctx = std::string("sa ") + verb_word(cmd.verb) + ": ";
    if (cmd.verb == V::Flush) {
        sas.clear();
        return {};
    }
    if (cmd.verb == V::List)
        return {};
    const SaConfig *found = cfg.find_sa(sa.dst, sa.spi);
    std::ptrdiff_t i = found ? found - sas.data() : -1;
    // del/get may name the source too, as ip xfrm's ID does; it must then match.
    bool src_differs = cmd.verb != V::Add && cmd.verb != V::Update && sa.src.family && i >= 0 &&
                       !(sas[size_t(i)].src == sa.src);
    if (cmd.verb == V::Add) {
        if (i >= 0)
            return make_error(ctx + describe_sa(sa.dst, sa.spi) +
                              " already exists; use 'sa update' to replace it");
        sas.push_back(sa);
        return {};
    }
    if (i < 0 || src_differs)
        return make_error(ctx + "no " + describe_sa(sa.dst, sa.spi) +
                          (src_differs ? " with src " + sa.src.str() : std::string()) +
                          (cmd.verb == V::Update ? "; use 'sa add' to create it" : ""));
    if (cmd.verb == V::Update)
        sas[size_t(i)] = sa;
    else if (cmd.verb == V::Del)
        sas.erase(sas.begin() + i);
    return {};
}

Result<void> apply_policy(Config &cfg, const Command &cmd)
{
    using V = Command::Verb;
    std::vector<PolicyConfig> &policies = cfg.policies;
    const PolicyConfig &p = cmd.policy;
    std::string ctx = std::string("policy ") + verb_word(cmd.verb) + ": ";
    if (cmd.verb == V::Flush) {
        policies.clear();
        return {};
    }
    if (cmd.verb == V::List)
        return {};
    const PolicyConfig *found = cfg.find_policy(p.sel, p.dir);
    std::ptrdiff_t i = found ? found - policies.data() : -1;
    if (cmd.verb == V::Add) {
        if (i >= 0)
            return make_error(ctx + describe_policy(p.sel, p.dir) +
                              " already exists; use 'policy update' to replace it");
        policies.push_back(p);
        return {};
    }
    if (i < 0)
        return make_error(ctx + "no " + describe_policy(p.sel, p.dir) +
                          (cmd.verb == V::Update ? "; use 'policy add' to create it" : ""));
    if (cmd.verb == V::Update)
        policies[size_t(i)] = p;
    else if (cmd.verb == V::Del)
        policies.erase(policies.begin() + i);
    return {};
}

}  // namespace

Result<void> apply_command(Config &cfg, const Command &cmd)
{
    return cmd.object == Command::Object::Sa ? apply_sa(cfg, cmd) : apply_policy(cfg, cmd);
}

std::string to_batch(const Config &cfg, bool show_keys)
{
    std::string out;
    for (const auto &sa : cfg.sas)
        out += format_sa(sa, show_keys) + "\n";
    for (const auto &p : cfg.policies)
        out += format_policy(p) + "\n";
    return out;
}

Result<Config> load_batch(std::string_view text, std::string_view name, Config base)
{
    Config cfg = std::move(base);
    std::string logical;  // the line being read, joined across trailing backslashes
    size_t lineno = 0, first = 0;
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
        auto where = [&] { return std::string(name) + ":" + std::to_string(first) + ": "; };
        bool continues = false;
        auto words = split_words(logical, &continues);
        if (!words)
            return make_error(where() + words.error().message);
        if (continues) {
            logical.pop_back();
            if (pos < text.size())
                continue;
            return make_error(where() + "the last line ends with a backslash");
        }
        logical.clear();
        if (words->empty())
            continue;
        auto cmd = parse_command(*words);
        if (!cmd)
            return make_error(where() + cmd.error().message);
        auto applied = apply_command(cfg, *cmd);
        if (!applied)
            return make_error(where() + applied.error().message);
    }
    return cfg;
}

Result<Config> load_batch_file(const std::string &path, Config base)
{
    std::ifstream in(path, std::ios::binary);
    if (!in)
        return make_error("cannot open " + path + ": " + std::strerror(errno), errno);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad())
        return make_error("cannot read " + path + ": " + std::strerror(errno), errno);
    auto cfg = load_batch(text, path, std::move(base));
    OPENSSL_cleanse(text.data(), text.size());
    return cfg;
}

}  // namespace xesp
