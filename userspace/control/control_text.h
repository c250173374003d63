// What both ends of the control socket (control.h) do with its text. Requests and answers
// carry keys, so every buffer that held one is wiped (base/wiped.h) before it is freed or
// reused; JSON that goes out is written by hand into such buffers.
#pragma once

#include <sys/un.h>

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "userspace/base/result.h"
#include "userspace/base/wiped.h"

namespace xesp::control_text {

constexpr size_t kChunk = 64 * 1024;             // one read from a socket
constexpr size_t kMaxAnswer = size_t(64) << 20;  // the client's bound on one answer line

using xesp::append_wiped;  // base/wiped.h
using xesp::wipe;
// Drops the first n bytes; the bytes freed at the end are wiped.
void consume_front(std::string &buf, size_t n);
// How deep a message may nest. Requests and answers are objects of strings, booleans and
// arrays of strings, two levels; a line nested deeper is refused before any value is built, so
// that nothing that walks a message can run out of stack on it.
constexpr size_t kMaxJsonDepth = 8;
// Parses one request or answer line. Errors: "not JSON", "nested deeper than 8 levels".
Result<nlohmann::json> parse_message(std::string_view line);
// Wipes every string inside a parsed message. Iterative: depth does not use up the stack.
void wipe_json(nlohmann::json &j);
// s as a JSON string, quotes and escapes included, appended with append_wiped.
void append_json_string(std::string &out, std::string_view s);
// Where s stops being UTF-8 (JSON text must be: RFC 3629, no surrogates, no overlong forms),
// or npos.
size_t invalid_utf8_at(std::string_view s);

Result<sockaddr_un> unix_address(const std::string &path);

}  // namespace xesp::control_text
