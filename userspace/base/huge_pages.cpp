#include "userspace/base/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

namespace xesp {

namespace {

constexpr uintptr_t kHuge = 2u << 20;
constexpr uintptr_t kMaxGuard = 64u << 10;  // a thread stack's guard: glibc's is a page or so

bool thp_allowed()
{
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    std::getline(f, s);
    return s.find("[never]") == std::string::npos && !s.empty();
}

}  // namespace

HugePageAdvice advise_huge_pages()
{
    HugePageAdvice r;
    if (!thp_allowed())
        return r;
    std::ifstream maps("/proc/self/maps");
    std::string line;
    uintptr_t prev_end = 0;
    bool prev_guard = false;  // the mapping before: PROT_NONE and a guard's size
    while (std::getline(maps, line)) {
        unsigned long start = 0, end = 0, inode = 0;
        char perms[5] = {};
        int path_at = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx %4s %*s %*s %lu %n", &start, &end, perms, &inode,
                        &path_at) < 4)
            continue;
        const char *path = line.c_str() + path_at;
        bool guard = std::strcmp(perms, "---p") == 0 && end - start <= kMaxGuard;
        bool below_is_guard = prev_guard && prev_end == start;
        prev_end = end;
        prev_guard = guard;
        if (std::strcmp(perms, "rw-p") != 0 || inode != 0 || below_is_guard)
            continue;
        if (*path && std::strcmp(path, "[heap]") != 0)
            continue;  // [stack], [vvar] and the like
        // Whole huge pages only: the kernel would split a partial one off anyway.
        uintptr_t lo = (start + kHuge - 1) & ~(kHuge - 1), hi = end & ~(kHuge - 1);
        if (lo >= hi)
            continue;
        void *p = reinterpret_cast<void *>(lo);
        if (madvise(p, hi - lo, MADV_HUGEPAGE) != 0)
            continue;
        r.advised += hi - lo;
        if (madvise(p, hi - lo, MADV_COLLAPSE) == 0)
            r.collapsed += hi - lo;
        else if (!r.collapse_error)
            r.collapse_error = errno;
    }
    return r;
}

}  // namespace xesp
