#include "bpf/xdp_program.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <linux/membarrier.h>
#include <net/if.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "userspace/base/clock.h"
#include "userspace/base/log.h"
#include "xesp_sockpol.skel.h"
#include "xesp_xdp.skel.h"

namespace xesp {

namespace {

Error bpf_error(const std::string &what, int err)
{
    err = err < 0 ? -err : err;
    std::string hint;
    if (err == EPERM)
        hint = " (needs CAP_BPF and CAP_NET_ADMIN: run as root)";
    else if (err == EACCES)
        hint = " (the verifier refused the program, or this is not root: see the log above)";
    else if (err == E2BIG || err == ENOSPC)
        hint = " (map full: raise XdpOptions' limits)";
    return make_error(what + ": " + std::strerror(err) + hint, err);
}

Result<void> update(int fd, const void *key, const void *val, uint64_t flags, const char *what)
{
    if (bpf_map_update_elem(fd, key, val, flags) != 0)
        return bpf_error(what, errno);
    return {};
}

// The kernel's "operation not supported" (not in userspace's errno.h): a map type without
// batch operations.
constexpr int kENOTSUPP = 524;

xesp_sa_key sa_key(const IpAddr &dst, uint32_t spi)
{
    xesp_sa_key k{};
    k.family = dst.family;
    k.spi = htonl(spi);
    std::memcpy(k.dst, dst.b.data(), dst.size());
    return k;
}

xesp_addr_key addr_key(const IpAddr &a)
{
    xesp_addr_key k{};
    k.family = a.family;
    std::memcpy(k.addr, a.b.data(), a.size());
    return k;
}

std::string ifname(int ifindex)
{
    char name[IF_NAMESIZE] = {};
    if (if_indextoname(unsigned(ifindex), name))
        return name;
    return "ifindex " + std::to_string(ifindex);
}

}  // namespace

Result<void> update_map_entries(int fd, const void *keys, size_t key_size, const void *values,
                                size_t value_size, size_t n, bool &batch, size_t &done,
                                const std::function<std::string(size_t)> &what)
{
    auto *k = static_cast<const uint8_t *>(keys);
    auto *v = static_cast<const uint8_t *>(values);
    done = 0;
    if (batch && n > 1 && n <= UINT32_MAX) {
        LIBBPF_OPTS(bpf_map_batch_opts, opts, .elem_flags = BPF_ANY);
        uint32_t count = uint32_t(n);
        if (bpf_map_update_batch(fd, k, v, &count, &opts) == 0) {
            done = n;
            return {};
        }
        int err = errno;
        if (err == kENOTSUPP || err == EOPNOTSUPP || err == EINVAL)
            batch = false;
    }
    for (; done < n; done++)
        if (bpf_map_update_elem(fd, k + done * key_size, v + done * value_size, BPF_ANY) != 0)
            return bpf_error(what(done), errno);
    return {};
}

namespace {

// Whether the kernel lets an XDP program call bpf_xdp_adjust_meta: some refuse it ("program of
// this type cannot use helper"), which libbpf_probe_bpf_helper() does not recognise. Anything
// but that refusal counts as yes, so that the load itself says what is wrong.
bool has_adjust_meta()
{
    const bpf_insn insns[] = {
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_2, .imm = -8},
        {.code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_xdp_adjust_meta},
        {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = BPF_REG_0, .imm = XDP_PASS},
        {.code = BPF_JMP | BPF_EXIT},
    };
    int fd = bpf_prog_load(BPF_PROG_TYPE_XDP, nullptr, "GPL", insns, 4, nullptr);
    if (fd >= 0) {
        close(fd);
        return true;
    }
    return errno != EINVAL;
}

}  // namespace

