// Keeps the daemon's state file (state.h) and the sequence reservations it carries
// (seq_reserve.h) up to date without stalling the data path, at the cost of what moves: a
// change, an SA at its low-water mark, a replay window that moved. The data thread only reads
// the counters and windows of those SAs (SaNotify lists them) and hands out bounds;
// everything that costs (fingerprints, the ledger, rates, formatting, the write) happens on
// the writer thread, which keeps its own view of the whole state.
//
//   data thread                                  writer thread
//   a change (request_save), an SA at its
//   low-water mark (Sa::next_seq lists it: one
//   compare per packet), or a second passed and
//   replay windows moved:
//   tick(): a sample of those SAs (counter,      -> rates, ledger floors for new SAs, bounds,
//           bound, replay window) handed over       into its view; a journal entry, appended
//                                                   and fsynced (and when the journal has
//                                                   grown as big as the file, the whole file
//                                                   from a snapshot, on a thread of its own:
//                                                   temporary, fsync, rename, then the journal
//                                                   cut to the lines after the snapshot)
//   tick(): write done? -> publish the new bounds <-
//           (new SAs: their start first), or on
//           failure keep the old ones: the SAs
//           stop at them, and the next write
//           samples every SA
//
// A new SA is held (Sa::hold: it sends nothing) from the moment it is made (the gateway makes
// them held) until a write records its start, the higher of its configured counter and the
// ledger's record for its key. A bound is oseq + max(min_ahead, 4 s at the SA's rate) and the
// low-water mark sits 2 s at that rate (or min_ahead / 2) below it, so under load an SA asks
// about every two seconds and never waits for the write. A configuration change asks for a
// write at once (request_save(), on the data thread, right after the change went live;
// save_now(), a whole write, at start and stop), and whoever made the change waits for it on
// its own thread (wait_saved()). After a failed write the next attempt waits a second.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "userspace/gateway/gateway.h"
#include "userspace/gateway/state.h"
#include "userspace/base/netns.h"
#include "userspace/base/private_file.h"
#include "userspace/esp/seq_reserve.h"

namespace xesp {

class StateKeeper {
public:
    // Checks the file's directory (private_file.h), takes the file's lock and reads the file.
    // The journal is compacted once it outgrows journal_min bytes, or about the whole
    // file's size.
    static constexpr uint64_t kJournalMin = uint64_t(4) << 20;
    static Result<std::unique_ptr<StateKeeper>>
    open(const std::string &path, const ReservePolicy &policy, uint64_t journal_min = kJournalMin);
    ~StateKeeper();  // after the Gateway whose SAs it binds

    const std::string &path() const { return path_; }
    // What the file held when opened (nullopt: there was none).
    const std::optional<GatewayState> &loaded() const { return loaded_; }

    // Once, after the gateway is built from the loaded state: puts back the replay window of
    // each SA the file had configured the same way, then forgets what was loaded (keys too).
    void restore_replay(Gateway &gw);

    // The configuration the gateway starts with, before the first save (the changes then
    // come with request_save()).
    void set_config(Config config);
    // A configuration change, on the thread that makes changes, before it is published: the
    // change and the reservations of the SAs it makes go into the journal, and once that is
    // on disk those SAs are bound to them (no other thread can see them yet): a new SA may
    // send from its first packet, and a rekey's new outbound SA takes its flow over at once.
    // On error nothing is bound, and the change must not be published.
    Result<void> record_change(const ConfigChange &change,
                               const std::vector<std::shared_ptr<Sa>> &made);
    // After every change of interfaces, on the data thread: asks for a whole write, which
    // tick() starts (after the one in flight, if any). Returns a ticket for wait_saved().
    uint64_t request_save(Gateway &gw, const ConfigChange *change = nullptr);
    // On another thread: waits until a write that covers `ticket` is done; its result.
    Result<void> wait_saved(uint64_t ticket);  // ESHUTDOWN: the keeper stopped first
    // request_save() and wait_saved() in one, for the data thread while nothing else runs
    // (start, stop).
    Result<void> save_now(Gateway &gw);
    // From the data loop, about once a millisecond (now: CLOCK_MONOTONIC ns).
    void tick(Gateway &gw, uint64_t now);

