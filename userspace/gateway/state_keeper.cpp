#include "userspace/gateway/state_keeper.h"

#include <algorithm>
#include <unordered_map>

#include "userspace/base/clock.h"
#include "userspace/base/log.h"
#include "userspace/base/sys_util.h"

namespace xesp {

namespace {

constexpr uint64_t kLookNs = kSecondNs;   // counters and replay windows moved?
constexpr uint64_t kRetryNs = kSecondNs;  // after a failed write

uint64_t seq_limit(const SaConfig &c)
{
    return c.esn ? UINT64_MAX : UINT32_MAX;
}

}  // namespace

Result<std::unique_ptr<StateKeeper>> StateKeeper::open(const std::string &path,
                                                       const ReservePolicy &policy)
{
    if (auto r = check_private_dir(parent_dir(path)); !r)
        return r.error();
    auto lock = PrivateFileLock::acquire(path);
    if (!lock)
        return lock.error();
    auto saved = load_state(path);
    if (!saved)
        return saved.error();
    std::unique_ptr<StateKeeper> k(new StateKeeper(path, std::move(*lock), policy));
    if (*saved) {
        k->ledger_ = (*saved)->ledger;
        k->loaded_ = std::move(*saved);
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
        thread_.join();
}

void StateKeeper::writer()
{
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [this] { return stop_ || job_; });
        if (!job_)
            return;
        Job job = std::move(*job_);
        job_.reset();
        lk.unlock();
        std::vector<Grant> grants;
        Result<void> r;
        try {
            GatewayState st = plan(job, grants);
            r = save_state(path_, st);
        } catch (const std::exception &e) {  // a write that fails must not end the daemon
            r = make_error("state file " + path_ + ": " + e.what());
        }
        lk.lock();
        result_ = std::move(r);
        grants_ = std::move(grants);
        cv_.notify_all();
    }
}

// What the file is to hold, and the bounds it grants: every SA's reservation from its rate, a
// new SA's start from the ledger's record for its key.
GatewayState StateKeeper::plan(Job &job, std::vector<Grant> &grants)
{
    GatewayState st;
    st.config = *job.config;
    round_++;
    ledger_.new_round();
    for (size_t i = 0; i < st.config.sas.size() && i < job.sas.size(); i++) {
        SaConfig &sc = st.config.sas[i];
        Sample &s = job.sas[i];
        auto [it, added] = tracks_.try_emplace(s.serial);
        Track &t = it->second;
        uint64_t limit = seq_limit(sc);
        uint64_t start = 0, oseq = s.oseq;
        if (added)
            t = Track{ledger_.fingerprint(sc.xf), oseq, job.now, 0, 0};
        if (s.fresh) {
            start = std::max(oseq, std::min(limit, ledger_.floor(t.fp)));
            oseq = start;
            t.oseq = start;
        } else if (job.now > t.at) {
            uint64_t moved = oseq - t.oseq, dt = job.now - t.at;
            uint64_t inst = moved > UINT64_MAX / kSecondNs ? UINT64_MAX : moved * kSecondNs / dt;
            t.rate = std::max(inst, t.rate - t.rate / 4);
            t.oseq = oseq;
            t.at = job.now;
        }
        t.round = round_;
        uint64_t reserved = s.fresh ? oseq : s.reserved;
        uint64_t last = std::max(reserved, reservation_target(oseq, t.rate, limit, policy_));
        ledger_.record(t.fp, last);
        grants.push_back({std::move(s.sa), start, last,
                          reservation_low_water(oseq, last, t.rate, limit, policy_)});
        sc.oseq = uint32_t(last);
        sc.oseq_hi = uint32_t(last >> 32);
        uint64_t top = s.window.top;
        sc.seq = uint32_t(top);
        sc.seq_hi = uint32_t(top >> 32);
        if (s.has_window)
            st.replay.push_back({sc.dst, sc.spi, std::move(s.window)});
    }
    std::erase_if(tracks_, [&](const auto &kv) { return kv.second.round != round_; });
    ledger_.forget_oldest(job.sas.size() + kLedgerRetiredKeys);
    st.ledger = ledger_;
    st.ifaces = std::move(job.ifaces);
    st.netns = netns_;
    return st;
}

