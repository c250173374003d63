#include "userspace/gateway/state_keeper.h"

#include <algorithm>
#include <cerrno>
#include <unordered_map>

#include "userspace/base/clock.h"
#include "userspace/base/log.h"
#include "userspace/base/sys_util.h"
#include "userspace/base/thread_priority.h"
#include "userspace/base/wiped.h"

namespace xesp {

namespace {

constexpr uint64_t kLookNs = kSecondNs;   // counters and replay windows moved?
constexpr uint64_t kRetryNs = kSecondNs;  // after a failed write
// The journal is folded into a whole write when it outgrows StateKeeper::kJournalMin, or this
// much per SA: about the size of the whole file.
constexpr uint64_t kJournalPerSa = 512;

uint64_t seq_limit(const SaConfig &c)
{
    return c.esn ? UINT64_MAX : UINT32_MAX;
}

}  // namespace

Result<std::unique_ptr<StateKeeper>>
StateKeeper::open(const std::string &path, const ReservePolicy &policy, uint64_t journal_min)
{
    if (auto r = check_private_dir(parent_dir(path)); !r)
        return r.error();
    auto lock = PrivateFileLock::acquire(path);
    if (!lock)
        return lock.error();
    auto saved = load_state(path);
    if (!saved)
        return saved.error();
    auto journal = Journal::open(journal_path(path));
    if (!journal)
        return journal.error();
    std::unique_ptr<StateKeeper> k(new StateKeeper(path, std::move(*lock), policy));
    k->journal_min_ = journal_min;
    k->journal_ = std::move(*journal);
    if (*saved) {
        k->have_file_ = true;
        k->generation_ = (*saved)->journal;
        k->ledger_ = (*saved)->ledger;
        k->loaded_ = std::move(*saved);
    } else if (auto r = k->journal_.reset(); !r) {
        // Without the file its lines mean nothing, and they must not be read on top of the
        // first file written now.
        return r.error();
    }
    k->thread_ = std::thread([p = k.get()] { p->writer(); });
    return k;
}

StateKeeper::StateKeeper(std::string path, PrivateFileLock lock, const ReservePolicy &policy)
        : path_(std::move(path)), lock_(std::move(lock)), policy_(policy)
{}

StateKeeper::~StateKeeper()
{
    {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    done_cv_.notify_all();
    if (thread_.joinable())
        thread_.join();  // it waits for a compaction in flight
}

void StateKeeper::writer()
{
    (void)set_thread_nice(kBackgroundNice);  // behind the data thread; fine if refused
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [this] { return stop_ || !jobs_.empty() || compacted_.has_value(); });
        if (compacted_) {
            lk.unlock();
            end_compaction(false);
            lk.lock();
            continue;
        }
        if (jobs_.empty()) {
            lk.unlock();
            end_compaction(true);
            return;
        }
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        lk.unlock();
        std::vector<Grant> grants;
        Result<void> r;
        try {
            r = write(job, grants);
        } catch (const std::exception &e) {  // a write that fails must not end the daemon
            r = make_error("state file " + path_ + ": " + e.what());
        }
        wipe_stack();  // the journal lines it wrote, keys included
        lk.lock();
        if (job.control) {
            control_result_ = std::move(r);
            control_grants_ = std::move(grants);
            done_cv_.notify_all();
        } else {
            result_ = std::move(r);
            grants_ = std::move(grants);
            cv_.notify_all();
        }
    }
}

