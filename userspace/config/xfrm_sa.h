// `sa` commands: reading the words of an SA (after "sa VERB").
#pragma once

#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"
#include "userspace/config/xfrm_words.h"

namespace xesp::xfrm {

// `sa add|update ...`: a complete and consistent SA, or what the kernel would refuse about it.
Result<SaConfig> parse_sa(Cursor &c);
// `sa del|get [src ADDR] dst ADDR [proto esp] spi SPI`: src (optional), dst and spi.
Result<SaConfig> parse_sa_id(Cursor &c);

}  // namespace xesp::xfrm
