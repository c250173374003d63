#include "userspace/base/cpu_list.h"

#include <sched.h>

#include <charconv>
#include <cstring>

namespace xesp {

namespace {

bool parse_cpu(std::string_view s, int *cpu)
{
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *cpu);
    return ec == std::errc() && end == s.data() + s.size() && *cpu >= 0 && *cpu < CPU_SETSIZE;
}

}  // namespace

Result<std::vector<int>> parse_cpu_list(const std::string &s)
{
    std::vector<int> out;
    std::string_view rest = s;
    while (!rest.empty()) {
        size_t comma = rest.find(',');
        std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        size_t dash = item.find('-');
        int first, last;
        bool ok = dash == std::string_view::npos
                      ? parse_cpu(item, &first) && ((last = first), true)
                      : parse_cpu(item.substr(0, dash), &first) &&
                            parse_cpu(item.substr(dash + 1), &last) && first <= last;
        if (!ok)
            return make_error("cpus: '" + std::string(item) +
                              "' is not a CPU number or a range of them (as 0,2,4-7)");
        for (int c = first; c <= last; c++)
            out.push_back(c);
        if (comma != std::string_view::npos && rest.empty())
            return make_error("cpus: '" + s + "' ends with a comma");
    }
    return out;
}

Result<void> pin_to_cpu(int cpu, pthread_t thread)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (int e = pthread_setaffinity_np(thread, sizeof set, &set))
        return make_error("cannot run on CPU " + std::to_string(cpu) + ": " + std::strerror(e), e);
    return {};
}

}  // namespace xesp
