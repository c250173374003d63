// The XDP classifier as seen from C++: one RAII type that opens and loads the skeleton of
// its BPF object (xesp_xdp.bpf.c, linked with the tc egress program of xesp_tc.bpf.c), sets
// its read-only knobs, fills its maps and attaches the programs to interfaces.
// The map layouts are those of xesp_xdp_abi.h, shared with the program and pinned in
// abi_check.h.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "bpf/abi_check.h"
#include "bpf/policy_tuples.h"
#include "userspace/base/ip.h"
#include "userspace/base/result.h"
#include "userspace/esp/sa_config.h"

struct xesp_xdp;      // the bpftool skeletons
struct xesp_sockpol;  // (xesp_sockpol.bpf.c)

namespace xesp {

enum class XdpCounter : uint32_t {
#define XESP_XDP_COUNTER_ENUM(e, name) e = XESP_CTR_##e,
    XESP_XDP_FOREACH_COUNTER(XESP_XDP_COUNTER_ENUM)
#undef XESP_XDP_COUNTER_ENUM
};

constexpr size_t kXdpCounterCount = XESP_CTR__COUNT;

constexpr std::array<std::string_view, kXdpCounterCount> kXdpCounterNames = {
#define XESP_XDP_COUNTER_NAME(e, name) name,
    XESP_XDP_FOREACH_COUNTER(XESP_XDP_COUNTER_NAME)
#undef XESP_XDP_COUNTER_NAME
};

constexpr std::string_view xdp_counter_name(XdpCounter c)
{
    return kXdpCounterNames[size_t(c)];
}

// Summed over CPUs.
struct XdpCounters {
    std::array<uint64_t, kXdpCounterCount> v{};
    uint64_t operator[](XdpCounter c) const { return v[size_t(c)]; }
};

enum class IfaceRole : uint32_t { Protected = XESP_ROLE_PROTECTED, Public = XESP_ROLE_PUBLIC };

struct XdpOptions {
    IfaceRole default_role = IfaceRole::Protected;  // interfaces without set_iface_role()
    bool fib_lookup = true;                         // next hop in ENCAP metadata
    uint32_t max_sas = 262144;                      // 100,000 tunnels: 200,000 SAs
    uint32_t max_policy_entries = 262144;           // policies plus their portless shadows
    // The metadata of a redirected frame goes in front of the frame itself (frame_skip())
    // even where the kernel has bpf_xdp_adjust_meta; without it, it always does.
    bool meta_in_frame = false;
};

// n entries into the BPF map fd, their keys and values each laid out one after the other:
// one bpf_map_update_batch() (Linux 5.6+, for the map types that have it), else one update
// each. A batch that fails is done again one entry at a time from the first, which rewrites
// what it wrote with the same values and stops at the entry that fails, with what(i) naming
// it: `done` counts the entries written, as one by one. `batch` is cleared for good when the
// kernel has no batch update for the map (ENOTSUPP, EOPNOTSUPP, EINVAL).
Result<void> update_map_entries(int fd, const void *keys, size_t key_size, const void *values,
                                size_t value_size, size_t n, bool &batch, size_t &done,
                                const std::function<std::string(size_t)> &what);

class XdpProgram {
public:
    static Result<std::unique_ptr<XdpProgram>> load(const XdpOptions &options = {});
    ~XdpProgram();
    XdpProgram(const XdpProgram &) = delete;
    XdpProgram &operator=(const XdpProgram &) = delete;

    int prog_fd() const;
    // Bytes of metadata at the start of each frame the program redirects to a socket, for
    // its reader to skip (XskPortOptions::skip): sizeof(xesp_meta) where the metadata cannot
    // go in the area in front of the frame (XdpOptions::meta_in_frame), else 0.
    uint32_t frame_skip() const { return frame_skip_; }
    int egress_prog_fd() const;  // the tc egress program
    int xsks_fd() const;
    int sas_fd() const;
    int policies_fd() const;
    int counters_fd() const;