Result<std::unique_ptr<XdpProgram>> XdpProgram::load(const XdpOptions &options)
{
    std::unique_ptr<XdpProgram> p(new XdpProgram());
    p->skel_ = xesp_xdp__open();
    if (!p->skel_)
        return bpf_error("xdp: open the BPF object", errno);
    p->skel_->rodata->default_role = uint32_t(options.default_role);
    p->skel_->rodata->fib_lookup_enabled = options.fib_lookup ? 1 : 0;
    if (int err = bpf_map__set_max_entries(p->skel_->maps.sas, options.max_sas))
        return bpf_error("xdp: size the SA map", err);
    if (int err = bpf_map__set_max_entries(p->skel_->maps.policies, options.max_policy_entries))
        return bpf_error("xdp: size the policy map", err);
    // Some kernels refuse bpf_xdp_adjust_meta to XDP programs; the metadata then goes in
    // front of the frame (see meta_in_frame in xesp_xdp.bpf.c).
    bool in_frame = options.meta_in_frame || !has_adjust_meta();
    p->skel_->rodata->meta_in_frame = in_frame ? 1 : 0;
    p->frame_skip_ = in_frame ? uint32_t(sizeof(xesp_meta)) : 0;
    if (int err = xesp_xdp__load(p->skel_))
        return bpf_error("xdp: load the program (the verifier log is on stderr)", err);
    return p;
}

XdpProgram::~XdpProgram()
{
    if (sweeper_.joinable()) {
        {
            std::lock_guard<std::mutex> g(sweeper_mu_);
            sweeper_stop_ = true;
        }
        sweeper_cv_.notify_all();
        sweeper_.join();
    }
    xesp_sockpol__destroy(sockpol_);
    xesp_xdp__destroy(skel_);
}

int XdpProgram::prog_fd() const
{
    return bpf_program__fd(skel_->progs.xesp_xdp);
}
int XdpProgram::egress_prog_fd() const
{
    return bpf_program__fd(skel_->progs.xesp_tc_egress);
}
int XdpProgram::xsks_fd() const
{
    return bpf_map__fd(skel_->maps.xsks);
}
int XdpProgram::sas_fd() const
{
    return bpf_map__fd(skel_->maps.sas);
}
int XdpProgram::policies_fd() const
{
    return bpf_map__fd(skel_->maps.policies);
}
int XdpProgram::counters_fd() const
{
    return bpf_map__fd(skel_->maps.counters);
}

Result<void> XdpProgram::add_sa(const IpAddr &dst, uint32_t spi, uint32_t sa_id, uint32_t flags)
{
    if (dst.family != 4 && dst.family != 6)
        return make_error("xdp sa " + std::to_string(sa_id) + ": destination has no family");
    xesp_sa_key k = sa_key(dst, spi);
    xesp_sa_val v{sa_id, flags};
    return update(sas_fd(), &k, &v, BPF_ANY, ("xdp sa add dst " + dst.str()).c_str());
}

Result<void> XdpProgram::add_sas(const std::vector<SaEntry> &sas, size_t &done)
{
    done = 0;
    std::vector<xesp_sa_key> keys;
    std::vector<xesp_sa_val> vals;
    keys.reserve(sas.size());
    vals.reserve(sas.size());
    Result<void> bad;
    for (const SaEntry &e : sas) {
        if (e.dst.family != 4 && e.dst.family != 6) {  // what add_sa() says, in its turn
            bad = make_error("xdp sa " + std::to_string(e.sa_id) + ": destination has no family");
            break;
        }
        keys.push_back(sa_key(e.dst, e.spi));
        vals.push_back(xesp_sa_val{e.sa_id, e.flags});
    }
    if (auto r = update_map_entries(sas_fd(), keys.data(), sizeof(xesp_sa_key), vals.data(),
                                    sizeof(xesp_sa_val), keys.size(), batch_sas_, done,
                                    [&](size_t i) { return "xdp sa add dst " + sas[i].dst.str(); });
        !r)
        return r;
    return bad;
}

Result<void> XdpProgram::remove_sa(const IpAddr &dst, uint32_t spi)
{
    xesp_sa_key k = sa_key(dst, spi);
    if (bpf_map_delete_elem(sas_fd(), &k) != 0)
        return bpf_error("xdp sa del dst " + dst.str() + " spi " + std::to_string(spi), errno);
    return {};
}

