// The advice given for an algorithm name that is not one of those xesp offers (the table:
// esp/algs.h), and the key and ICV sizes as messages list them.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "userspace/esp/algs.h"

namespace xesp::xfrm {

// The message for `name` given where an algorithm of kind `wanted` belongs: what the name
// most likely means, or the names that are valid there.
std::string unknown_alg(Kind wanted, std::string_view name);

// The nonzero sizes of `v`, each plus `add`, as "16, 24 or 32" followed by `unit`.
std::string list_sizes(const std::array<uint16_t, 3> &v, unsigned add, const char *unit);
// Whether `x` is one of the nonzero sizes of `v`.
bool in_list(const std::array<uint16_t, 3> &v, unsigned x);

}  // namespace xesp::xfrm