    // SAs that may decrypt: ESP to (dst, spi) is redirected with `sa_id` in its metadata.
    // `flags` (XESP_SA_F_*): NATT, the SA is ESP-in-UDP/4500 and raw ESP for it (or the
    // reverse) is dropped; DIR_IN, the SA is `dir in` and decrypts whatever its destination.
    // Without DIR_IN it decrypts only ESP to one of the gateway's own addresses.
    Result<void> add_sa(const IpAddr &dst, uint32_t spi, uint32_t sa_id, uint32_t flags);
    Result<void> remove_sa(const IpAddr &dst, uint32_t spi);
    // Many at once, as add_sa() one after the other would, in a few system calls (loading
    // 100,000 tunnels). On error the first `done` are in the map, the others are not.
    struct SaEntry {
        IpAddr dst;
        uint32_t spi, sa_id, flags;
    };
    Result<void> add_sas(const std::vector<SaEntry> &sas, size_t &done);

    // Policies by the caller's id. Selector, direction, priority, action and whether there is
    // a template are used; the template's contents are userspace's business.
    Result<void> add_policy(uint32_t policy_id, const PolicyConfig &p);
    Result<void> remove_policy(uint32_t policy_id);
    // Many at once, as add_policy() one after the other would (same order, same ranks), the
    // entries written in batches between the tuple table's publishes. On error the first
    // `done` are in the maps, and the others neither in the maps nor in the tuple space.
    Result<void> add_policies(const std::vector<std::pair<uint32_t, const PolicyConfig *>> &ps,
                              size_t &done);
    // Policy `old_id` (configured as `old`) becomes `new_id` (configured as `p`, same selector
    // and direction) with no moment in between where neither applies: the new entries are
    // written over the old ones before anything is deleted. It keeps the old one's place among
    // policies of equal priority, as `ip xfrm policy update` does, or with keep_place false
    // goes after all of them, as a policy deleted and added again. On error nothing changed.
    Result<void> replace_policy(uint32_t old_id, const PolicyConfig &old, uint32_t new_id,
                                const PolicyConfig &p, bool keep_place = true);
    size_t tuple_count() const { return tuples_.tuples(); }
    // How many times the tuple table was rewritten and made live (tests, diagnostics).
    uint64_t tuple_publishes() const { return publishes_; }

    // The gateway's own address, or (broadcast) an IPv4 broadcast address of its own
    // (XESP_LOCAL_*); adding it again sets its kind.
    Result<void> add_local_address(const IpAddr &a, bool broadcast = false);
    Result<void> remove_local_address(const IpAddr &a);  // one not there: done
    // An interface's role, and its slot: the range of XSKMAP entries its queues' sockets take
    // (slot < kMaxIfaceSlots). Interfaces without an entry take the default role and slot 0.
    // `macs`: the Ethernet addresses it takes frames for (struct xesp_iface); a unicast frame
    // to another is dropped where it would be handed over. None: no check.
    static constexpr uint32_t kMaxIfaceSlots = XESP_MAX_XSKS / XESP_MAX_QUEUES;
    static constexpr uint32_t kMaxQueues = XESP_MAX_QUEUES;
    static constexpr size_t kMaxIfaceMacs = XESP_IFACE_MACS;
    using Mac = std::array<uint8_t, 6>;
    Result<void> set_iface_role(uint32_t ifindex, IfaceRole role, uint32_t slot = 0,
                                const std::vector<Mac> &macs = {});
    Result<void> remove_iface(uint32_t ifindex);
    bool has_iface(uint32_t ifindex) const;
    // An entry whose queues have no socket (a range past the XSKMAP's end): what the program
    // would redirect from that interface is dropped, as by a program an earlier daemon left.
    // A tun-mode interface has one too, for its MACs: the XDP program is not on it.
    Result<void> park_iface(uint32_t ifindex, IfaceRole role, const std::vector<Mac> &macs = {});

    // The AF_XDP socket of RX queue `queue` of the interface in `slot` (fd of a bound socket).
    Result<void> set_xsk(uint32_t queue, int xsk_fd, uint32_t slot = 0);
    Result<void> clear_xsk(uint32_t queue, uint32_t slot = 0);

    Result<XdpCounters> counters() const;

