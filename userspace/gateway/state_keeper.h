// Keeps the daemon's state file (state.h) and the sequence reservations it carries
// (seq_reserve.h) up to date without stalling the data path.
//
//   data thread                                  writer thread
//   an SA's counter reaches its low-water mark
//   (Sa::next_seq sets a flag: one compare per
//   packet), or a second passed and counters or
//   replay windows moved:
//   tick(): new bounds, numbers, replay windows  -> copy of the configuration with those
//           handed over                             numbers, format, write the temporary,
//                                                   fsync, rename, fsync the directory
//   tick(): write done? -> publish the new bounds <-
//           (Sa::reserve_to), or on failure keep
//           the old ones: the SAs stop at them
//
// A bound is oseq + max(min_ahead, 4 s at the SA's rate) and the low-water mark sits 2 s at
// that rate (or min_ahead / 2) below it, so under load the file is rewritten about every two
// seconds per busy SA and an SA never waits for it. Configuration changes write at once and
// wait (save_now()): a new SA sends nothing before its reservation is on disk. After a failed
// write the next attempt waits a second.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "userspace/gateway/gateway.h"
#include "userspace/gateway/state.h"
#include "userspace/netns.h"
#include "userspace/private_file.h"
#include "userspace/seq_reserve.h"

namespace xesp {

class StateKeeper {
public:
    // Checks the file's directory (private_file.h), takes the file's lock and reads the file.
    static Result<std::unique_ptr<StateKeeper>> open(const std::string &path,
                                                     const ReservePolicy &policy);
    ~StateKeeper();     // after the Gateway whose SAs it binds

    const std::string &path() const { return path_; }
    // What the file held when opened (nullopt: there was none).
    const std::optional<GatewayState> &loaded() const { return loaded_; }

    // Once, after the gateway is built from the loaded state: puts back the replay window of
    // each SA the file had configured the same way, then forgets what was loaded (keys too).
    void restore_replay(Gateway &gw);

    // After every change of configuration or interfaces: binds every new SA's reservation,
    // writes the file and waits; on success the SAs may send up to their new bounds.
    Result<void> save_now(Gateway &gw);
    // From the data loop, about once a millisecond (now: CLOCK_MONOTONIC ns).
    void tick(Gateway &gw, uint64_t now);

private:
    struct Track {                  // by SA index
        uint64_t serial = 0;        // the SA this entry is about
        KeyFingerprint fp{};
        uint64_t oseq = 0, at = 0;  // the counter at the last write, and when
        uint64_t rate = 0;          // numbers a second, a slowly decaying peak
    };
    struct Grant {
        uint64_t serial, last, low_water;
    };
    // What the writer thread turns into a GatewayState.
    struct Job {
        std::shared_ptr<const Config> config;
        std::vector<std::pair<uint64_t, uint64_t>> seqs;   // per SA: reservation, highest in
        std::vector<SavedReplay> replay;
        SeqLedger ledger;
        std::vector<std::pair<std::string, IfaceRole>> ifaces;
    };

    StateKeeper(std::string path, PrivateFileLock lock, const ReservePolicy &policy);
    Job snapshot(Gateway &gw, uint64_t now);
    void start(Job job);
    void finish(Gateway &gw, const Result<void> &r);
    Result<void> wait_idle(Gateway &gw);
    uint64_t activity(const Gateway &gw) const;
    void writer();

    std::string path_;
    PrivateFileLock lock_;
    ReservePolicy policy_;
    std::optional<GatewayState> loaded_;
    std::string netns_ = netns_name();      // recorded in the file: another namespace's is refused
    SeqLedger ledger_;
    std::shared_ptr<const Config> config_;  // as of the last save_now()
    std::vector<Track> tracks_;
    std::vector<Grant> grants_;             // of the write in flight
    std::atomic<bool> wake_{false};         // set by an SA at its low-water mark
    uint64_t last_look_ = 0, retry_at_ = 0;
    uint64_t saved_activity_ = UINT64_MAX;
    bool busy_ = false;                     // a job handed over and not yet taken back
    bool failing_ = false;

    // Shared with the writer thread, under mu_.
    std::mutex mu_;
    std::condition_variable cv_;
    std::optional<Job> job_;                // to write
    std::optional<Result<void>> result_;    // of the last write, not yet taken
    bool stop_ = false;
    std::thread thread_;
};

} // namespace xesp