// Waits until no XDP call can still be reading the table the last flip retired.
//
// An XDP call reads the live index once, then walks that table through a pointer into the map
// (bpf_map_lookup_elem on an array copies nothing), and a map update rewrites an array
// element in place, not atomically. Right after a flip the idle table is the one that calls
// started before the flip may still be walking: rewriting it at once could show such a call
// a half-written table (a count past the tuples written, a tuple whose masks do not match its
// entries) and make it miss a policy, so that protected plaintext leaves in the clear or
// allowed traffic is dropped. Every XDP call runs inside an RCU read-side section, so after
// one RCU grace period since the flip none is left: membarrier(MEMBARRIER_CMD_GLOBAL) waits
// for one (synchronize_rcu() in the kernel, when more than one CPU is online; with one, no
// call can be under way while this thread runs, XDP running with bottom halves off).
//
// A grace period costs milliseconds, so it is waited for only when the flip is recent: no
// XDP call lasts a second. One change publishes at most once or twice (a tuple appears or
// goes), and only changes that add or remove a policy shape do, so an apply of many policies
// waits once per new shape at most (XESP_MAX_TUPLES). Where membarrier is refused (nohz_full
// CPUs give EINVAL), the wait is the rest of that second.
//
// What cannot be tested deterministically: the window is an XDP call on another CPU between
// its read of the index and its last read of the table, a few microseconds; tests check that
// many publishes in a row leave the right table live.
void XdpProgram::wait_for_readers()
{
    constexpr uint64_t kLongestCall = kSecondNs;
    uint64_t since = now_ns() - flipped_ns_;
    if (!flipped_ns_ || since >= kLongestCall)
        return;
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0)
        return;
    uint64_t rest = kLongestCall - since;
    timespec ts{time_t(rest / kSecondNs), long(rest % kSecondNs)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// The idle table is rewritten, once no XDP call can be reading it, then the live index flips
// to it.
Result<void> XdpProgram::publish_tuples()
{
    xesp_tuple_table tt = tuples_.table();
    uint32_t idle = live_table_ ^ 1, zero = 0;
    wait_for_readers();
    if (auto r = update(bpf_map__fd(skel_->maps.tuple_tables), &idle, &tt, BPF_ANY,
                        "xdp: write the tuple table");
        !r)
        return r;
    if (auto r = update(bpf_map__fd(skel_->maps.tuple_ctl), &zero, &idle, BPF_ANY,
                        "xdp: switch tuple tables");
        !r)
        return r;
    live_table_ = idle;
    flipped_ns_ = now_ns();
    publishes_++;
    return {};
}

Result<void> XdpProgram::apply(const TupleChange &ch, bool add)
{
    if (add && ch.table_changed)
        if (auto r = publish_tuples(); !r)
            return r;
    for (const auto &[k, v] : ch.put)
        if (auto r = update(policies_fd(), &k, &v, BPF_ANY, "xdp: write a policy"); !r)
            return r;
    for (const auto &k : ch.erase)
        if (bpf_map_delete_elem(policies_fd(), &k) != 0 && errno != ENOENT)
            return bpf_error("xdp: delete a policy", errno);
    if (!add && ch.table_changed)
        return publish_tuples();
    return {};
}

Result<void> XdpProgram::add_policy(uint32_t policy_id, const PolicyConfig &p)
{
    auto ch = tuples_.add(policy_id, p);
    if (!ch)
        return ch.error();
    return apply(*ch, true);
}

Result<void>
XdpProgram::add_policies(const std::vector<std::pair<uint32_t, const PolicyConfig *>> &ps,
                         size_t &done)
{
    done = 0;
    std::vector<xesp_policy_key> keys;
    std::vector<xesp_policy_val> vals;
    std::vector<size_t> ends;  // of each policy's entries in keys, from `done` on
    // Unwritten policies leave the tuple space again, newest first; their entries were
    // never written (deleting them finds nothing), a shadow they share is put back.
    auto forget = [&](size_t from, size_t to) {
        for (size_t i = to; i-- > from;)
            if (auto ch = tuples_.remove(ps[i].first))
                (void)apply(*ch, false);
    };
    // The entries gathered so far, in one batch; a policy counts once all of its are in.
    auto flush = [&]() -> Result<void> {
        size_t written = 0;
        auto r =
            update_map_entries(policies_fd(), keys.data(), sizeof(xesp_policy_key), vals.data(),
                               sizeof(xesp_policy_val), keys.size(), batch_policies_, written,
                               [](size_t) { return std::string("xdp: write a policy"); });
        size_t first = done;
        while (done - first < ends.size() && ends[done - first] <= written)
            done++;
        if (!r)
            forget(done, first + ends.size());
        keys.clear();
        vals.clear();
        ends.clear();
        return r;
    };
    for (size_t i = 0; i < ps.size(); i++) {
        auto ch = tuples_.add(ps[i].first, *ps[i].second);
        if (!ch) {
            if (auto r = flush(); !r)
                return r;
            return ch.error();
        }
        if (ch->table_changed) {
            // What came before is written before the table changes, as one by one.
            if (auto r = flush(); !r) {
                forget(i, i + 1);
                return r;
            }
            if (auto r = publish_tuples(); !r) {
                forget(i, i + 1);
                return r;
            }
        }
        for (const auto &[k, v] : ch->put) {
            keys.push_back(k);
            vals.push_back(v);
        }
        ends.push_back(keys.size());
    }
    return flush();
}

Result<void> XdpProgram::remove_policy(uint32_t policy_id)
{
    auto ch = tuples_.remove(policy_id);
    if (!ch)
        return ch.error();
    return apply(*ch, false);
}

Result<void> XdpProgram::replace_policy(uint32_t old_id, const PolicyConfig &old, uint32_t new_id,
                                        const PolicyConfig &p, bool keep_place)
{
    // The new policy takes the old one's place among equal priorities, as in the SPD.
    std::optional<uint32_t> order = tuples_.order_of(old_id);
    auto rm = tuples_.remove(old_id);
    if (!rm)
        return rm.error();
    auto add = tuples_.add(new_id, p, keep_place ? order : std::nullopt);
    if (!add) {
        (void)tuples_.add(old_id, old, order);  // it was there a moment ago: cannot fail
        return add.error();
    }
    // Entries first (under the live tuple table they overwrite the old ones, or sit unseen in
    // a tuple not yet published), then the table, then what is left of the old policy.
    for (const auto &[k, v] : add->put)
        if (auto r = update(policies_fd(), &k, &v, BPF_ANY, "xdp: write a policy"); !r)
            return r;
    if (rm->table_changed || add->table_changed)
        if (auto r = publish_tuples(); !r)
            return r;
    for (const auto &k : rm->erase) {
        bool rewritten = false;
        for (const auto &put : add->put)
            rewritten |= std::memcmp(&put.first, &k, sizeof(k)) == 0;
        if (!rewritten && bpf_map_delete_elem(policies_fd(), &k) != 0 && errno != ENOENT)
            return bpf_error("xdp: delete a policy", errno);
    }
    for (const auto &[k, v] : rm->put) {  // shadow ranks the old policy no longer holds
        bool rewritten = false;
        for (const auto &put : add->put)
            rewritten |= std::memcmp(&put.first, &k, sizeof(k)) == 0;
        if (!rewritten)
            if (auto r = update(policies_fd(), &k, &v, BPF_ANY, "xdp: write a policy"); !r)
                return r;
    }
    return {};
}

Result<void> XdpProgram::add_local_address(const IpAddr &a, bool broadcast)
{
    xesp_addr_key k = addr_key(a);
    uint32_t kind = broadcast ? XESP_LOCAL_BROADCAST : XESP_LOCAL_OWN;
    return update(bpf_map__fd(skel_->maps.local_addrs), &k, &kind, BPF_ANY,
                  ("xdp: add local address " + a.str()).c_str());
}

Result<void> XdpProgram::remove_local_address(const IpAddr &a)
{
    xesp_addr_key k = addr_key(a);
    if (bpf_map_delete_elem(bpf_map__fd(skel_->maps.local_addrs), &k) != 0 && errno != ENOENT)
        return bpf_error("xdp: remove local address " + a.str(), errno);
    return {};
}

// An interface's entry; more MACs than it holds, or none: no check.
static xesp_iface iface_entry(IfaceRole role, uint32_t xsk_base,
                              const std::vector<XdpProgram::Mac> &macs)
{
    xesp_iface v{};
    v.role = uint32_t(role);
    v.xsk_base = xsk_base;
    if (macs.size() <= XdpProgram::kMaxIfaceMacs) {
        for (size_t i = 0; i < macs.size(); i++)
            std::memcpy(v.macs[i], macs[i].data(), sizeof v.macs[i]);
        v.nmacs = uint8_t(macs.size());
    }
    return v;
}

Result<void> XdpProgram::set_iface_role(uint32_t ifindex, IfaceRole role, uint32_t slot,
                                        const std::vector<Mac> &macs)
{
    if (slot >= kMaxIfaceSlots)
        return make_error("xdp: interface slot " + std::to_string(slot) + " out of range (" +
                          std::to_string(kMaxIfaceSlots) + " interfaces at most)");
    xesp_iface v = iface_entry(role, slot * kMaxQueues, macs);
    return update(bpf_map__fd(skel_->maps.ifaces), &ifindex, &v, BPF_ANY,
                  ("xdp: set the role of " + ifname(int(ifindex))).c_str());
}

Result<void> XdpProgram::park_iface(uint32_t ifindex, IfaceRole role, const std::vector<Mac> &macs)
{
    xesp_iface v = iface_entry(role, XESP_MAX_XSKS, macs);
    return update(bpf_map__fd(skel_->maps.ifaces), &ifindex, &v, BPF_ANY,
                  ("xdp: park " + ifname(int(ifindex))).c_str());
}

Result<void> XdpProgram::set_local_link(uint32_t ifindex, uint32_t gateway_end)
{
    // The gateway's end first when there is one, and last when there is none: what the tc
    // programs send there always finds the XDP program told of it.
    const uint32_t kernel = 0, gateway = 1;
    int fd = bpf_map__fd(skel_->maps.local_link);
    if (gateway_end)
        if (auto r = update(fd, &gateway, &gateway_end, BPF_ANY, "xdp: set the local link"); !r)
            return r;
    if (auto r = update(fd, &kernel, &ifindex, BPF_ANY, "xdp: set the local link"); !r)
        return r;
    if (!gateway_end)
        return update(fd, &gateway, &gateway_end, BPF_ANY, "xdp: set the local link");
    return {};
}

Result<void> XdpProgram::add_own_socket(int fd)
{
    uint64_t cookie = 0;
    socklen_t len = sizeof(cookie);
    if (getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len) != 0)
        return bpf_error("xdp: the cookie of socket " + std::to_string(fd), errno);
    uint32_t one = 1;
    return update(bpf_map__fd(skel_->maps.own_sockets), &cookie, &one, BPF_ANY,
                  "xdp: register one of the gateway's sockets");
}