    // Native-mode netlink attach: it stays after this process exits, and with no socket
    // bound the program drops what it would redirect (fail closed). Replaces a previous
    // program on the interface (such as the one a crashed gateway left).
    Result<void> attach(int ifindex);
    static Result<void> detach(int ifindex);
    // Whether an xesp classifier (this program, or one a stopped daemon left) is attached.
    static bool attached_to(int ifindex);
    // Whether xesp's tc ingress program of tun mode is on the interface.
    static bool protected_attached(int ifindex);
    // Whether xesp's egress guard (xesp_tc_egress) is on the interface.
    static bool egress_attached(int ifindex);
    // Whether a tun-mode program other than this one (an earlier daemon's) is on an interface
    // of this network namespace: it may redirect to that daemon's TUN device by its index. An
    // interface that cannot be asked counts as having one.
    bool others_protected_attached() const;

    // The tc egress program (xesp_tc_egress) on a public interface: the kernel's own plaintext
    // that an out policy protects or blocks is dropped there. Stays after this process exits.
    Result<void> attach_egress(int ifindex);
    static Result<void> detach_egress(int ifindex);
    // Where the egress program sends the kernel's own plaintext that an out policy protects,
    // and the tun-mode program the UDP it protects: a device whose far end is one of the
    // gateway's protected interfaces. 0: nowhere (the egress program drops; the tun-mode one
    // sends UDP to the TUN like the rest).
    // `gateway_end`: the far end, where the XDP program takes it: what arrives there may come
    // from the gateway's own addresses (forward_martian()); 0: none.
    Result<void> set_local_link(uint32_t ifindex, uint32_t gateway_end);
    // The tc ingress program (xesp_tc_protected) on a protected interface in tun mode: what
    // an out policy protects goes whole to the TUN device set_tun_link() names (dropped while
    // there is none), UDP to the local link while there is one; blocked plaintext is dropped,
    // the rest goes on. Stays after this process exits, and drops what it would send to the
    // TUN once the TUN is gone (fail closed); the local link's XDP program drops the UDP.
    int protected_prog_fd() const;
    Result<void> attach_protected(int ifindex);
    static Result<void> detach_protected(int ifindex);
    Result<void> set_tun_link(uint32_t ifindex);
    // A socket of the gateway's that sends ESP through the kernel (transport-mode ESP carries
    // the hosts' addresses): the egress program lets what it sends leave as it is.
    Result<void> add_own_socket(int fd);
    // Sockets with a bypass policy of their own (an IKE daemon's, set with IP_XFRM_POLICY)
    // are let through by the egress program whatever the out policies say, as the kernel lets
    // them: this marks the UDP sockets of this network namespace whose out policy is one, and
    // unmarks those whose is no longer (xesp_sockpol.bpf.c), once, on the caller's thread. A
    // mark lapses XESP_SOCK_MARK_TTL_NS after the sweep that set it. Until a sweep has run, and
    // where it fails (a kernel without BTF or socket iterators), what they send meets the out
    // policies like the rest.
    Result<void> sweep_socket_policies();
    // The same every `period` (well within the marks' lifetime) on a thread of its own, until
    // this object goes. A sweep that fails is logged once, until one works again. The thread
    // shares nothing with the others but the kernel's map.
    void sweep_socket_policies_every(std::chrono::milliseconds period);
    int sock_bypass_fd() const;  // the marks: an SK_STORAGE map, a socket's fd its key

private:
    XdpProgram() = default;
    Result<void> publish_tuples();
    void wait_for_readers();
    Result<void> apply(const TupleChange &ch, bool add);

    xesp_xdp *skel_ = nullptr;
    xesp_sockpol *sockpol_ = nullptr;  // sweep_socket_policies()
    std::thread sweeper_;              // sweep_socket_policies_every()
    std::mutex sweeper_mu_;
    std::condition_variable sweeper_cv_;
    bool sweeper_stop_ = false;
    bool batch_sas_ = true, batch_policies_ = true;  // update_map_entries()' batch
    TupleSpace tuples_;
    uint32_t live_table_ = 0;
    uint64_t flipped_ns_ = 0;  // when the live index last flipped (CLOCK_MONOTONIC)
    uint64_t publishes_ = 0;
    uint32_t frame_skip_ = 0;
};

}  // namespace xesp
