// `policy` commands: reading the words of a policy (after "policy VERB").
#pragma once

#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"
#include "userspace/config/xfrm_words.h"

namespace xesp::xfrm {

// `policy add|update ...` (everything), or with id_only `policy del|get ...`: the selector,
// dir and ptype that name a policy, and nothing else.
Result<PolicyConfig> parse_policy(Cursor &c, bool id_only);

}  // namespace xesp::xfrm