int XdpProgram::sock_bypass_fd() const
{
    return bpf_map__fd(skel_->maps.sock_bypass);
}

Result<void> XdpProgram::sweep_socket_policies()
{
    if (!sockpol_) {
        xesp_sockpol *s = xesp_sockpol__open();
        if (!s)
            return bpf_error("socket policies: open the BPF object", errno);
        auto fail = [s](const char *what, int err) {
            xesp_sockpol__destroy(s);
            return bpf_error(std::string("socket policies: ") + what, err);
        };
        if (int err = bpf_map__reuse_fd(s->maps.sock_bypass, sock_bypass_fd()))
            return fail("share the classifier's socket map", err);
        if (int err = xesp_sockpol__load(s))
            return fail("load the iterator (the verifier log is on stderr)", err);
        s->links.sweep_udp_sockets = bpf_program__attach_iter(s->progs.sweep_udp_sockets, nullptr);
        if (!s->links.sweep_udp_sockets)
            return fail("attach the UDP socket iterator", errno);
        sockpol_ = s;
    }
    // One read walks every UDP socket of this network namespace: the program writes nothing.
    int fd = bpf_iter_create(bpf_link__fd(sockpol_->links.sweep_udp_sockets));
    if (fd < 0)
        return bpf_error("socket policies: start a walk of the UDP sockets", errno);
    char buf[64];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    }
    int err = n < 0 ? errno : 0;
    close(fd);
    if (err)
        return bpf_error("socket policies: walk the UDP sockets", err);
    return {};
}

