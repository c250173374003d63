// The `ip xfrm` grammar is our grammar: `xesp sa add ...` and `xesp policy add ...` take the
// words of `ip xfrm state add` / `ip xfrm policy add` (ip-xfrm(8)), and a config file is a batch
// of such lines. This header reads those words into SaConfig / PolicyConfig and writes them back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"

namespace xesp {

// Shell-style word splitting of one line: blanks separate words; 'single quotes' are literal;
// "double quotes" honour \\ \" \$ \`; a backslash outside quotes escapes the next character.
// A '#' starting a word begins a comment that runs to the end of the line.
Result<std::vector<std::string>> split_words(std::string_view line);

// The same, except that a line ending in an unquoted backslash is not an error: *continues is
// set and the words so far are returned, so that a batch can join the line with the next one.
Result<std::vector<std::string>> split_words(std::string_view line, bool *continues);

// The word itself when split_words (and a POSIX shell) reads it back unchanged, else quoted.
std::string quote_word(std::string_view word);

struct Command {
    enum class Object : uint8_t { Sa, Policy } object = Object::Sa;
    enum class Verb : uint8_t { Add, Update, Del, Get, Flush, List } verb = Verb::List;
    SaConfig sa;          // add/update: everything; del/get: src (optional), dst, spi
    PolicyConfig policy;  // add/update: everything; del/get: selector + dir
};

// words[0] is "sa" (or "state") or "policy", words[1] the verb: add, update, del|delete, get,
// flush, list|show. Error messages are one line, e.g.
//   sa add: unknown algorithm 'gcm(aes)'; did you mean 'rfc4106(gcm(aes))'?
// and never contain key material.
Result<Command> parse_command(const std::vector<std::string> &words);

// What a hidden key is printed as. parse_command refuses it, so a listing without keys cannot
// be loaded back by mistake as an SA keyed with these 8 bytes.
inline constexpr std::string_view kHiddenKey = "<hidden>";

// One "sa add ..." line that parse_command reads back to the same config. Keys are printed as
// 0x... only when show_keys, otherwise as kHiddenKey.
std::string format_sa(const SaConfig &sa, bool show_keys);
// One "policy add ..." line that parse_command reads back to the same config.
std::string format_policy(const PolicyConfig &p);

// "policy src 10.0.0.0/24 dst 10.0.1.0/24 dir out": how messages name one policy (an SA:
// describe_sa in esp/sa_config.h).
std::string describe_policy(const Selector &sel, Dir dir);

}  // namespace xesp