// An SA's bound: from its rate, or for a new SA its start from the ledger's record for its
// key; recorded in sc (replay-oseq, replay-seq) and the ledger.
const KeyFingerprint &StateKeeper::reserve(Sample &s, SaConfig &sc, uint64_t now,
                                           std::vector<Grant> &grants)
{
    auto [it, added] = tracks_.try_emplace(s.key);
    Track &t = it->second;
    uint64_t limit = seq_limit(sc);
    uint64_t start = 0, oseq = s.oseq;
    if (added || t.serial != s.serial)
        t = Track{s.serial, ledger_.fingerprint(sc.xf), oseq, now, 0, 0};
    if (s.fresh) {
        start = std::max(oseq, std::min(limit, ledger_.floor(t.fp)));
        oseq = start;
        t.oseq = start;
    } else if (now > t.at) {
        uint64_t moved = oseq - t.oseq, dt = now - t.at;
        uint64_t inst = moved > UINT64_MAX / kSecondNs ? UINT64_MAX : moved * kSecondNs / dt;
        t.rate = std::max(inst, t.rate - t.rate / 4);
        t.oseq = oseq;
        t.at = now;
    }
    t.round = round_;
    uint64_t reserved = s.fresh ? oseq : s.reserved;
    uint64_t last = std::max(reserved, reservation_target(oseq, t.rate, limit, policy_));
    ledger_.record(t.fp, last);
    grants.push_back(
        {s.sa, start, last, reservation_low_water(oseq, last, t.rate, limit, policy_)});
    sc.oseq = uint32_t(last);
    sc.oseq_hi = uint32_t(last >> 32);
    uint64_t top = s.window.top;
    sc.seq = uint32_t(top);
    sc.seq_hi = uint32_t(top >> 32);
    return t.fp;
}

// A job, on the writer thread: its changes and samples into the writer's view of the state,
// then a journal entry, or the whole file (a whole job; or when the journal has grown as big
// as a whole file would be: that empties it). A journal entry that cannot be written leaves
// the view as it was (the change is refused); the ledger keeps what it recorded, which only
// ever raises floors.
Result<void> StateKeeper::write(Job &job, std::vector<Grant> &grants)
{
    // A journal means something only on top of its file, and its ledger records only under
    // the file's secret: until a whole file is on disk (the first write failed), open() would
    // throw the lines away, and an SA re-added under the same keys would start again from
    // its configured counter. So nothing is appended, no change is recorded, and SAs get no
    // reservation until a whole write succeeds (finish() asks for one again).
    if (!job.whole && !have_file_)
        return make_error("state file " + path_ +
                          ": never written whole yet (the last try failed); no change is "
                          "recorded until it is");
    // The SAs as the job leaves them, apart from the view until the entry is on disk. A whole
    // write without changes is never taken back: its samples go into the view in place.
    bool in_place = job.whole && job.changes.empty();
    std::unordered_map<SaKey, std::optional<SaConfig>, ConfigKeyHash> staged;
    for (const ConfigChange &ch : job.changes) {
        for (const SaKey &k : ch.del_sas)
            staged[k].reset();
        for (const SaConfig &c : ch.put_sas)
            staged[SaKey{c.dst, c.spi}] = c;
    }
    auto find = [&](const SaKey &k) -> SaConfig * {
        if (in_place)
            return config_.sas.find(k);
        auto it = staged.find(k);
        if (it != staged.end())
            return it->second ? &*it->second : nullptr;
        const SaConfig *now = config_.sas.find(k);
        return now ? &*(staged[k] = *now) : nullptr;
    };
    std::vector<std::pair<SaKey, std::optional<Track>>> was;  // tracks, to put back
    JournalEntry e;
    for (Sample &s : job.sas) {
        SaConfig *sc = find(s.key);
        if (!sc)
            continue;  // deleted by a later change of the same job
        auto t = tracks_.find(s.key);
        // Sampled before a change put another SA under the key: not this one's numbers.
        if (!s.fresh && t != tracks_.end() && t->second.serial > s.serial)
            continue;
        if (s.renew) {
            was.emplace_back(s.key,
                             t == tracks_.end() ? std::nullopt : std::optional<Track>(t->second));
            const KeyFingerprint &fp = reserve(s, *sc, job.now, grants);
            if (!job.whole) {  // what the journal entry says
                e.reserved.emplace_back(s.key, uint64_t(sc->oseq_hi) << 32 | sc->oseq);
                e.ledger.emplace_back(fp, ledger_.records().at(fp));
            }
        }
        sc->seq = uint32_t(s.window.top);
        sc->seq_hi = uint32_t(s.window.top >> 32);
        if (s.has_window)
            e.windows.push_back({s.key.dst, s.key.spi, s.window});
    }
    Result<void> r;
    if (!job.whole) {
        std::string text;
        for (size_t i = 0; i < job.changes.size(); i++) {
            JournalEntry line;
            line.generation = generation_;
            line.change = job.changes[i];
            if (i + 1 == job.changes.size()) {
                line.reserved = e.reserved;
                line.ledger = e.ledger;
                line.windows = e.windows;
            }
            append_secret(text, format_journal_entry(line));
        }
        e.generation = generation_;
        if (job.changes.empty())
            text = format_journal_entry(e);
        r = journal_.append(text);
        OPENSSL_cleanse(text.data(), text.size());
        if (!r) {
            grants.clear();
            for (auto &[k, t] : was)
                if (t)
                    tracks_[k] = *t;
                else
                    tracks_.erase(k);
            return r;
        }
    }
    // On disk (or about to be, whole): into the view.
    for (const ConfigChange &ch : job.changes) {
        for (const SaKey &k : ch.del_sas) {
            windows_.erase(k);
            tracks_.erase(k);
        }
        for (const SaConfig &c : ch.put_sas)
            if (const SaConfig *old = config_.sas.find(SaKey{c.dst, c.spi});
                old && !same_keys(*old, c))
                windows_.erase(SaKey{c.dst, c.spi});  // other keys: what was seen is not
        apply_change(config_, ch);
    }
    for (auto &[k, sc] : staged)
        if (sc)
            config_.sas.replace(std::move(*sc));
    for (SavedReplay &w : e.windows)
        windows_[SaKey{w.dst, w.spi}] = std::move(w.window);
    if (job.whole) {
        ifaces_ = std::move(job.ifaces);
        renamed_ = std::move(job.renamed);
        std::erase_if(tracks_, [&](const auto &kv) { return kv.second.round != round_; });
        return write_whole();
    }
    if (!compacting_ && job.now >= compact_retry_at_ &&
        journal_.size() > std::max(journal_min_, kJournalPerSa * config_.sas.size()))
        start_compaction();  // the entry is on disk: the change stands, whatever comes of it
    return {};
}

