// The algorithm table's lookups, and the names of transforms.
#include "userspace/esp/algs.h"

#include <string>

namespace xesp {

namespace xfrm {

unsigned digest_bits(AuthAlg a)
{
    switch (a) {
    case AuthAlg::HmacSha1:
        return 160;
    case AuthAlg::HmacSha256:
        return 256;
    case AuthAlg::HmacSha384:
        return 384;
    case AuthAlg::HmacSha512:
        return 512;
    case AuthAlg::None:
        break;
    }
    return 0;
}

const AlgInfo *find_alg(std::string_view name)
{
    for (const auto &a : kAlgs)
        if (a.name == name || (!a.alias.empty() && a.alias == name))
            return &a;
    return nullptr;
}

const AlgInfo *alg_of(Kind k, uint8_t id)
{
    for (const auto &a : kAlgs)
        if (a.kind == k && a.id == id)
            return &a;
    return nullptr;
}

}  // namespace xfrm

std::string Transform::name() const
{
    if (is_aead()) {
        const xfrm::AlgInfo *a = xfrm::alg_of(xfrm::Kind::Aead, uint8_t(aead));
        return std::string(a ? a->name : "?") + " " + std::to_string(enc_key.size() * 8) +
               "-bit key, " + std::to_string(icv_len * 8) + "-bit ICV";
    }
    if (enc == EncAlg::None && auth == AuthAlg::None)
        return "none";
    const xfrm::AlgInfo *e = xfrm::alg_of(xfrm::Kind::Enc, uint8_t(enc));
    const xfrm::AlgInfo *h = xfrm::alg_of(xfrm::Kind::Auth, uint8_t(auth));
    std::string out = std::string(e ? e->name : "none") + "+" + std::string(h ? h->name : "none");
    if (enc == EncAlg::AesCbc) {
        out += ' ';
        out += std::to_string(enc_key.size() * 8) + "-bit key,";
    }
    return out + " " + std::to_string(icv_len * 8) + "-bit ICV";
}

}  // namespace xesp
