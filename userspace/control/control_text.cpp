#include "userspace/control/control_text.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <openssl/crypto.h>

namespace xesp::control_text {

// ---- Buffers that may hold keys -----------------------------------------------------------

void consume_front(std::string &buf, size_t n)
{
    size_t rest = buf.size() - n;
    std::memmove(buf.data(), buf.data() + n, rest);
    OPENSSL_cleanse(buf.data() + rest, n);
    buf.resize(rest);
}

// ---- Parsing a message ---------------------------------------------------------------------

namespace {

// A first pass over the text that builds nothing and stops at the first level too deep.
class DepthCheck final : public nlohmann::json_sax<nlohmann::json> {
public:
    bool too_deep = false;

    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t &) override { return true; }
    bool string(string_t &) override { return true; }
    bool binary(binary_t &) override { return true; }
    bool key(string_t &) override { return true; }
    bool start_object(std::size_t) override { return enter(); }
    bool end_object() override { return leave(); }
    bool start_array(std::size_t) override { return enter(); }
    bool end_array() override { return leave(); }
    bool parse_error(std::size_t, const std::string &, const nlohmann::detail::exception &) override
    {
        return false;
    }

private:
    size_t depth_ = 0;

    bool enter()
    {
        too_deep = ++depth_ > kMaxJsonDepth;
        return !too_deep;
    }
    bool leave()
    {
        depth_--;
        return true;
    }
};

}  // namespace

Result<nlohmann::json> parse_message(std::string_view line)
{
    DepthCheck check;
    bool valid = nlohmann::json::sax_parse(line, &check);
    if (check.too_deep)
        return make_error("nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (!valid)
        return make_error("not JSON");
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded())
        return make_error("not JSON");
    return j;
}

void wipe_json(nlohmann::json &j)
{
    std::vector<nlohmann::json *> todo{&j};
    while (!todo.empty()) {
        nlohmann::json *v = todo.back();
        todo.pop_back();
        if (v->is_string()) {
            wipe(v->get_ref<std::string &>());
        } else if (v->is_structured()) {
            for (auto &item : *v)
                todo.push_back(&item);
        }
    }
}

// ---- JSON text, written by hand into buffers that are wiped ------------------------------

namespace {

// The length of the UTF-8 character at s[i] (RFC 3629: no surrogates, no overlong forms), or
// 0 if the bytes there are not one.
size_t utf8_char_at(std::string_view s, size_t i)
{
    auto byte = [&](size_t k) -> unsigned {
        return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u;
    };
    unsigned c = byte(i);
    if (c < 0x80)
        return 1;
    size_t n = 0;                   // continuation bytes
    unsigned lo = 0x80, hi = 0xbf;  // the range of the first one
    if (c >= 0xc2 && c <= 0xdf)
        n = 1;
    else if (c >= 0xe0 && c <= 0xef)
        n = 2, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 3, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (byte(i + 1) < lo || byte(i + 1) > hi)
        return 0;
    for (size_t k = 2; k <= n; k++)
        if ((byte(i + k) & 0xc0) != 0x80)
            return 0;
    return n + 1;
}

}  // namespace

// A byte that is not part of a UTF-8 character (as where a message cuts a word short) becomes
// U+FFFD: the line stays JSON that the other end can parse.
void append_json_string(std::string &out, std::string_view s)
{
    static const char hex[] = "0123456789abcdef";
    append_wiped(out, "\"");
    for (size_t i = 0; i < s.size();) {
        char c = s[i];
        auto u = static_cast<unsigned char>(c);
        size_t n = 1;
        if (c == '"' || c == '\\') {
            const char esc[2] = {'\\', c};
            append_wiped(out, {esc, 2});
        } else if (u < 0x20) {
            const char esc[6] = {'\\', 'u', '0', '0', hex[u >> 4], hex[u & 15]};
            append_wiped(out, {esc, 6});
        } else if (u < 0x80) {
            append_wiped(out, {&c, 1});
        } else if ((n = utf8_char_at(s, i)) != 0) {
            append_wiped(out, s.substr(i, n));
        } else {
            append_wiped(out, "\\ufffd");
            n = 1;
        }
        i += n;
    }
    append_wiped(out, "\"");
}

size_t invalid_utf8_at(std::string_view s)
{
    for (size_t i = 0; i < s.size();) {
        size_t n = utf8_char_at(s, i);
        if (n == 0)
            return i;
        i += n;
    }
    return std::string_view::npos;
}

Result<sockaddr_un> unix_address(const std::string &path)
{
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof(addr.sun_path))
        return make_error("control socket path '" + path + "' is empty or longer than " +
                              std::to_string(sizeof(addr.sun_path) - 1) + " bytes",
                          ENAMETOOLONG);
    std::memcpy(addr.sun_path, path.data(), path.size());
    return addr;
}

}  // namespace xesp::control_text
