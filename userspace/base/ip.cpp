#include "userspace/base/ip.h"

#include <arpa/inet.h>

#include <charconv>

namespace xesp {

std::optional<IpAddr> IpAddr::parse(std::string_view text)
{
    std::string s(text);
    IpAddr a;
    if (s.find(':') != std::string::npos) {
        if (inet_pton(AF_INET6, s.c_str(), a.b.data()) != 1)
            return std::nullopt;
        a.family = 6;
    } else {
        if (inet_pton(AF_INET, s.c_str(), a.b.data()) != 1)
            return std::nullopt;
        a.family = 4;
    }
    return a;
}

std::string IpAddr::str() const
{
    char buf[INET6_ADDRSTRLEN] = "";
    if (family == 4)
        inet_ntop(AF_INET, b.data(), buf, sizeof(buf));
    else if (family == 6)
        inet_ntop(AF_INET6, b.data(), buf, sizeof(buf));
    else
        return "unset";
    return buf;
}

bool Prefix::contains(const IpAddr &a) const
{
    if (a.family != addr.family)
        return false;
    unsigned full = len / 8, rest = len % 8;
    if (std::memcmp(a.b.data(), addr.b.data(), full) != 0)
        return false;
    if (rest == 0)
        return true;
    uint8_t mask = uint8_t(0xff << (8 - rest));
    return (a.b[full] & mask) == addr.b[full];
}

std::optional<Prefix> Prefix::parse(std::string_view text)
{
    auto slash = text.find('/');
    auto addr = IpAddr::parse(text.substr(0, slash));
    if (!addr)
        return std::nullopt;
    unsigned max = addr->family == 6 ? 128 : 32;
    unsigned len = max;
    if (slash != std::string_view::npos) {
        auto digits = text.substr(slash + 1);
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), len);
        if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() ||
            len > max)
            return std::nullopt;
    }
    Prefix p;
    p.addr = *addr;
    p.len = uint8_t(len);
    unsigned full = len / 8, rest = len % 8;
    if (full < 16) {
        if (rest)
            p.addr.b[full] &= uint8_t(0xff << (8 - rest));
        for (unsigned i = full + (rest ? 1 : 0); i < 16; i++)
            p.addr.b[i] = 0;
    }
    return p;
}

std::string Prefix::str() const
{
    return addr.str() + "/" + std::to_string(len);
}

bool Selector::matches(const IpAddr &s, const IpAddr &d, uint8_t p, uint16_t sp, uint16_t dp) const
{
    if (!src.contains(s) || !dst.contains(d))
        return false;
    if (proto && proto != p)
        return false;
    if (sport_set && sport != sp)
        return false;
    if (dport_set && dport != dp)
        return false;
    return true;
}

}  // namespace xesp