void StateKeeper::restore_replay(Gateway &gw)
{
    if (!loaded_)
        return;
    std::unordered_map<SaKey, Sa *, SaKeyHash> by_spi;
    for (const auto &sa : gw.sas())
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

// What the writer needs of the SAs, read on the data thread: no hashing, no ledger. A new SA
// is held here, before it has sent anything.
StateKeeper::Job StateKeeper::sample(Gateway &gw, uint64_t now)
{
    Job job;
    job.config = gw.config_ptr();
    job.now = now;
    job.ticket = requested_;
    const auto &sas = gw.sas();
    job.sas.resize(sas.size());
    for (size_t i = 0; i < sas.size(); i++) {
        Sa &sa = *sas[i];
        Sample &s = job.sas[i];
        s.sa = sas[i];
        s.serial = sa.serial();
        s.fresh = !sa.reservation_bound();
        if (s.fresh)
            sa.hold();  // held since it was made, when the gateway holds new SAs
        s.oseq = sa.oseq();
        s.reserved = sa.reserved();
        s.has_window = sa.replay().window() != 0;
        if (s.has_window)
            s.window = sa.replay().snapshot();
        else
            s.window.top = sa.replay().highest();
    }
    for (const auto &i : gw.ifaces())
        if (!i.local)  // made afresh at each start
            job.ifaces.emplace_back(i.name, i.role);
    return job;
}

void StateKeeper::start(Job job)
{
    in_flight_ = job.ticket;
    {
        std::lock_guard<std::mutex> g(mu_);
        job_ = std::move(job);
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
        saved_activity_ = UINT64_MAX;  // the windows are not on disk: write them again
        return;
    }
    if (failing_)
        log(LogLevel::Notice, "state file %s written again", path_.c_str());
    failing_ = false;
    // An SA deleted since it was sampled is gone: its grant goes nowhere.
    for (const Grant &g : grants)
        if (std::shared_ptr<Sa> sa = g.sa.lock()) {
            if (!sa->reservation_bound())
                sa->bind_reservation(g.start, &wake_);
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

uint64_t StateKeeper::request_save(Gateway &gw)
{
    config_ = gw.config_ptr();
    want_ = true;  // tick() starts the write, after the one in flight
    return ++requested_;
}

Result<void> StateKeeper::wait_saved(uint64_t ticket)
{
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [&] { return done_ >= ticket || stop_; });
    if (done_ < ticket)
        return make_error("state file " + path_ + ": the daemon stopped before writing it");
    return done_result_;
}

Result<void> StateKeeper::save_now(Gateway &gw)
{
    (void)wait_idle();
    request_save(gw);
    want_ = false;
    uint64_t now = now_ns();
    start(sample(gw, now));
    auto r = wait_idle();
    retry_at_ = r ? 0 : now + kRetryNs;
    return r;
}

// A sum that moves whenever any SA's counters or replay window move.
uint64_t StateKeeper::activity(const Gateway &gw) const
{
    uint64_t sum = 0;
    for (const auto &sa : gw.sas())
        sum += sa->oseq() + sa->replay().highest() + sa->counters().packets;
    return sum;
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
    if (want_) {  // a change waits for its write: no retry delay
        want_ = false;
        start(sample(gw, now));
        return;
    }
    if (now < retry_at_ || !config_)
        return;
    bool due = wake_.exchange(false, std::memory_order_relaxed);
    if (now - last_look_ >= kLookNs) {
        last_look_ = now;
        uint64_t a = activity(gw);
        due |= a != saved_activity_;
        saved_activity_ = a;
    }
    if (due)
        start(sample(gw, now));
}

}  // namespace xesp
