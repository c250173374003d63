#include "userspace/gateway/state_keeper.h"

#include <algorithm>
#include <unordered_map>

#include "userspace/clock.h"
#include "userspace/log.h"
#include "userspace/sys_util.h"

namespace xesp {

namespace {

constexpr uint64_t kLookNs = kSecondNs;     // counters and replay windows moved?
constexpr uint64_t kRetryNs = kSecondNs;    // after a failed write

uint64_t seq_limit(const SaConfig &c) { return c.esn ? UINT64_MAX : UINT32_MAX; }

} // namespace

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
{
}

StateKeeper::~StateKeeper()
{
    {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
    }
    cv_.notify_all();
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
        GatewayState st;
        st.config = *job.config;
        for (size_t i = 0; i < st.config.sas.size() && i < job.seqs.size(); i++) {
            SaConfig &sc = st.config.sas[i];
            auto [last, top] = job.seqs[i];
            sc.oseq = uint32_t(last);
            sc.oseq_hi = uint32_t(last >> 32);
            sc.seq = uint32_t(top);
            sc.seq_hi = uint32_t(top >> 32);
        }
        st.ifaces = std::move(job.ifaces);
        st.ledger = std::move(job.ledger);
        st.replay = std::move(job.replay);
        st.netns = netns_;
        Result<void> r;
        try {
            r = save_state(path_, st);
        } catch (const std::exception &e) {     // a write that fails must not end the daemon
            r = make_error("state file " + path_ + ": " + e.what());
        }
        lk.lock();
        result_ = std::move(r);
        cv_.notify_all();
    }
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
            was.init(0, now.esn(), r.window.top);       // another window size: all below seen
            log(LogLevel::Warning, "%s: the saved replay window does not fit; everything up "
                "to its top counts as seen", describe_sa(r.dst, r.spi).c_str());
        }
        now.catch_up(was);
    }
    loaded_.reset();
}

// What the file is to hold now, and the bounds it grants (grants_). A new SA is bound here,
// before it has sent anything: at the higher of its configured counter and the ledger's
// record for its key.
StateKeeper::Job StateKeeper::snapshot(Gateway &gw, uint64_t now)
{
    Job job;
    job.config = config_;
    const auto &sas = gw.sas();
    tracks_.resize(sas.size());
    grants_.clear();
    ledger_.new_round();
    for (size_t i = 0; i < sas.size(); i++) {
        Sa &sa = *sas[i];
        Track &t = tracks_[i];
        uint64_t oseq = sa.oseq();
        if (t.serial != sa.serial()) {
            t = Track{sa.serial(), ledger_.fingerprint(sa.config().xf), oseq, now, 0};
        } else if (now > t.at) {
            uint64_t moved = oseq - t.oseq, dt = now - t.at;
            uint64_t inst = moved > UINT64_MAX / kSecondNs ? UINT64_MAX : moved * kSecondNs / dt;
            t.rate = std::max(inst, t.rate - t.rate / 4);
            t.oseq = oseq;
            t.at = now;
        }
        uint64_t limit = seq_limit(sa.config());
        if (!sa.reservation_bound()) {
            sa.bind_reservation(std::min(limit, ledger_.floor(t.fp)), &wake_);
            t.oseq = sa.oseq();
        }
        uint64_t last =
            std::max(sa.reserved(), reservation_target(sa.oseq(), t.rate, limit, policy_));
        ledger_.record(t.fp, last);
        grants_.push_back({sa.serial(), last,
                           reservation_low_water(sa.oseq(), last, t.rate, limit, policy_)});
        job.seqs.emplace_back(last, sa.replay().highest());
        if (sa.replay().window())
            job.replay.push_back({sa.config().dst, sa.config().spi, sa.replay().snapshot()});
    }
    ledger_.forget_oldest(sas.size() + kLedgerRetiredKeys);
    job.ledger = ledger_;
    for (const auto &i : gw.ifaces())
        if (!i.local)                   // made afresh at each start
            job.ifaces.emplace_back(i.name, i.role);
    return job;
}

void StateKeeper::start(Job job)
{
    {
        std::lock_guard<std::mutex> g(mu_);
        job_ = std::move(job);
    }
    busy_ = true;
    cv_.notify_all();
}

// The write in flight is done: its bounds go to the SAs still running, or, if it failed,
// nothing changes and the SAs stop at the bounds they have.
void StateKeeper::finish(Gateway &gw, const Result<void> &r)
{
    busy_ = false;
    if (!r) {
        if (!failing_)
            log(LogLevel::Error, "%s; SAs stop sending when their sequence reservation runs "
                "out (out-seq-unreserved)", r.error().message.c_str());
        failing_ = true;
        saved_activity_ = UINT64_MAX;   // the windows are not on disk: write them again
        grants_.clear();
        return;
    }
    if (failing_)
        log(LogLevel::Notice, "state file %s written again", path_.c_str());
    failing_ = false;
    std::unordered_map<uint64_t, const Grant *> by_serial;
    by_serial.reserve(grants_.size());
    for (const Grant &g : grants_)
        by_serial[g.serial] = &g;
    for (const auto &sa : gw.sas())
        if (auto it = by_serial.find(sa->serial()); it != by_serial.end())
            sa->reserve_to(it->second->last, it->second->low_water);
    grants_.clear();
}

Result<void> StateKeeper::wait_idle(Gateway &gw)
{
    if (!busy_)
        return {};
    Result<void> r;
    {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return result_.has_value(); });
        r = std::move(*result_);
        result_.reset();
    }
    finish(gw, r);
    return r;
}

Result<void> StateKeeper::save_now(Gateway &gw)
{
    (void)wait_idle(gw);
    config_ = std::make_shared<const Config>(gw.config());
    uint64_t now = now_ns();
    start(snapshot(gw, now));
    auto r = wait_idle(gw);
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
        {
            std::lock_guard<std::mutex> g(mu_);
            r.swap(result_);
        }
        if (!r)
            return;
        finish(gw, *r);
        if (!*r)
            retry_at_ = now + kRetryNs;
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
        start(snapshot(gw, now));
}

} // namespace xesp
