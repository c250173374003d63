// Daemon logs: one line per event on stderr. Under systemd (JOURNAL_STREAM set) each line
// starts with its syslog priority, "<3>", which journald reads as the level (sd-daemon(3));
// elsewhere with the level's name. Never give keys to these functions.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace xesp {

enum class LogLevel : int { Error = 3, Warning = 4, Notice = 5, Info = 6, Debug = 7 };

inline void vlog(LogLevel level, const char *fmt, va_list ap)
{
    static const bool journal = std::getenv("JOURNAL_STREAM") != nullptr;
    char line[1024];
    std::vsnprintf(line, sizeof(line), fmt, ap);
    if (journal) {
        std::fprintf(stderr, "<%d>%s\n", int(level), line);
    } else {
        static const char *names[] = {"", "", "", "error", "warning", "notice", "info", "debug"};
        std::fprintf(stderr, "xesp: %s: %s\n", names[int(level)], line);
    }
}

[[gnu::format(printf, 2, 3)]] inline void log(LogLevel level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

}  // namespace xesp
