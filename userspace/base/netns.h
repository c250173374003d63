// Which named network namespace this process runs in, as `ip netns identify` tells it: the
// namespace files under /run/netns (where `ip netns add` bind-mounts them) whose device and
// inode are those of /proc/self/ns/net. Several gateways on one host each run in a namespace
// of their own, and each daemon's default control socket and state file carry its name, so
// that the CLI run in the same namespace finds that daemon and no other.
#pragma once

#include <string>

namespace xesp {

// The name, or "" when this namespace has none (the host's own, or one no `ip netns` named);
// with several names, the first in order.
std::string netns_name();

// "network namespace NAME", or "no named network namespace" for "": for messages.
std::string describe_netns(const std::string &name);

}  // namespace xesp
