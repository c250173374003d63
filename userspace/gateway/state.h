// The daemon's state file: what it runs (SAs with their sequence numbers, policies, the
// interfaces and their roles), so that a restart, after a crash too, picks up where it was.
//
// Sequence numbers. The peer remembers the highest sequence number it accepted; an SA that
// restarts below it has its packets dropped as replays. The file therefore records each
// outbound counter plus a margin, rewritten before the counter gets there (save_due), and a
// restarted SA continues above anything it can have sent. Inbound, the replay window restarts
// at the highest number seen when the file was written.
//
// The file holds keys: it is written 0600, by rename, like the database file.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bpf/xdp_program.h"
#include "userspace/config.h"
#include "userspace/result.h"

namespace xesp {

struct GatewayState {
    Config config;
    std::vector<std::pair<std::string, IfaceRole>> ifaces;
    // The named network namespace (netns.h) of the daemon that wrote it, "" for none; absent
    // from files written before it was recorded. A daemon refuses another namespace's file.
    std::optional<std::string> netns;
};

// Output sequence numbers the file reserves ahead of the counter.
inline constexpr uint64_t kStateSeqMargin = uint64_t(1) << 24;

Result<std::optional<GatewayState>> load_state(const std::string &path);   // nullopt: no file
Result<void> save_state(const std::string &path, const GatewayState &state);

// `configured` (a config file read at start) with the sequence numbers of each SA that `saved`
// has configured the same way otherwise.
Config with_saved_sequence(Config configured, const Config &saved);

} // namespace xesp
