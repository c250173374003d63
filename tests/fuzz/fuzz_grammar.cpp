// libFuzzer target for the ip xfrm grammar: any bytes as a batch file. Whatever loads must
// format back into lines that parse to the same configuration, and keys must stay out of the
// listing that hides them.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "userspace/config/config.h"
#include "userspace/config/xfrm_grammar.h"

namespace {

[[noreturn]] void fail(const char *what, const std::string &line)
{
    std::fprintf(stderr, "fuzz_grammar: %s\n  %s\n", what, line.c_str());
    std::abort();
}

std::string hex(const xesp::KeyBytes &k)
{
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < k.size(); i++) {
        out += digits[k.data()[i] >> 4];
        out += digits[k.data()[i] & 15];
    }
    return out;
}

xesp::Command reparse(const std::string &line)
{
    auto words = xesp::split_words(line);
    if (!words)
        fail(("formatted line does not split: " + words.error().message).c_str(), line);
    auto cmd = xesp::parse_command(*words);
    if (!cmd)
        fail(("formatted line does not parse: " + cmd.error().message).c_str(), line);
    return *cmd;
}

void check_sa(const xesp::SaConfig &sa)
{
    std::string line = xesp::format_sa(sa, true);
    xesp::Command cmd = reparse(line);
    if (cmd.object != xesp::Command::Object::Sa || cmd.verb != xesp::Command::Verb::Add ||
        !xesp::same_sa(cmd.sa, sa))
        fail("SA changed in format -> parse", line);
    std::string hidden = xesp::format_sa(sa, false);
    for (const auto *k : {&sa.xf.enc_key, &sa.xf.auth_key})
        if (k->size() >= 8 && hidden.find(hex(*k)) != std::string::npos)
            fail("key printed without show_keys", hidden);
}

void check_policy(const xesp::PolicyConfig &p)
{
    std::string line = xesp::format_policy(p);
    xesp::Command cmd = reparse(line);
    if (cmd.object != xesp::Command::Object::Policy || cmd.verb != xesp::Command::Verb::Add ||
        !xesp::same_policy(cmd.policy, p))
        fail("policy changed in format -> parse", line);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    std::string_view text(reinterpret_cast<const char *>(data), size);
    auto cfg = xesp::load_batch(text, "fuzz");
    if (!cfg) {
        if (cfg.error().message.rfind("fuzz:", 0) != 0)
            fail("error without its file:line", cfg.error().message);
        return 0;
    }
    for (const auto &sa : cfg->sas)
        check_sa(sa);
    for (const auto &p : cfg->policies)
        check_policy(p);
    auto again = xesp::load_batch(to_batch(*cfg, true), "again");
    if (!again)
        fail(("to_batch does not load: " + again.error().message).c_str(), to_batch(*cfg, false));
    if (!(*again == *cfg))
        fail("Config changed in to_batch -> load_batch", to_batch(*cfg, false));
    return 0;
}
