// The control-plane database (Config, in esp/sa_config.h): the SAs and policies the operator
// configured, shared by the `xesp` command, batch files and the gateway. Changes arrive as
// parsed `ip xfrm` commands.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"
#include "userspace/config/xfrm_grammar.h"

namespace xesp {

// add refuses a duplicate (an SA is named by dst + spi, a policy by selector + dir);
// update replaces an existing entry; del removes one; get checks that one exists; flush
// clears the object kind; list changes nothing. On error nothing is changed.
Result<void> apply_command(Config &cfg, const Command &cmd);
// The change cmd would make to cfg, at the cost of the change (a flush: of the whole table).
Result<ConfigChange> change_of(const Config &cfg, const Command &cmd);

// "sa add ..." and "policy add ..." lines that load_batch reads back into the same Config.
// Without show_keys the keys are hidden and the lines do not load.
std::string to_batch(const Config &cfg, bool show_keys);

// Applies a batch (the text of a config file) on top of base, all or nothing. Lines are those
// of parse_command after split_words; a line ending in a backslash continues on the next one.
// Errors are "NAME:LINE: message", NAME being the name given.
// The net change a batch makes to base, all or nothing, at the cost of the batch. `check`, if
// given, is asked about each command beyond the grammar (a daemon: whether its crypto backend
// implements an SA's algorithms); its error is the line's, "NAME:LINE: " before it.
using CommandCheck = std::function<Result<void>(const Command &)>;
Result<ConfigChange> batch_change(std::string_view text, std::string_view name, const Config &base,
                                  const CommandCheck &check = {});
Result<Config> load_batch(std::string_view text, std::string_view name, Config base = {},
                          const CommandCheck &check = {});
Result<Config> load_batch_file(const std::string &path, Config base = {},
                               const CommandCheck &check = {});

}  // namespace xesp