// A new round for the whole file: every SA's key recorded in the ledger (the oldest others
// forgotten); the SAs' replay windows. The journal lines from now on carry the generation of
// this file.
std::vector<SavedReplay> StateKeeper::next_round()
{
    round_++;
    ledger_.new_round();
    std::vector<SavedReplay> replay;
    for (const SaConfig &sc : config_.sas) {
        ledger_.record(ledger_.fingerprint(sc.xf), uint64_t(sc.oseq_hi) << 32 | sc.oseq);
        if (auto w = windows_.find(SaKey{sc.dst, sc.spi}); w != windows_.end())
            replay.push_back({sc.dst, sc.spi, w->second});
    }
    ledger_.forget_oldest(config_.sas.size() + kLedgerRetiredKeys);
    ++generation_;  // the journal's lines so far: older than the file
    return replay;
}

// The whole file as the writer's view stands, copied for a thread of its own: every SA with
// its reservation and window, the ledger, the interfaces.
GatewayState StateKeeper::snapshot()
{
    GatewayState st;
    st.replay = next_round();
    st.config = config_;
    st.ledger = ledger_;
    st.ifaces = ifaces_;
    st.renamed = renamed_;
    st.netns = netns_;
    st.journal = generation_;
    return st;
}

// The whole file, written before this returns (start, stop, interfaces, after a failure)
// from the view where it is: then the journal is empty.
Result<void> StateKeeper::write_whole()
{
    end_compaction(true);  // one writer of the file at a time, the newest last
    std::vector<SavedReplay> replay = next_round();
    std::optional<std::string> netns = netns_;
    if (auto r = save_state(
            path_, StateView{config_, ifaces_, renamed_, ledger_, replay, netns, generation_});
        !r)
        return r;
    have_file_ = true;
    return journal_.reset();  // all of it is in the file now
}

