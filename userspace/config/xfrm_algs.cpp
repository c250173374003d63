// The "did you mean" for the algorithm names people write instead of those of the table
// (gcm(aes), aes-gcm, hmac-sha256...).
#include "userspace/config/xfrm_algs.h"

#include "userspace/config/xfrm_words.h"

namespace xesp {

namespace xfrm {

namespace {

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
    case Kind::Aead:
        return "aead " + n + " KEY ICV-BITS";
    case Kind::Enc:
        return "enc " + n + " KEY auth ALGO KEY";
    case Kind::Auth:
        break;
    }
    return "enc ALGO KEY auth " + n + " KEY";
}

}  // namespace

std::string unknown_alg(Kind wanted, std::string_view name)
{
    if (const AlgInfo *a = find_alg(name))  // a known name in the wrong place
        return shown(name) + " is not an " + std::string(kind_word(wanted)) +
               " algorithm; did you mean '" + usage_of(*a) + "'?";
    // A name that is no algorithm's may be a key, typed where the name goes (`aead KEY 128`):
    // an algorithm's name is short or has parentheses; a long word without them is not shown.
    const std::string seen =
        name.size() > 12 && name.find('(') == std::string_view::npos
            ? "(a " + std::to_string(name.size()) + "-character word, not shown: it may be a key)"
            : shown(name);
    if (wanted == Kind::Auth && name.find("null") != std::string_view::npos)
        return "auth " + seen +
               " gives no integrity, and ESP without integrity is not "
               "offered; use one of " +
               names_of(Kind::Auth);
    const AlgInfo *g = guess_alg(name, wanted);
    if (g && g->kind == wanted)
        return "unknown algorithm " + seen + "; did you mean '" + std::string(g->name) + "'?";
    if (g)
        return "unknown " + std::string(kind_word(wanted)) + " algorithm " + seen +
               "; did you mean '" + usage_of(*g) + "'?";
    return "unknown algorithm " + seen + "; " + std::string(kind_word(wanted)) +
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

}  // namespace xfrm

}  // namespace xesp
