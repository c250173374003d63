// Selectors (src/dst prefixes, upper protocol, ports) and the other words that SAs and
// policies share: mode, proto esp, dir.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"
#include "userspace/config/xfrm_words.h"

namespace xesp::xfrm {

// A selector as its words are read; finish_selector checks it and fills in what is left out.
struct SelectorDraft {
    std::optional<Prefix> src, dst;
    uint8_t proto = 0;
    std::optional<uint16_t> sport, dport;
};

// One selector word (src, dst, proto, sport, dport), if `w` is one that is not yet set.
// Returns false when `w` belongs to whatever follows the selector.
Result<bool> selector_word(Cursor &c, SelectorDraft &s, std::string_view w);
// `what` names the selector in messages ("sel", "selector").
Result<Selector> finish_selector(const Cursor &c, const SelectorDraft &d, std::string_view what);
std::string format_selector(const Selector &s);

// `mode tunnel|transport`, after the word mode.
Result<Mode> parse_mode(Cursor &c);
// `proto esp`, after the word proto: the only IPsec protocol xesp does.
Result<void> parse_xfrm_proto(Cursor &c);
std::string_view dir_word(Dir d);

}  // namespace xesp::xfrm