// Compaction, when the journal has grown as big as the file: the file is written from a
// snapshot on a thread of its own, while changes go on being appended to the journal under
// the next generation (a crash before the file's rename reads the old file, then every line;
// after it, the new file and the lines of its generation). Once the file is on disk the
// journal loses the lines before the snapshot. Reservations are not affected: each is in a
// journal line, fsynced, before it is used, whatever the file holds.
void StateKeeper::start_compaction()
{
    try {
        std::function<void()> body = [this, st = snapshot()] {  // at the writer's nice value
            Result<void> r;
            try {
                r = save_state(path_, st);
            } catch (const std::exception &e) {
                r = make_error("state file " + path_ + ": " + e.what());
            }
            wipe_stack();  // a finished thread's stack is kept for the next one
            std::lock_guard<std::mutex> g(mu_);
            compacted_ = std::move(r);
            cv_.notify_all();
        };
        compactor_ = spawn_ ? spawn_(std::move(body)) : std::thread(std::move(body));
    } catch (const std::exception &e) {
        // The change that asked for it is on disk and stands; the snapshot's round only moved
        // the generation on, which a load reads past (every line after the file's).
        log(LogLevel::Warning,
            "state file %s: a compaction could not start: %s (the journal "
            "goes on growing)",
            path_.c_str(), e.what());
        compact_retry_at_ = now_ns() + kRetryNs;
        return;
    }
    compact_from_ = journal_.size();
    compacting_ = true;
}

// On the writer thread: takes the compaction's result (waiting for it with `wait`) and cuts
// the journal after a success.
void StateKeeper::end_compaction(bool wait)
{
    if (!compacting_)
        return;
    if (!wait) {
        std::lock_guard<std::mutex> g(mu_);
        if (!compacted_)
            return;
    }
    compactor_.join();
    Result<void> r;
    {
        std::lock_guard<std::mutex> g(mu_);
        r = std::move(*compacted_);
        compacted_.reset();
    }
    compacting_ = false;
    if (r)
        r = journal_.drop_before(compact_from_);  // else the old lines stay, and are skipped
    if (!r) {
        log(LogLevel::Warning, "%s (the journal goes on growing)", r.error().message.c_str());
        compact_retry_at_ = now_ns() + kRetryNs;
    }
}

void StateKeeper::restore_replay(Gateway &gw)
{
    if (!loaded_)
        return;
    std::unordered_map<SaKey, Sa *, SaKeyHash> by_spi;
    for (const auto &sa : gw.sas())
        if (sa)
            by_spi[SaKey{sa->config().dst, sa->config().spi}] = sa.get();
    // A window saved under the same keys comes back whatever else the configuration changed
    // (a restart with an edited config file): what the peer sent under them stays seen.
    for (const SavedReplay &r : loaded_->replay) {
        const SaConfig *saved = loaded_->config.find_sa(r.dst, r.spi);
        auto it = by_spi.find(SaKey{r.dst, r.spi});
        if (!saved || it == by_spi.end() || !same_keys(it->second->config(), *saved))
            continue;
        ReplayWindow &now = it->second->replay();
        ReplayWindow was;
        was.init(now.window(), now.esn(), 0);
        if (!was.restore(r.window)) {
            was.init(0, now.esn(), r.window.top);  // another window size: all below seen
            log(LogLevel::Warning,
                "%s: the saved replay window does not fit; everything up "
                "to its top counts as seen",
                describe_sa(r.dst, r.spi).c_str());
        }
        now.catch_up(was);
    }
    loaded_.reset();
}

