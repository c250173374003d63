#include <catch2/catch.hpp>

#include <pthread.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "userspace/base/huge_pages.h"

namespace {

bool thp_madvise_allowed()
{
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string s;
    std::getline(f, s);
    return !s.empty() && s.find("[never]") == std::string::npos;
}

// The VmFlags of the mapping that holds `p`, from /proc/self/smaps ("" if none does).
std::string vm_flags(const void *p)
{
    auto a = reinterpret_cast<uintptr_t>(p);
    std::ifstream f("/proc/self/smaps");
    std::string line;
    bool in = false;
    while (std::getline(f, line)) {
        unsigned long lo, hi;
        if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find('-') < 17) {
            in = lo <= a && a < hi;
            continue;
        }
        if (in && line.rfind("VmFlags:", 0) == 0)
            return line;
    }
    return "";
}

bool has_flag(const std::string &flags, const char *flag)
{
    return (flags + " ").find(std::string(" ") + flag + " ") != std::string::npos;
}

}  // namespace

TEST_CASE("the heap goes on huge pages, threads' stacks do not", "[huge_pages]")
{
    if (!thp_madvise_allowed()) {
        WARN("transparent huge pages are off here (never): nothing to check");
        return;
    }
    // A block big enough for malloc to map on its own, with whole huge pages inside it.
    const size_t size = 16u << 20;
    char *block = static_cast<char *>(std::malloc(size));
    REQUIRE(block);
    std::memset(block, 1, size);
    char *middle = block + size / 2;
    REQUIRE_FALSE(has_flag(vm_flags(middle), "hg"));

    // A thread's stack, in use while the heap is advised.
    std::string stack_before, stack_after;
    bool go = false, done = false;
    std::mutex m;
    std::condition_variable cv;
    std::thread t([&] {
        char on_stack[64];
        std::memset(on_stack, 0, sizeof(on_stack));
        std::unique_lock<std::mutex> l(m);
        stack_before = vm_flags(on_stack - (4u << 20));
        cv.wait(l, [&] { return go; });
        // Deep in the stack: advice on whole huge pages would leave the partial one at its
        // top as it was.
        stack_after = vm_flags(on_stack - (4u << 20));
        done = true;
        cv.notify_all();
    });

    xesp::HugePageAdvice r = xesp::advise_huge_pages();
    {
        std::unique_lock<std::mutex> l(m);
        go = true;
        cv.notify_all();
        cv.wait(l, [&] { return done; });
    }
    t.join();

    CHECK(r.advised >= size - (4u << 20));
    CHECK(has_flag(vm_flags(middle), "hg"));
    CHECK(block[0] == 1);
    CHECK(middle[0] == 1);  // collapsed or not, the contents are what they were
    CHECK(block[size - 1] == 1);
    REQUIRE_FALSE(stack_before.empty());
    CHECK_FALSE(has_flag(stack_after, "hg"));
    std::free(block);
}