void XdpProgram::sweep_socket_policies_every(std::chrono::milliseconds period)
{
    if (sweeper_.joinable())
        return;
    sweeper_ = std::thread([this, period] {
        bool failing = false;
        std::unique_lock<std::mutex> lk(sweeper_mu_);
        while (!sweeper_cv_.wait_for(lk, period, [this] { return sweeper_stop_; })) {
            lk.unlock();
            auto r = sweep_socket_policies();
            if (!r && !failing)
                log(LogLevel::Warning,
                    "%s: IKE from sockets with a bypass policy of their own meets the out "
                    "policies",
                    r.error().message.c_str());
            else if (r && failing)
                log(LogLevel::Notice, "socket policies: sweeps work again");
            failing = !r;
            lk.lock();
        }
    });
}

Result<void> XdpProgram::remove_iface(uint32_t ifindex)
{
    if (bpf_map_delete_elem(bpf_map__fd(skel_->maps.ifaces), &ifindex) != 0 && errno != ENOENT)
        return bpf_error("xdp: forget interface " + ifname(int(ifindex)), errno);
    return {};
}

bool XdpProgram::has_iface(uint32_t ifindex) const
{
    xesp_iface v;
    return bpf_map_lookup_elem(bpf_map__fd(skel_->maps.ifaces), &ifindex, &v) == 0;
}

