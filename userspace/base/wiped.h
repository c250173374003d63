// Text that may hold keys: wiped before its storage is freed or reused. A std::string that
// grows moves to larger storage and frees the old without clearing it, so text appended after
// a key goes through append_wiped().
#pragma once

#include <string.h>

#include <algorithm>
#include <string>
#include <string_view>

namespace xesp {

// All of its storage, not only what it holds now: a string that was longer held more.
inline void wipe(std::string &s)
{
    s.resize(s.capacity());
    explicit_bzero(s.data(), s.size());
    s.clear();
}

// Room for `more` bytes past the end; when the string must grow, the old storage is wiped, not
// freed with the bytes in it.
inline void reserve_wiped(std::string &buf, size_t more)
{
    if (buf.size() + more <= buf.capacity())
        return;
    std::string bigger;
    bigger.reserve(std::max(buf.capacity() * 2, buf.size() + more));
    bigger.append(buf);
    wipe(buf);
    buf.swap(bigger);
}

inline void append_wiped(std::string &buf, std::string_view more)
{
    reserve_wiped(buf, more.size());
    buf.append(more);
}

// Appends text that holds a key and wipes it where it was.
inline void append_secret(std::string &buf, std::string &&secret)
{
    append_wiped(buf, secret);
    wipe(secret);
}

// Zeroes kWipedStack bytes of the calling thread's stack below the caller's frame: what the
// functions it called left there when they returned (a key being parsed, a line of an SA being
// formatted). Threads that handle keys call it when they have finished with them.
constexpr size_t kWipedStack = 64 * 1024;
void wipe_stack();

}  // namespace xesp
