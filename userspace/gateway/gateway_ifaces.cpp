// Gateway, its interfaces: attaching the classifier, the sockets on every queue, the local
// link, and detaching.
#include "userspace/gateway/gateway.h"

#include <net/if.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "userspace/base/log.h"
#include "userspace/gateway/iface_checksum.h"

namespace xesp {

namespace {

uint32_t read_uint(const std::string &path)
{
    std::ifstream f(path);
    uint32_t v = 0;
    f >> v;
    return v;
}

// RX queues of a device, as its sysfs directory lists them (veth: as created).
uint32_t rx_queues(const std::string &name)
{
    std::error_code ec;
    uint32_t n = 0;
    for (const auto &e :
         std::filesystem::directory_iterator("/sys/class/net/" + name + "/queues", ec))
        n += e.path().filename().string().rfind("rx-", 0) == 0;
    return n ? n : 1;
}

}  // namespace

// ---- Interfaces and their sockets -----------------------------------------------------------

void Gateway::close_ports()
{
    drain();  // bursts in flight hold frames of the Umem and name their ports
    for (auto &p : ports_)
        (void)prog_->clear_xsk(p->x.queue(), p->slot);
    tun_port_ = nullptr;
    ports_.clear();
    drop_tun_frames();
    pool_.reset();
    umem_.reset();
}

// Every socket shares one Umem, and a Umem cannot take sockets again once its first is gone
// (umem.h): any change to the interfaces reopens them all. Between the two, the queues have
// no socket and the classifier drops what it would redirect.
Result<void> Gateway::rebuild_ports()
{
    close_ports();
    uint32_t sockets = 0;
    for (const auto &i : ifaces_)
        sockets += i.queues;
    if (!sockets)
        return {};
    UmemOptions uo;
    uo.fill_size = options_.ring_size;
    uo.comp_size = options_.ring_size;
    uo.frame_count = sockets * options_.ring_size * 2 + uint32_t(kTxQueue) * 2;
    auto umem = Umem::create(uo);
    if (!umem)
        return umem.error();
    umem_ = std::make_unique<Umem>(std::move(*umem));
    pool_ = std::make_unique<FramePool>(*umem_);
    for (const auto &i : ifaces_) {
        for (uint32_t q = 0; q < i.queues; q++) {
            XskPortOptions po;
            po.queue = q;
            po.rx_size = options_.ring_size;
            po.tx_size = options_.ring_size;
            po.busy_poll = options_.busy_poll;
            po.skip = prog_->frame_skip();
            auto x = XskPort::open(*umem_, *pool_, i.name, po);
            if (!x) {
                close_ports();
                return x.error();
            }
            auto port = std::make_unique<Port>(Port{std::move(*x), i.ifindex, i.slot, {}, i.local});
            port->txq.reserve(kTxQueue);
            if (auto r = prog_->set_xsk(q, port->x.fd(), i.slot); !r) {
                ports_.push_back(std::move(port));
                close_ports();
                return r;
            }
            ports_.push_back(std::move(port));
        }
    }
    tun_port_ = find_tun_port();
    return {};
}

Result<void> Gateway::add_iface(const IfaceSpec &spec, bool absent_ok)
{
    const std::string &name = spec.name;
    const IfaceRole role = spec.role;
    if (name == kTunName || name == LocalLink::kKernelEnd || name == LocalLink::kGatewayEnd)
        return make_error("iface add " + name + ": a device of the gateway's own, not one to add");
    if (role == IfaceRole::Public && spec.mode == IfaceMode::Tun)
        return make_error("iface add " + name +
                          ": mode tun is for protected interfaces; a public one is always xdp");
    for (auto it = ifaces_.begin(); it != ifaces_.end(); ++it) {
        if (it->name != name)
            continue;
        if (it->absent && it->role == role && it->mode != spec.mode) {  // taken when back
            log(LogLevel::Info, "%s: mode %s when it is back, was %s", name.c_str(),
                iface_mode_name(spec.mode), iface_mode_name(it->mode));
            it->mode = spec.mode;
            it->tried = 0;  // a device of that name that refused the other mode: tried now
            macs_due_ = true;
            macs_at_ns_ = 0;
            return {};
        }
        if (!it->local && it->role == role && role == IfaceRole::Protected && it->mode != spec.mode)
            return change_mode(it, spec);
        return make_error("iface add " + name + ": " +
                          (it->local
                               ? std::string("the gateway's own local link")
                               : std::string("already added as ") +
                                     (it->role == IfaceRole::Public ? "public" : "protected") +
                                     (it->absent ? " (absent)" : "") + "; `xesp iface del " + name +
                                     "` first to change its role"));
    }
    // Absent, if allowed: not here, or here but not to be attached (kept, and not tried on
    // that device again), rather than forgotten at the next save.
    auto keep_absent = [&](uint32_t tried) {
        GatewayIface i;
        i.name = name;
        i.role = role;
        i.mode = spec.mode;
        i.absent = true;
        i.tried = tried;
        ifaces_.push_back(i);
        macs_due_ = true;  // its name is watched from the next look on
    };
    const uint32_t ifindex = if_nametoindex(name.c_str());
    if (absent_ok && !ifindex) {
        keep_absent(0);
        log(LogLevel::Warning, "%s: not in this network namespace: attached as %s when it is",
            name.c_str(), iface_role_name(role));
        if (role == IfaceRole::Public && !local_link_)
            open_local_link();
        return {};
    }
    if (auto r = attach_iface(spec, false, leftover(name)); !r) {
        if (!absent_ok)
            return r;
        keep_absent(ifindex);
        log(LogLevel::Error, "%s; kept, absent, until a device of that name is made anew",
            r.error().message.c_str());
        if (role == IfaceRole::Public) {
            guard_absent_public(name, ifindex);
            if (!local_link_)
                open_local_link();  // where the guard sends the gateway's own to encrypt
        }
        return {};
    }
    if (role == IfaceRole::Public && !local_link_)
        open_local_link();
    return {};
}

// A protected interface from one mode to the other in place (`iface add` again with the other
// mode), with no moment where neither program drops what is protected: the new program goes
// on before the old one comes off, as over what an earlier daemon left (XDP runs before the tc
// program, so whichever is attached first of the two keeps dropping until the other takes
// over). If the new mode cannot be had, the old one stays, its program on.
Result<void> Gateway::change_mode(std::vector<GatewayIface>::iterator it, const IfaceSpec &spec)
{
    const GatewayIface old = *it;
    ifaces_.erase(it);
    // From tun mode, a failure leaves the XDP program on, parked, as over a leftover.
    auto r = attach_iface(spec, false, old.mode == IfaceMode::Tun);
    if (!r) {
        // A failure after the XDP program was on may have taken the tc program with it: that
        // goes back on first, and the XDP program, which would drop before it, comes off.
        const int ifindex = int(old.ifindex);
        if (old.mode == IfaceMode::Tun) {
            bool back = XdpProgram::protected_attached(ifindex);
            if (!back) {
                auto a = prog_->attach_protected(ifindex);
                if (!a)
                    log(LogLevel::Error, "%s: tun mode back: %s", old.name.c_str(),
                        a.error().message.c_str());
                back = bool(a);
            }
            if (back) {
                if (XdpProgram::attached_to(ifindex))
                    (void)XdpProgram::detach(ifindex);
                (void)prog_->park_iface(old.ifindex, old.role, old.macs);  // tun mode's entry
            }
        }
        ifaces_.push_back(old);
        return r;
    }
    if (old.mode == IfaceMode::Xdp) {
        // Its XDP program went once the tc program was on, and tun mode has its entry; its
        // sockets go now.
        if (auto p = rebuild_ports(); !p)
            log(LogLevel::Warning, "%s: %s", old.name.c_str(), p.error().message.c_str());
    } else {
        close_unused_tun();
    }
    log(LogLevel::Info, "%s: mode %s, was %s; no moment without a program on it", old.name.c_str(),
        iface_mode_name(spec.mode), iface_mode_name(old.mode));
    return {};
}

// The local link, once there is a public interface whose egress guard can use it. Without it
// the gateway works as before: its own plaintext for protected flows is dropped.
void Gateway::open_local_link()
{
    auto l = LocalLink::create();
    if (!l) {
        log(LogLevel::Warning, "%s", l.error().message.c_str());
        return;
    }
    local_link_ = std::move(*l);
    auto r = attach_iface({LocalLink::kGatewayEnd, IfaceRole::Protected}, true);
    if (r) {
        auto gw_end = std::find_if(ifaces_.begin(), ifaces_.end(),
                                   [](const GatewayIface &i) { return i.local; });
        r = prog_->set_local_link(local_link_.kernel_ifindex(),
                                  gw_end != ifaces_.end() ? gw_end->ifindex : 0);
    }
    if (!r) {
        log(LogLevel::Warning,
            "local link: %s; the gateway's own traffic to protected sites "
            "will be dropped",
            r.error().message.c_str());
        (void)prog_->set_local_link(0, 0);  // half written, perhaps
        auto it = std::find_if(ifaces_.begin(), ifaces_.end(),
                               [](const GatewayIface &i) { return i.local; });
        if (it != ifaces_.end()) {
            forget_iface(it);
            (void)rebuild_ports();
        }
        local_link_ = LocalLink();
        return;
    }
    hops_->watch_link(local_link_.kernel_ifindex());  // its leaving is seen from now on
    log(LogLevel::Info,
        "local link %s: the gateway's own traffic for protected flows is "
        "encrypted too",
        LocalLink::kKernelEnd);
}

Result<void> Gateway::attach_iface(const IfaceSpec &spec, bool local, bool left)
{
    const std::string &name = spec.name;
    const IfaceRole role = spec.role;
    GatewayIface i;
    i.name = name;
    i.role = role;
    i.mode = spec.mode;
    i.local = local;
    i.ifindex = if_nametoindex(name.c_str());
    if (!i.ifindex)
        return make_error("iface add " + name + ": no such interface in this network namespace");
    i.mtu = read_uint("/sys/class/net/" + name + "/mtu");
    if (i.mode == IfaceMode::Tun)
        return attach_tun_mode(i);
    i.queues = std::min(rx_queues(name), XdpProgram::kMaxQueues);
    std::vector<bool> taken(XdpProgram::kMaxIfaceSlots);
    for (const auto &o : ifaces_)
        if (o.mode == IfaceMode::Xdp && !o.absent)
            taken[o.slot] = true;
    auto free = std::find(taken.begin(), taken.end(), false);
    if (free == taken.end())
        return make_error("iface add " + name + ": " + std::to_string(XdpProgram::kMaxIfaceSlots) +
                          " interfaces at most");
    i.slot = uint32_t(free - taken.begin());

    refresh_local_addresses();
    i.macs = iface_macs(i);
    // What an earlier daemon left drops what is protected: a failure below leaves a program
    // on, parked (leave_iface()), rather than hand the interface to the kernel.
    if (auto r = prog_->set_iface_role(i.ifindex, role, i.slot, i.macs); !r)
        return make_error("iface add " + name + ": " + r.error().message);
    if (auto r = prog_->attach(int(i.ifindex)); !r) {
        if (left)  // the program on it may be one of ours, parked: its entry stays so
            (void)prog_->park_iface(i.ifindex, role, i.macs);
        else
            (void)prog_->remove_iface(i.ifindex);
        return make_error("iface add " + name + ": " + r.error().message);
    }
    if (role == IfaceRole::Public)
        if (auto r = prog_->attach_egress(int(i.ifindex)); !r) {
            if (left) {
                (void)prog_->park_iface(i.ifindex, role, i.macs);
            } else {
                (void)XdpProgram::detach(int(i.ifindex));
                (void)prog_->remove_iface(i.ifindex);
            }
            return make_error("iface add " + name + ": " + r.error().message);
        }
    // What an earlier daemon left of tun mode goes once XDP, which runs before it, is on.
    if (XdpProgram::protected_attached(int(i.ifindex))) {
        if (auto r = XdpProgram::detach_protected(int(i.ifindex)); !r)
            log(LogLevel::Warning, "%s", r.error().message.c_str());
        tidy_leftover_tun();
    }
    ifaces_.push_back(i);
    hops_->watch_link(i.ifindex);  // its leaving is seen from now on, not from the next look
    auto r = rebuild_ports();
    if (r)
        relink_engine();  // the tunnel MTU follows the public side
    if (!r) {
        if (left) {
            (void)leave_iface(name);
        } else {
            forget_iface(ifaces_.end() - 1);
            (void)rebuild_ports();
        }
        return make_error("iface add " + name + ": " + r.error().message);
    }
    if (local)
        return {};
    if (role == IfaceRole::Protected) {
        ifaces_.back().warning = checksum_warning(name, i.ifindex);
        if (!ifaces_.back().warning.empty())
            log(LogLevel::Warning, "%s: %s", name.c_str(), ifaces_.back().warning.c_str());
    }
    log(LogLevel::Info,
        "%s: attached as %s, %u queue(s), MTU %u; XDP in driver mode, one program (no "
        "libxdp dispatcher)%s; AF_XDP %s mode",
        name.c_str(), iface_role_name(role), i.queues, i.mtu,
        role == IfaceRole::Public ? "; tc egress guard for the kernel's own plaintext" : "",
        ports_.empty() ? "-" : xsk_mode_name(ports_.back()->x.mode()));
    return {};
}

Result<void> Gateway::del_iface(const std::string &name)
{
    auto it = std::find_if(ifaces_.begin(), ifaces_.end(),
                           [&](const GatewayIface &i) { return i.name == name; });
    if (it == ifaces_.end()) {
        // Devices it was, renamed, whose interface is gone already: a del that failed after
        // forgetting it (it hands them back only once saved), or could not hand them back; an
        // undo that failed.
        bool found = false;
        auto r = release_renamed(name, &found);
        return found ? r : release_leftover(name);
    }
    if (it->local)
        return make_error("iface del " + name +
                          ": the gateway's own local link, not an "
                          "interface to detach");
    if (it->absent) {
        ifaces_.erase(it);
        log(LogLevel::Info, "%s: forgotten (it was absent)", name.c_str());
        // A device of that name it failed to come back on keeps our classifier, parked, or
        // (public) the egress guard alone. (The device it was, renamed, is the caller's.)
        return ours_on(int(if_nametoindex(name.c_str()))) ? release_leftover(name) : Result<void>{};
    }
    const bool sockets = it->mode == IfaceMode::Xdp;
    forget_iface(it);
    auto r = sockets ? rebuild_ports() : Result<void>{};
    if (r)
        relink_engine();
    if (!r)
        return make_error("iface del " + name +
                          ": detached, but no socket reopened: " + r.error().message);
    log(LogLevel::Info, "%s: detached", name.c_str());
    return {};
}

bool Gateway::leftover(const std::string &name)
{
    const int ifindex = int(if_nametoindex(name.c_str()));
    return ifindex && (XdpProgram::attached_to(ifindex) || XdpProgram::protected_attached(ifindex));
}

// Any of our programs on device `ifindex`: the classifier, the tun-mode tc program, or the
// egress guard (alone, as guard_absent_public() leaves it, or with the classifier).
bool Gateway::ours_on(int ifindex)
{
    return ifindex > 0 &&
           (XdpProgram::attached_to(ifindex) || XdpProgram::protected_attached(ifindex) ||
            XdpProgram::egress_attached(ifindex));
}

// Xdp mode: its entry stays, with no socket behind it, so that the program drops what it
// would redirect; a slot freed for another interface must not take that interface's traffic.
// Tun mode: the tc program stays; with no tun-mode interface left the TUN closes and the
// program drops what is protected, else what it sends goes on being encrypted.
Result<void> Gateway::leave_iface(const std::string &name)
{
    auto it = std::find_if(ifaces_.begin(), ifaces_.end(),
                           [&](const GatewayIface &i) { return i.name == name && !i.local; });
    if (it == ifaces_.end())
        return make_error("iface " + name + ": not added");
    if (it->absent) {
        ifaces_.erase(it);
        return {};
    }
    const GatewayIface gone = *it;
    ifaces_.erase(it);
    if (gone.mode == IfaceMode::Tun) {
        close_unused_tun();
        relink_engine();
    } else {
        if (auto r = prog_->park_iface(gone.ifindex, gone.role, gone.macs); !r) {
            ifaces_.push_back(gone);
            return r;
        }
        if (auto r = rebuild_ports(); !r)
            return make_error(
                "iface " + name +
                ": forgotten, its program left on, but no socket reopened: " + r.error().message);
        relink_engine();
    }
    log(LogLevel::Info, "%s: forgotten, its program left on: it drops what it would hand over",
        name.c_str());
    return {};
}

// Takes the classifier off an interface and forgets it; the caller reopens the sockets.
void Gateway::forget_iface(std::vector<GatewayIface>::iterator it)
{
    GatewayIface gone = *it;
    ifaces_.erase(it);
    if (gone.mode == IfaceMode::Tun) {
        if (auto r = XdpProgram::detach_protected(int(gone.ifindex)); !r)
            log(LogLevel::Warning, "%s", r.error().message.c_str());
        (void)prog_->remove_iface(gone.ifindex);
        close_unused_tun();
        return;
    }
    if (auto r = XdpProgram::detach(int(gone.ifindex)); !r)
        log(LogLevel::Warning, "%s", r.error().message.c_str());
    if (gone.role == IfaceRole::Public)
        if (auto r = XdpProgram::detach_egress(int(gone.ifindex)); !r)
            log(LogLevel::Warning, "%s", r.error().message.c_str());
    (void)prog_->remove_iface(gone.ifindex);
}

// An interface this daemon did not add but an earlier one left its classifier on (a stop
// leaves it attached, dropping protected traffic): `iface del` hands it back to the kernel.
Result<void> Gateway::release_leftover(const std::string &name)
{
    int ifindex = int(if_nametoindex(name.c_str()));
    if (!ifindex)
        return make_error("iface del " + name + ": not added (see `xesp iface list`)");
    return release_at(name, ifindex);
}

// The device of index `ifindex`, which interface `name` was (under that name, or renamed since),
// handed back to the kernel: our programs off it, its classifier entry gone.
Result<void> Gateway::release_at(const std::string &name, int ifindex)
{
    const bool classifier = XdpProgram::attached_to(ifindex);
    const bool tun_prog = !classifier && XdpProgram::protected_attached(ifindex);
    if (!classifier && !tun_prog) {
        if (!XdpProgram::egress_attached(ifindex))
            return make_error("iface del " + name + ": not added (see `xesp iface list`)");
        // The egress guard alone (guard_absent_public()): the kernel sends what it would drop.
        if (auto r = XdpProgram::detach_egress(ifindex); !r)
            return make_error("iface del " + name + ": " + r.error().message);
        log(LogLevel::Info, "%s: detached the egress guard; the kernel sends its traffic now",
            name.c_str());
        return {};
    }
    if (tun_prog) {
        // Tun mode: the tc program goes; the kernel forwards what it would take.
        if (auto r = XdpProgram::detach_protected(ifindex); !r)
            return make_error("iface del " + name + ": " + r.error().message);
        (void)prog_->remove_iface(uint32_t(ifindex));  // its MACs
        tidy_leftover_tun();
        log(LogLevel::Info,
            "%s: detached the tun-mode program left on it; the kernel forwards its traffic now",
            name.c_str());
        return {};
    }
    if (auto r = XdpProgram::detach(ifindex); !r)
        return make_error("iface del " + name + ": " + r.error().message);
    if (auto r = XdpProgram::detach_egress(ifindex); !r)
        return make_error("iface del " + name + ": " + r.error().message);
    (void)prog_->remove_iface(uint32_t(ifindex));  // parked by leave_iface(), if it was
    log(LogLevel::Info,
        "%s: detached the classifier left on it; the kernel forwards its traffic now",
        name.c_str());
    return {};
}

void Gateway::shutdown(bool detach)
{
    close_ports();
    (void)prog_->set_local_link(0, 0);  // the gateway's own protected traffic: dropped
    close_tun();                        // tun mode: the tc program drops what it would send
    std::string names;
    for (const auto &i : ifaces_) {
        // A device of its name it failed on: our classifier, parked, or the egress guard alone
        // (renamed since the last look: a renamed device, below).
        if (detach && i.absent && i.tried) {
            if (if_nametoindex(i.name.c_str()) != i.tried)
                note_renamed(i.name, i.tried);
            else if (ours_on(int(i.tried)))
                (void)release_at(i.name, int(i.tried));
        }
        if (i.local || i.absent)
            continue;
        names += (names.empty() ? "" : ", ") + i.name;
        if (!detach)
            continue;
        if (i.mode == IfaceMode::Tun) {
            if (auto r = XdpProgram::detach_protected(int(i.ifindex)); !r)
                log(LogLevel::Warning, "%s", r.error().message.c_str());
            continue;
        }
        if (auto r = XdpProgram::detach(int(i.ifindex)); !r)
            log(LogLevel::Warning, "%s", r.error().message.c_str());
        if (i.role == IfaceRole::Public)
            if (auto r = XdpProgram::detach_egress(int(i.ifindex)); !r)
                log(LogLevel::Warning, "%s", r.error().message.c_str());
    }
    if (detach)
        for (const auto &i : std::vector<RenamedDevice>(renamed_))
            (void)release_renamed(i.was);
    local_link_ = LocalLink();
    if (names.empty())
        return;
    if (detach)
        log(LogLevel::Notice,
            "detached from %s (--detach-on-exit): the kernel forwards their "
            "traffic now, protected flows included, in the clear",
            names.c_str());
    else
        log(LogLevel::Notice,
            "left the classifier on %s: protected traffic is dropped until "
            "the next daemon takes over (`xesp iface del` hands an interface back to the "
            "kernel)",
            names.c_str());
}

}  // namespace xesp
