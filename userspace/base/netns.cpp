#include "userspace/base/netns.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <vector>

namespace xesp {

std::string netns_name()
{
    struct stat self {};
    if (::stat("/proc/self/ns/net", &self) != 0)
        return "";
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator("/run/netns", ec)) {
        struct stat st {};
        if (::stat(e.path().c_str(), &st) == 0 && st.st_dev == self.st_dev &&
            st.st_ino == self.st_ino)
            names.push_back(e.path().filename());
    }
    if (names.empty())
        return "";
    return *std::min_element(names.begin(), names.end());
}

std::string describe_netns(const std::string &name)
{
    return name.empty() ? "no named network namespace" : "network namespace " + name;
}

}  // namespace xesp
