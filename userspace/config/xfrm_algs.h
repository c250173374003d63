// The ESP algorithms xesp offers, by their ip xfrm / kernel names, with their valid key and
// ICV sizes, and the advice given for a name that is not one of them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "userspace/esp/sa_config.h"

namespace xesp::xfrm {

enum class Kind : uint8_t { Aead, Enc, Auth };

struct AlgInfo {
    Kind kind;
    uint8_t id;                          // AeadAlg / EncAlg / AuthAlg
    std::string_view name;               // as ip xfrm and the kernel spell it
    std::string_view alias;              // the short name ip xfrm also accepts, if any
    std::array<uint16_t, 3> key_bytes;   // valid key sizes (0 = end of list, except for NULL)
    std::array<uint16_t, 3> icv_bits;    // aead: allowed ICV bits; auth: {ICV bits of `auth`}
};

// Digest bits of an HMAC: the longest auth-trunc.
unsigned digest_bits(AuthAlg a);

// The algorithm named `name` (its full name or its ip xfrm alias), or nullptr.
const AlgInfo *find_alg(std::string_view name);
// The algorithm of kind `k` with enum value `id`, or nullptr.
const AlgInfo *alg_of(Kind k, uint8_t id);

// The message for `name` given where an algorithm of kind `wanted` belongs: what the name
// most likely means, or the names that are valid there.
std::string unknown_alg(Kind wanted, std::string_view name);

// The nonzero sizes of `v`, each plus `add`, as "16, 24 or 32" followed by `unit`.
std::string list_sizes(const std::array<uint16_t, 3> &v, unsigned add, const char *unit);
// Whether `x` is one of the nonzero sizes of `v`.
bool in_list(const std::array<uint16_t, 3> &v, unsigned x);

} // namespace xesp::xfrm