// What the writer needs of the SAs, read on the data thread: no hashing, no ledger. Whole:
// every SA. Else the SAs the changes made (held here, before they have sent anything, until
// the write records their start), those at their low-water mark and those whose window moved
// (SaNotify): the work follows what moved, not the number of SAs.
StateKeeper::Job StateKeeper::sample(Gateway &gw, uint64_t now, bool whole)
{
    Job job;
    job.whole = whole;
    job.changes = std::move(changes_);
    changes_.clear();
    job.now = now;
    job.ticket = requested_;
    auto take = [&](Sa &sa, const std::shared_ptr<Sa> &ref, bool renew, bool window) {
        Sample &s = job.sas.emplace_back();
        s.sa = ref;
        s.key = SaKey{sa.config().dst, sa.config().spi};
        s.serial = sa.serial();
        s.fresh = !sa.reservation_bound();
        if (s.fresh)
            sa.hold();  // held since it was made, when the gateway holds new SAs
        s.renew = renew || s.fresh;
        s.oseq = sa.oseq();
        s.reserved = sa.reserved();
        s.has_window = window && sa.replay().window() != 0;
        if (s.has_window)
            s.window = sa.replay().snapshot();
        else
            s.window.top = sa.replay().highest();
        sa.window_saved();
    };
    if (whole) {
        need_whole_ = false;
        notify_.asking.clear();
        notify_.moved.clear();
        notify_.wake.store(false, std::memory_order_relaxed);
        job.sas.reserve(gw.sas().size());
        for (const auto &ref : gw.sas())
            if (ref)
                take(*ref, ref, true, true);
        for (const auto &i : gw.ifaces())
            if (!i.local)  // made afresh at each start
                job.ifaces.push_back({i.name, i.role, i.mode});
        for (const auto &r : gw.renamed())
            job.renamed.push_back({r.was, r.ifindex});
        return job;
    }
    // Each SA once, whatever lists it.
    std::unordered_map<const Sa *, size_t> at;
    auto note = [&](const SaKey &k, uint64_t serial, bool renew, bool window) {
        std::shared_ptr<Sa> sa = gw.sa(k);
        if (!sa || (serial && sa->serial() != serial))
            return;  // gone, or another SA under the key now
        auto [it, added] = at.try_emplace(sa.get(), job.sas.size());
        if (added) {
            take(*sa, sa, renew, window);
            return;
        }
        Sample &s = job.sas[it->second];
        s.renew |= renew;
        if (window && !s.has_window && sa->replay().window() != 0) {
            s.has_window = true;
            s.window = sa->replay().snapshot();
        }
    };
    for (const ConfigChange &ch : job.changes)
        for (const SaConfig &c : ch.put_sas)
            note(SaKey{c.dst, c.spi}, 0, false, false);  // new ones are fresh: renewed
    for (const SaNotify::Entry &e : notify_.asking)
        note(e.key, e.serial, true, false);
    for (const SaNotify::Entry &e : notify_.moved)
        note(e.key, e.serial, false, true);
    notify_.asking.clear();
    notify_.moved.clear();
    // Put again as it was, an SA runs on: only its sample's window, if listed, matters.
    std::erase_if(job.sas, [](const Sample &s) { return !s.renew && !s.has_window; });
    return job;
}

void StateKeeper::start(Job job)
{
    in_flight_ = job.ticket;
    {
        std::lock_guard<std::mutex> g(mu_);
        jobs_.push_back(std::move(job));
    }
    busy_ = true;
    cv_.notify_all();
}

// The write in flight is done: its bounds go to the SAs still running, or, if it failed,
// nothing changes and the SAs stop at the bounds they have (new ones stay held).
void StateKeeper::finish(const Result<void> &r, std::vector<Grant> &grants)
{
    busy_ = false;
    {
        std::lock_guard<std::mutex> g(mu_);
        done_ = in_flight_;
        done_result_ = r;
    }
    done_cv_.notify_all();
    if (!r) {
        if (!failing_)
            log(LogLevel::Error,
                "%s; SAs stop sending when their sequence reservation runs "
                "out (out-seq-unreserved)",
                r.error().message.c_str());
        failing_ = true;
        need_whole_ = true;  // what the failed write held: all of it again
        return;
    }
    if (failing_)
        log(LogLevel::Notice, "state file %s written again", path_.c_str());
    failing_ = false;
    // An SA deleted since it was sampled is gone: its grant goes nowhere.
    for (const Grant &g : grants)
        if (std::shared_ptr<Sa> sa = g.sa.lock()) {
            if (!sa->reservation_bound())
                sa->bind_reservation(g.start, &notify_);
            sa->reserve_to(g.last, g.low_water);
        }
}

