// The daemon's state file: what it runs (SAs with their sequence numbers, policies, the
// interfaces and their roles), so that a restart, after a crash too, picks up where it was.
//
// Sequence numbers (userspace/esp/seq_reserve.h). Outbound, each SA's replay-oseq in the file is
// its reservation: the SA never sends beyond it, and a restarted SA continues from it. The
// ledger of the highest number reserved under each key goes with it, so that an SA with a
// key used before never starts below what was reserved under that key. Inbound, each SA's
// replay window (the highest number and which numbers below it were accepted) is saved whole
// and restored whole: only what arrived after the last save (at most a second's worth) can
// be accepted a second time after a crash.
//
// The file holds keys. It is written through write_private_file() (private_file.h): a 0600
// temporary made with O_EXCL|O_NOFOLLOW, fsynced, renamed, the directory fsynced; the
// directory must be the daemon's alone, and a lock keeps a second daemon off the file.
#pragma once

#include <optional>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include "bpf/xdp_program.h"
#include "userspace/gateway/iface_spec.h"
#include "userspace/config/config.h"
#include "userspace/esp/replay.h"
#include "userspace/base/result.h"
#include "userspace/esp/seq_reserve.h"

namespace xesp {

// A device an interface was, renamed since, that keeps our program (Gateway::renamed()): a
// restart lists it under the interface again, for `iface del WAS` to hand it back.
struct SavedRenamed {
    std::string was;
    uint32_t ifindex = 0;
    bool operator==(const SavedRenamed &) const = default;
};

// One inbound SA's replay window as saved.
struct SavedReplay {
    IpAddr dst;
    uint32_t spi = 0;
    ReplayWindow::Snapshot window;
};

struct GatewayState {
    Config config;  // replay-oseq: each SA's reservation; replay-seq: its highest received
    std::vector<IfaceSpec> ifaces;
    std::vector<SavedRenamed> renamed;  // absent from older files
    SeqLedger ledger;
    std::vector<SavedReplay> replay;
    // The named network namespace (netns.h) of the daemon that wrote it, "" for none; absent
    // from files written before it was recorded. A daemon refuses another namespace's file.
    std::optional<std::string> netns;
    // The journal generation: the journal lines written after this file carry it. A line of
    // an older generation is in the file already (a crash between writing the file and
    // cutting the journal) and is ignored; a line of a newer one follows the file too (it was
    // appended while a newer file was being written, and the crash came before its rename).
    uint64_t journal = 0;
};

// A GatewayState's parts where they already are, to write a state without copying them
// together (the writer of a daemon with many tunnels keeps its own view of them).
struct StateView {
    const Config &config;
    const std::vector<IfaceSpec> &ifaces;
    const std::vector<SavedRenamed> &renamed;
    const SeqLedger &ledger;
    const std::vector<SavedReplay> &replay;
    const std::optional<std::string> &netns;
    uint64_t journal;
};

// The file, then its journal (below) on top; nullopt: no file.
Result<std::optional<GatewayState>> load_state(const std::string &path);
// The file's text (keys included: wipe it after use) and its durable write. The caller holds
// the file's PrivateFileLock. The text is JSON, laid out as nlohmann::json's dump(1) lays it
// out, written directly: at 100,000 tunnels a JSON document built first costs seconds.
std::string format_state(const StateView &state);
std::string format_state(const GatewayState &state);
Result<void> save_state(const std::string &path, const StateView &state);
Result<void> save_state(const std::string &path, const GatewayState &state);

// The journal, PATH.journal: what changed since the file was last written whole, one entry
// a line, appended and fsynced before a change is answered. A change costs its own entry, not
// a rewrite of every tunnel; a whole write (StateKeeper: at start and stop, or when the journal
// has grown as big as the file) empties the journal, or cuts it to the lines appended while
// the file was written. An entry is the configuration change
// (puts as `sa add`/`policy add` lines, deletions by key), the reservation given to each SA it
// made (its replay-oseq, as in the file) and the ledger records that go with them. A last line
// cut short by a crash was never acknowledged and is ignored; any other bad line refuses the
// file as a bad file does.
struct JournalEntry {
    ConfigChange change;
    std::vector<std::pair<SaKey, uint64_t>> reserved;  // last number an SA may send now
    std::vector<std::pair<KeyFingerprint, SeqLedger::Record>> ledger;
    std::vector<SavedReplay> windows;  // replay windows that moved
    uint64_t generation = 0;           // GatewayState::journal of the file it follows
};
std::string journal_path(const std::string &state_path);
std::string format_journal_entry(const JournalEntry &e);  // one line, '\n' included; keys
// Applies entry `line` (without its '\n') to st. `windows`, if given, indexes st.replay by
// key (kept up to date).
using WindowIndex = std::unordered_map<SaKey, size_t, ConfigKeyHash>;
Result<void> apply_journal_line(std::string_view line, GatewayState &st,
                                WindowIndex *windows = nullptr);

// The journal file: each append opens it, writes, fsyncs and closes it again (an open file
// would keep its filesystem from being remounted read-only); reset() empties it once the
// whole file has been written; drop_before() keeps only what was appended from `offset` on
// (the lines after a snapshot, once the file written from that snapshot is on disk), through
// a temporary renamed over the journal: a crash leaves the old journal or the new one.
class Journal {
public:
    static Result<Journal> open(const std::string &path);  // checks it can be created
    Result<void> append(std::string_view line);
    Result<void> reset();
    Result<void> drop_before(uint64_t offset);
    uint64_t size() const { return size_; }

private:
    std::string path_;
    uint64_t size_ = 0;
};

// `configured` (a config file read at start) with the sequence numbers of each SA that `saved`
// has configured the same way otherwise.
Config with_saved_sequence(Config configured, const Config &saved);

}  // namespace xesp