    // How a compaction's thread is started; std::thread's constructor unless set (before the
    // first change). A start that throws, as std::thread does when the process is out of
    // threads or memory, leaves the journal growing until the next try, a second on.
    using Spawn = std::function<std::thread(std::function<void()>)>;
    void set_spawn(Spawn spawn) { spawn_ = std::move(spawn); }

private:
    // One SA as the data thread saw it, in the order of the configuration's SAs.
    struct Sample {
        std::weak_ptr<Sa> sa;
        SaKey key;
        uint64_t serial = 0;
        uint64_t oseq = 0, reserved = 0;
        bool fresh = false;  // not bound yet: held, its start comes from the ledger
        bool renew = true;   // a new bound (else only its window moved)
        ReplayWindow::Snapshot window;
        bool has_window = false;
    };
    // What the writer thread turns into a GatewayState (whole) or a journal entry, and
    // grants.
    struct Job {
        bool whole = true;                  // else only the SAs the changes made are sampled
        bool control = false;               // record_change()'s: its result goes to that thread
        std::vector<ConfigChange> changes;  // since the last job, in order
        std::vector<Sample> sas;
        std::vector<IfaceSpec> ifaces;
        std::vector<SavedRenamed> renamed;
        uint64_t now = 0;
        uint64_t ticket = 0;  // covers the requests up to this one
    };
    struct Grant {
        std::weak_ptr<Sa> sa;
        uint64_t start, last, low_water;  // start: for a fresh SA, else 0
    };
    struct Track {            // the writer's, by SA key
        uint64_t serial = 0;  // of the SA it tracks (an update makes another)
        KeyFingerprint fp{};
        uint64_t oseq = 0, at = 0;  // the counter at the last write, and when
        uint64_t rate = 0;          // numbers a second, a slowly decaying peak
        uint64_t round = 0;
    };

    StateKeeper(std::string path, PrivateFileLock lock, const ReservePolicy &policy);
    Job sample(Gateway &gw, uint64_t now, bool whole);
    // Returns the fingerprint of the SA's keys it recorded the bound under.
    const KeyFingerprint &reserve(Sample &s, SaConfig &sc, uint64_t now,
                                  std::vector<Grant> &grants);
    Result<void> write(Job &job, std::vector<Grant> &grants);
    std::vector<SavedReplay> next_round();
    GatewayState snapshot();
    Result<void> write_whole();
    void start_compaction();
    void end_compaction(bool wait);
    void start(Job job);
    void finish(const Result<void> &r, std::vector<Grant> &grants);
    Result<void> wait_idle();
    void writer();

    std::string path_;
    PrivateFileLock lock_;
    ReservePolicy policy_;
    std::optional<GatewayState> loaded_;
    std::string netns_ = netns_name();  // recorded in the file: another namespace's is refused

    // The data thread's.
    bool started_ = false;               // saved once: periodic saves may follow
    std::vector<ConfigChange> changes_;  // not yet handed to the writer
    SaNotify notify_;                    // what the bound SAs ask for
    uint64_t last_look_ = 0, retry_at_ = 0;
    bool need_whole_ = false;       // a write failed (or the renamed devices changed): sample all
    uint64_t renamed_changes_ = 0;  // Gateway::renamed_changes() as last seen
    bool busy_ = false;             // a job handed over and not yet taken back
    bool failing_ = false;
    uint64_t requested_ = 0;  // tickets given by request_save()
    uint64_t in_flight_ = 0;  // the ticket of the job handed over
    bool want_ = false;       // a request came while busy_

    // The writer thread's (set_config() before it starts).
    Config config_;  // as of the last job, with the reservations given
    std::unordered_map<SaKey, ReplayWindow::Snapshot, ConfigKeyHash> windows_;
    std::vector<IfaceSpec> ifaces_;
    std::vector<SavedRenamed> renamed_;
    Journal journal_;
    uint64_t generation_ = 0;  // of the file and the journal lines that follow it
    bool have_file_ = false;   // a whole file is on disk: the journal may be appended to
    SeqLedger ledger_;
    std::unordered_map<SaKey, Track, ConfigKeyHash> tracks_;
    uint64_t round_ = 0;
    uint64_t journal_min_ = kJournalMin;
    bool compacting_ = false;    // the compactor writes the file
    uint64_t compact_from_ = 0;  // where the journal's lines after its snapshot begin
    uint64_t compact_retry_at_ = 0;
    std::thread compactor_;
    Spawn spawn_;

    // Shared with the writer thread, under mu_.
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;                        // to write, in order
    std::optional<Result<void>> control_result_;  // of record_change()'s job, with its grants
    std::vector<Grant> control_grants_;
    std::optional<Result<void>> result_;  // of the last write, not yet taken
    std::vector<Grant> grants_;           // with result_
    bool stop_ = false;
    std::condition_variable done_cv_;        // for wait_saved()
    uint64_t done_ = 0;                      // the ticket of the last write finished
    Result<void> done_result_;               // and how it went
    std::optional<Result<void>> compacted_;  // the compactor's result, not yet taken
    std::thread thread_;
};

}  // namespace xesp