Result<void> StateKeeper::wait_idle()
{
    if (!busy_)
        return {};
    Result<void> r;
    std::vector<Grant> grants;
    {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return result_.has_value(); });
        r = std::move(*result_);
        result_.reset();
        grants.swap(grants_);
    }
    finish(r, grants);
    return r;
}

void StateKeeper::set_config(Config config)
{
    config_ = std::move(config);
}

Result<void> StateKeeper::record_change(const ConfigChange &change,
                                        const std::vector<std::shared_ptr<Sa>> &made)
{
    Job job;
    job.whole = false;
    job.control = true;
    job.changes.push_back(change);
    job.now = now_ns();
    for (const auto &sa : made) {
        Sample &s = job.sas.emplace_back();
        s.sa = sa;
        s.key = SaKey{sa->config().dst, sa->config().spi};
        s.serial = sa->serial();
        s.fresh = !sa->reservation_bound();
        s.renew = true;
        s.oseq = sa->oseq();
        s.reserved = sa->reserved();
        s.window.top = sa->replay().highest();
    }
    std::vector<Grant> grants;
    Result<void> r;
    {
        std::unique_lock<std::mutex> lk(mu_);
        jobs_.push_back(std::move(job));
        cv_.notify_all();
        done_cv_.wait(lk, [&] { return control_result_.has_value() || stop_; });
        if (!control_result_)
            return make_error("state file " + path_ + ": the daemon stopped before writing it",
                              ESHUTDOWN);
        r = std::move(*control_result_);
        control_result_.reset();
        grants.swap(control_grants_);
    }
    if (!r)
        return r;
    // Not published yet: this thread alone sees these SAs.
    for (const Grant &g : grants)
        if (std::shared_ptr<Sa> sa = g.sa.lock()) {
            if (!sa->reservation_bound())
                sa->bind_reservation(g.start, &notify_);
            sa->reserve_to(g.last, g.low_water);
        }
    return {};
}

uint64_t StateKeeper::request_save(Gateway &, const ConfigChange *change)
{
    if (change)
        changes_.push_back(*change);
    want_ = true;  // tick() starts the write, after the one in flight
    return ++requested_;
}

Result<void> StateKeeper::wait_saved(uint64_t ticket)
{
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_ >= ticket || stop_; });
    if (done_ < ticket)
        return make_error("state file " + path_ + ": the daemon stopped before writing it",
                          ESHUTDOWN);
    return done_result_;
}

Result<void> StateKeeper::save_now(Gateway &gw)
{
    (void)wait_idle();
    request_save(gw);
    want_ = false;
    uint64_t now = now_ns();
    start(sample(gw, now, true));
    started_ = true;
    auto r = wait_idle();
    retry_at_ = r ? 0 : now + kRetryNs;
    return r;
}

void StateKeeper::tick(Gateway &gw, uint64_t now)
{
    if (busy_) {
        std::optional<Result<void>> r;
        std::vector<Grant> grants;
        {
            std::lock_guard<std::mutex> g(mu_);
            r.swap(result_);
            grants.swap(grants_);
        }
        if (!r)
            return;
        finish(*r, grants);
        if (!*r)
            retry_at_ = now + kRetryNs;
    }
    if (gw.renamed_changes() != renamed_changes_) {
        // A device renamed, or handed back: the list goes into the next whole file, so that a
        // restart after a crash lists it too.
        renamed_changes_ = gw.renamed_changes();
        need_whole_ = true;
    }
    if (want_) {  // a change waits for its write: no retry delay
        want_ = false;
        // An interface change (no configuration change) rewrites the file.
        start(sample(gw, now, changes_.empty()));
        return;
    }
    if (now < retry_at_ || !started_)
        return;
    if (need_whole_) {
        start(sample(gw, now, true));
        return;
    }
    // SAs at their low-water mark at once; moved replay windows once a second.
    bool due = notify_.wake.exchange(false, std::memory_order_relaxed);
    if (now - last_look_ >= kLookNs) {
        last_look_ = now;
        due |= !notify_.moved.empty();
    }
    if (due)
        start(sample(gw, now, false));
}

}  // namespace xesp