static Result<uint32_t> xsk_key(uint32_t queue, uint32_t slot)
{
    if (queue >= XdpProgram::kMaxQueues || slot >= XdpProgram::kMaxIfaceSlots)
        return make_error("xdp: queue " + std::to_string(queue) + " of interface slot " +
                          std::to_string(slot) + " out of range (" +
                          std::to_string(XdpProgram::kMaxQueues) + " queues at most)");
    return slot * XdpProgram::kMaxQueues + queue;
}

Result<void> XdpProgram::set_xsk(uint32_t queue, int xsk_fd, uint32_t slot)
{
    auto key = xsk_key(queue, slot);
    if (!key)
        return key.error();
    uint32_t fd = uint32_t(xsk_fd);
    return update(xsks_fd(), &*key, &fd, BPF_ANY,
                  ("xdp: bind queue " + std::to_string(queue) + " to its AF_XDP socket").c_str());
}

Result<void> XdpProgram::clear_xsk(uint32_t queue, uint32_t slot)
{
    auto key = xsk_key(queue, slot);
    if (!key)
        return key.error();
    if (bpf_map_delete_elem(xsks_fd(), &*key) != 0 && errno != ENOENT)
        return bpf_error("xdp: unbind queue " + std::to_string(queue), errno);
    return {};
}

Result<XdpCounters> XdpProgram::counters() const
{
    int ncpu = libbpf_num_possible_cpus();
    if (ncpu <= 0)
        return bpf_error("xdp counters: count the CPUs", ncpu);
    std::vector<uint64_t> per_cpu(static_cast<size_t>(ncpu));
    XdpCounters c;
    for (uint32_t i = 0; i < kXdpCounterCount; i++) {
        if (bpf_map_lookup_elem(counters_fd(), &i, per_cpu.data()) != 0)
            return bpf_error("xdp counters: read " + std::string(kXdpCounterNames[i]), errno);
        for (uint64_t v : per_cpu)
            c.v[i] += v;
    }
    return c;
}

Result<void> XdpProgram::attach(int ifindex)
{
    if (int err = bpf_xdp_attach(ifindex, prog_fd(), XDP_FLAGS_DRV_MODE, nullptr))
        return bpf_error("xdp: attach to " + ifname(ifindex) +
                             " in driver mode (does its driver support native XDP?)",
                         err);
    return {};
}

Result<void> XdpProgram::detach(int ifindex)
{
    if (int err = bpf_xdp_detach(ifindex, XDP_FLAGS_DRV_MODE, nullptr))
        return bpf_error("xdp: detach from " + ifname(ifindex), err);
    return {};
}

namespace {

// The tc filter where our programs go (handle 1, priority 1) on one side: bpf_tc_query's
// result, and the program's id in *id. Ingress: tun mode's; egress: the egress guard.
int tc_filter(int ifindex, bpf_tc_attach_point point, uint32_t *id)
{
    LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = point);
    LIBBPF_OPTS(bpf_tc_opts, opts, .handle = 1, .priority = 1);
    const int rc = bpf_tc_query(&hook, &opts);
    *id = opts.prog_id;
    return rc;
}

