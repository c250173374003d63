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

// A thread with a 16 MiB stack, which reports its stack's flags deep down (advice on whole huge
// pages would leave the partial one at its top as it was) before and after `go`.
struct StackProbe {
    std::mutex m;
    std::condition_variable cv;
    bool go = false, done = false;
    std::string before, after;

    static void *run(void *arg)
    {
        auto &p = *static_cast<StackProbe *>(arg);
        char on_stack[64];
        std::memset(on_stack, 0, sizeof(on_stack));
        const void *deep = reinterpret_cast<const void *>(  // inside the 16 MiB
            reinterpret_cast<uintptr_t>(on_stack) - (4u << 20));
        std::unique_lock<std::mutex> l(p.m);
        p.before = vm_flags(deep);
        p.cv.wait(l, [&] { return p.go; });
        p.after = vm_flags(deep);
        p.done = true;
        p.cv.notify_all();
        return nullptr;
    }
};

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
    if (has_flag(vm_flags(middle), "hg"))
        WARN("malloc gives huge pages already (glibc.malloc.hugetlb): the advice changes nothing");

    StackProbe probe;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 16u << 20);
    pthread_t t;
    REQUIRE(pthread_create(&t, &attr, StackProbe::run, &probe) == 0);
    pthread_attr_destroy(&attr);

    xesp::HugePageAdvice r = xesp::advise_huge_pages();
    {
        std::unique_lock<std::mutex> l(probe.m);
        probe.go = true;
        probe.cv.notify_all();
        probe.cv.wait(l, [&] { return probe.done; });
    }
    pthread_join(t, nullptr);

    CHECK(r.advised >= size - (4u << 20));
    CHECK(has_flag(vm_flags(middle), "hg"));
    CHECK(block[0] == 1);
    CHECK(middle[0] == 1);  // collapsed or not, the contents are what they were
    CHECK(block[size - 1] == 1);
    REQUIRE_FALSE(probe.before.empty());
    CHECK_FALSE(has_flag(probe.after, "hg"));
    std::free(block);
}
