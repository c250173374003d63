// libFuzzer target for the control protocol: each line of the input is a request line, served
// in order by answer_request() (as ControlServer does for one connection) against a
// ConfigHandler that starts from the same configuration every time. Checks, per request:
//   - the answer is one line of JSON, {"ok": true, "output": S} or {"ok": false, "error": S}
//     with a one-line, non-empty S, and says what *ok says;
//   - a refused request changes nothing;
//   - an accepted change survives what a daemon does with it: to_batch(true) (the state and
//     database files) loads back into the same configuration;
//   - keys stay out of the answer unless the request asked for them or carried them.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "userspace/config/config.h"
#include "userspace/control/control.h"
#include "userspace/control/control_text.h"

using namespace xesp;

namespace {

[[noreturn]] void fail(const char *what, std::string_view line, std::string_view answer)
{
    std::fprintf(stderr, "fuzz_control: %s\n  request: %.*s\n  answer:  %.*s\n", what,
                 int(line.size()), line.data(), int(answer.size()), answer.data());
    std::abort();
}

// The configuration every input starts from: an SA of each kind of key, a policy of each kind.
const char kInitial[] =
    "sa add src 192.0.2.1 dst 192.0.2.2 proto esp spi 0x1000 reqid 1 mode tunnel "
    "aead 'rfc4106(gcm(aes))' 0x5ec2e7c0ffee5ec2e7c0ffee5ec2e7c0a1b2c3d4 128\n"
    "sa add src 2001:db8::2 dst 2001:db8::1 proto esp spi 0x2000 reqid 2 mode transport "
    "enc 'cbc(aes)' 0x00112233445566778899aabbccddeeff "
    "auth-trunc 'hmac(sha256)' 0x0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0 "
    "128 flag esn replay-window 64\n"
    "policy add src 10.1.0.0/16 dst 10.2.0.0/16 dir out "
    "tmpl src 192.0.2.1 dst 192.0.2.2 proto esp reqid 1 mode tunnel\n"
    "policy add src 10.3.0.0/16 dst 10.2.0.0/16 dir out action block\n";

const Config &initial()
{
    static const Config cfg = [] {
        auto c = load_batch(kInitial, "initial");
        if (!c) {
            std::fprintf(stderr, "fuzz_control: %s\n", c.error().message.c_str());
            std::abort();
        }
        return *c;
    }();
    return cfg;
}

std::string hex(const KeyBytes &k)
{
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < k.size(); i++) {
        out += digits[k.data()[i] >> 4];
        out += digits[k.data()[i] & 15];
    }
    return out;
}

std::string lower(std::string s)
{
    for (char &c : s)
        if (c >= 'A' && c <= 'Z')
            c = char(c - 'A' + 'a');
    return s;
}

// Checks every configuration it is asked to install, then installs it.
class CheckingHandler : public ConfigHandler {
public:
    using ConfigHandler::ConfigHandler;

protected:
    Result<void> commit(const ConfigChange &change) override
    {
        Config next = config();
        apply_change(next, change);
        auto again = load_batch(to_batch(next, true), "again");
        if (!again)
            fail(("an accepted configuration does not load back: " + again.error().message).c_str(),
                 "", to_batch(next, false));
        if (!(*again == next))
            fail("an accepted configuration changes through to_batch -> load_batch", "",
                 to_batch(next, false));
        auto done = ConfigHandler::commit(change);
        if (!(config() == next))
            fail("a change makes another configuration than it says", "", to_batch(next, false));
        return done;
    }
};

// What the request asked for and carried, as far as keys go.
struct RequestView {
    bool show_keys = false;
    std::string strings;  // every string in it, lower case
};

RequestView view_of(std::string_view line)
{
    RequestView v;
    auto req = control_text::parse_message(line);
    if (!req)
        return v;
    if (req->is_object()) {
        auto it = req->find("show_keys");
        v.show_keys = it != req->end() && it->is_boolean() && it->get<bool>();
    }
    std::vector<const nlohmann::json *> todo{&*req};
    while (!todo.empty()) {
        const nlohmann::json *j = todo.back();
        todo.pop_back();
        if (j->is_string())
            v.strings += lower(j->get<std::string>()) + "\n";
        else if (j->is_structured())
            for (const auto &item : *j)
                todo.push_back(&item);
    }
    return v;
}

void check_answer(std::string_view line, const std::string &answer, bool ok, const Config &before,
                  const Config &after)
{
    if (answer.empty() || answer.back() != '\n' || answer.find('\n') != answer.size() - 1)
        fail("the answer is not one line", line, answer);
    auto j = nlohmann::json::parse(answer, nullptr, false);
    if (!j.is_object() || !j.contains("ok") || !j["ok"].is_boolean())
        fail("the answer is not {\"ok\": ...}", line, answer);
    if (j["ok"].get<bool>() != ok)
        fail("the answer does not say what ok says", line, answer);
    if (ok && !(j.contains("output") && j["output"].is_string()))
        fail("an ok answer without output", line, answer);
    if (!ok) {
        if (!j.contains("error") || !j["error"].is_string())
            fail("an error answer without error", line, answer);
        const std::string &e = j["error"].get_ref<const std::string &>();
        if (e.empty() || e.find('\n') != std::string::npos)
            fail("the error is not one line", line, answer);
        if (!(after == before))
            fail("a refused request changed the configuration", line, answer);
    }
    RequestView req = view_of(line);
    if (req.show_keys)
        return;
    for (const Config *cfg : {&before, &after})
        for (const auto &sa : cfg->sas)
            for (const KeyBytes *k : {&sa.xf.enc_key, &sa.xf.auth_key}) {
                std::string h = hex(*k);
                if (k->size() >= 8 && answer.find(h) != std::string::npos &&
                    req.strings.find(h) == std::string::npos)
                    fail("a key in an answer that did not ask for keys", line, answer);
            }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    CheckingHandler handler(initial());
    std::string_view in(reinterpret_cast<const char *>(data), size);
    while (!in.empty()) {
        size_t nl = in.find('\n');
        std::string_view line = in.substr(0, nl);
        in.remove_prefix(nl == std::string_view::npos ? in.size() : nl + 1);
        if (!line.empty() && line.back() == '\r')
            line.remove_suffix(1);
        if (line.find_first_not_of(" \t") == std::string_view::npos)
            continue;
        Config before = handler.config();
        bool ok = false;
        std::string answer = answer_request(handler, line, &ok);
        check_answer(line, answer, ok, before, handler.config());
    }
    return 0;
}