// Whether the program `id` is the one named `name` (as the kernel keeps it: 15 characters).
bool prog_named(uint32_t id, const char *name)
{
    int fd = bpf_prog_get_fd_by_id(id);
    if (fd < 0)
        return false;
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    bool ours = bpf_obj_get_info_by_fd(fd, &info, &len) == 0 &&
                std::strncmp(info.name, name, sizeof(info.name) - 1) == 0;
    close(fd);
    return ours;
}

}  // namespace

bool XdpProgram::attached_to(int ifindex)
{
    uint32_t id = 0;
    if (bpf_xdp_query_id(ifindex, XDP_FLAGS_DRV_MODE, &id) != 0 || !id)
        return false;
    return prog_named(id, "xesp_xdp");
}

bool XdpProgram::others_protected_attached() const
{
    bpf_prog_info mine{};
    uint32_t len = sizeof(mine);
    if (bpf_obj_get_info_by_fd(protected_prog_fd(), &mine, &len) != 0)
        return true;
    struct if_nameindex *all = if_nameindex();
    if (!all)
        return true;
    bool found = false;
    for (const struct if_nameindex *i = all; i->if_index && !found; i++) {
        uint32_t id = 0;
        const int rc = tc_filter(int(i->if_index), BPF_TC_INGRESS, &id);
        if (rc == -ENOENT || rc == -EINVAL)  // no clsact, or no filter at handle 1
            continue;
        found = rc != 0 || (id != mine.id && prog_named(id, "xesp_tc_protected"));
    }
    if_freenameindex(all);
    return found;
}

bool XdpProgram::protected_attached(int ifindex)
{
    uint32_t id = 0;
    return tc_filter(ifindex, BPF_TC_INGRESS, &id) == 0 && id &&
           prog_named(id, "xesp_tc_protected");
}

bool XdpProgram::egress_attached(int ifindex)
{
    uint32_t id = 0;
    return tc_filter(ifindex, BPF_TC_EGRESS, &id) == 0 && id && prog_named(id, "xesp_tc_egress");
}

namespace {

// A tc program on one side of an interface (clsact, handle 1, priority 1), replacing whatever
// was there; `what` names it in errors.
Result<void> tc_attach(int ifindex, bpf_tc_attach_point point, int prog_fd, const char *what)
{
    LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = point);
    int err = bpf_tc_hook_create(&hook);
    if (err && err != -EEXIST)
        return bpf_error("tc: create the clsact qdisc on " + ifname(ifindex), err);
    LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = prog_fd, .flags = BPF_TC_F_REPLACE, .handle = 1,
                .priority = 1);
    if (int e = bpf_tc_attach(&hook, &opts))
        return bpf_error(std::string("tc: attach the ") + what + " to " + ifname(ifindex), e);
    return {};
}

Result<void> tc_detach(int ifindex, bpf_tc_attach_point point, const char *what)
{
    LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = ifindex, .attach_point = point);
    LIBBPF_OPTS(bpf_tc_opts, opts, .handle = 1, .priority = 1);
    int err = bpf_tc_detach(&hook, &opts);
    if (err && err != -ENOENT && err != -EINVAL)  // no filter, or no clsact qdisc at all
        return bpf_error(std::string("tc: detach the ") + what + " from " + ifname(ifindex), err);
    return {};
}

}  // namespace

Result<void> XdpProgram::attach_egress(int ifindex)
{
    return tc_attach(ifindex, BPF_TC_EGRESS, egress_prog_fd(), "egress program");
}

Result<void> XdpProgram::detach_egress(int ifindex)
{
    return tc_detach(ifindex, BPF_TC_EGRESS, "egress program");
}

int XdpProgram::protected_prog_fd() const
{
    return bpf_program__fd(skel_->progs.xesp_tc_protected);
}

Result<void> XdpProgram::attach_protected(int ifindex)
{
    return tc_attach(ifindex, BPF_TC_INGRESS, protected_prog_fd(), "protected-side program");
}

Result<void> XdpProgram::detach_protected(int ifindex)
{
    return tc_detach(ifindex, BPF_TC_INGRESS, "protected-side program");
}

Result<void> XdpProgram::set_tun_link(uint32_t ifindex)
{
    uint32_t zero = 0;
    return update(bpf_map__fd(skel_->maps.tun_link), &zero, &ifindex, BPF_ANY,
                  "xdp: set the tun link");
}

}  // namespace xesp
