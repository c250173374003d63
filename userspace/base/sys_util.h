// Small helpers for messages about files and sockets, shared by the CLI and the daemon side.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

namespace xesp {

// "WHAT PATH: strerror(errno)", e.g. "cannot open /run/xesp/xesp.sock: Permission denied".
inline std::string sys_error(const std::string &what, const std::string &path)
{
    return what + " " + path + ": " + std::strerror(errno);
}

// The directory part of a path ("." if it has none).
inline std::string parent_dir(const std::string &path)
{
    auto slash = path.rfind('/');
    if (slash == std::string::npos)
        return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace xesp
