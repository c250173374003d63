// The engine: SA and policy tables plus the classification that decides, per packet, whether
// it is ESP for one of our SAs (decrypt), plaintext an outbound policy protects (encrypt),
// blocked, or not ours (pass). `xesp pcap` drives it over a capture (process()); the gateway's
// XDP program does the classification in the kernel and hands the result over in the frame's
// metadata (classified_from_meta(), then process_classified()), so that no packet is looked up
// twice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "userspace/esp/sa_config.h"
#include "userspace/esp/esp.h"
#include "userspace/esp/sa.h"
#include "userspace/esp/spd.h"

namespace xesp {

struct SaKey {
    IpAddr dst;
    uint32_t spi;
    bool operator==(const SaKey &o) const = default;
};
struct FlowSaKey {
    IpAddr src, dst;
    uint32_t reqid;
    bool operator==(const FlowSaKey &o) const = default;
};
struct SaKeyHash {
    size_t operator()(const SaKey &k) const;
    size_t operator()(const FlowSaKey &k) const;
};

// SAs by (destination, SPI) for inbound ESP and by (source, destination, reqid) for templates:
// both O(1) whatever the number of tunnels.
//
// Every SA also has an id: its index in all(), given by add() and never reused. The XDP
// classifier's SA map carries these ids, so a redirected packet names its SA directly.
class SaTable {
public:
    static constexpr uint32_t kNoId = UINT32_MAX;

    uint32_t add(std::shared_ptr<Sa> sa);  // returns the SA's id
    Sa *find_in(const IpAddr &dst, uint32_t spi) const;
    Sa *find_out(const PolicyTmpl &tmpl, const FlowKey &flow) const;
    Sa *by_id(uint32_t id) const { return id < sas_.size() ? sas_[id].get() : nullptr; }
    uint32_t id_of(const Sa &sa) const;  // kNoId if the SA is not in this table
    // The SA configured exactly as `cfg` (same_sa), to be shared with another table, runtime
    // state and all; nullptr if there is none. Reads only: safe while another thread runs
    // packets through this table.
    std::shared_ptr<Sa> share(const SaConfig &cfg) const;
    const std::vector<std::shared_ptr<Sa>> &all() const { return sas_; }

private:
    std::vector<std::shared_ptr<Sa>> sas_;
    std::unordered_map<const Sa *, uint32_t> ids_;
    std::unordered_map<SaKey, Sa *, SaKeyHash> by_spi_;
    std::unordered_map<FlowSaKey, Sa *, SaKeyHash> by_flow_;
};

bool tmpl_matches(const PolicyTmpl &tmpl, const SaConfig &sa);

// What the engine knows of the links around it.
struct EngineOptions {
    uint32_t link_mtu = 0;        // MTU of the side encrypted packets leave on; 0 = no check
    IpAddr icmp_src4, icmp_src6;  // source of the ICMP errors we send; else the SA's own address
    // The gateway's own addresses. An SA without `dir` decrypts only ESP addressed to one of
    // them, as the kernel decrypts only what is delivered to it; its ESP to anywhere else is
    // our own outbound traffic reflected back (in-reflected). Unset (`xesp pcap` without
    // --local): every SA destination counts as ours.
    std::optional<std::vector<IpAddr>> local;
    // Told when an SA crosses a lifetime limit (Sa::on_expire), for every SA create() makes.
    Sa::ExpireFn on_expire;
    // Every SA create() makes is held (Sa::hold): it sends nothing until its owner binds a
    // sequence reservation (the daemon's state file, state_keeper.h).
    bool hold_new = false;
};

// What the XDP classifier found for a packet: the gateway translates struct xesp_meta
// (bpf/xesp_xdp_abi.h) into this with classified_from_meta().
struct Classified {
    // Report: an ICMP too-big about ESP for a host behind the gateway; the gateway reads it
    // (pmtu.h), the engine passes it.
    enum Kind : uint8_t { Decap, Encap, Report } kind = Decap;
    uint32_t id = 0;    // Decap: SA id (Engine::sa_id); Encap: out-policy id (policy_by_id)
    uint16_t l4 = 0;    // Decap: ESP header, bytes from the IP header (behind UDP for NAT-T);
                        // Encap: the transport header (not needed by the engine);
                        // Report: the ICMP header
    bool natt = false;  // Decap: the ESP header follows a UDP header (RFC 3948)
};

// Reads the metadata the XDP program put in front of a frame: `meta` points at the `len`
// bytes before the frame start (xsk_port.h's meta()), `p` is the frame as XskPort::rx_burst
// hands it out. Checks the magic, the kind and the offsets; then moves p.l3 to the IP header,
// sets p.l2_len to the link-layer bytes before it (Ethernet, VLAN tags), p.len to the rest of
// the frame, and fills *c. Leaves p alone and returns false for a frame without valid
// metadata: classify that one with Engine::process(). The caller clears the magic afterwards,
// as frames are reused.
bool classified_from_meta(const void *meta, size_t len, Pkt &p, Classified *c);

struct EngineStats {
    uint64_t encrypted = 0, decrypted = 0, passed = 0, dropped = 0, too_big = 0;
    uint64_t esp_unknown_spi = 0, ike = 0, keepalive = 0;
    Counters drops;  // every drop, whatever SA it belongs to

    EngineStats &operator+=(const EngineStats &o)
    {
        encrypted += o.encrypted;
        decrypted += o.decrypted;
        passed += o.passed;
        dropped += o.dropped;
        too_big += o.too_big;
        esp_unknown_spi += o.esp_unknown_spi;
        ike += o.ike;
        keepalive += o.keepalive;
        drops.packets += o.drops.packets;
        drops.bytes += o.drops.bytes;
        for (size_t i = 0; i < kDropCount; i++)
            drops.drops[i] += o.drops.drops[i];
        return *this;
    }
};

class Engine {
public:
    // With `prev`, every SA of `config` configured exactly as one of prev's is shared with
    // it, runtime state and all (sequence numbers, replay window, lifetimes, counters): a
    // change to the configuration must not restart the tunnels it leaves alone. create() only
    // reads prev, so it may run on another thread while prev carries packets; from the moment
    // the new engine carries them, prev must carry none (the SAs they share have one owner at
    // a time). On error prev is as it was.
    //
    // An SA replaced under the same keys (`sa update` with new limits) keeps its replay
    // window, as the kernel's xfrm_state_update does: take_over() brings the new SA's window
    // up to the old one's, on the thread that ran prev, before the first packet. process()
    // and process_classified() call it if nobody did.
    static Result<std::unique_ptr<Engine>> create(const Config &config, Backend backend,
                                                  const EngineOptions &options = {},
                                                  const Engine *prev = nullptr);
    void take_over();

    // Classifies and processes a burst of IP packets in place; each gets its verdict.
    void process(Pkt *const *pkts, size_t n);

    // The same for packets the XDP classifier has already looked up: cls[i] says what pkts[i]
    // is, and no table is searched again. Trusted only as far as it is cheap to check: a
    // decap id must name an SA with the packet's (destination, SPI) and encapsulation, else
    // the packet is dropped as in-no-state (a stale id, as after a reload); an encap id must
    // name an out policy, else out-no-state. Then as process(): out-no-state when the policy's
    // template has no SA (fail closed), out-policy-block for a block policy, path MTU, the
    // inbound policy check after decryption, the same counters. A rewritten packet (Encrypted,
    // Decrypted, TooBig) gets l2_len = 0: its link-layer header is the caller's to write.
    void process_classified(Pkt *const *pkts, const Classified *cls, size_t n);

    // For an Encap packet: the largest plaintext its SA still carries within the link MTU (or
    // its learnt path MTU) once encrypted, if that SA is ESP in UDP (NAT-T) in tunnel mode; 0
    // otherwise (transport mode encrypts whole datagrams only), or
    // if it cannot be told (no MTU known, no SA yet). The gateway splits bigger IPv4 packets that may be fragmented
    // before they are encrypted (fragment.h says why).
    uint32_t natt_inner_mtu(const Classified &c, const Pkt &p);

    // Ids for the XDP classifier's maps (XdpProgram::add_sa, add_policy), fixed at create()
    // and stable for the Engine's life:
    //   SA id      the SA's index in Config::sas (= its index in sas().all());
    //   policy id  the policy's index in Config::policies, whatever its direction (in and
    //              fwd policies go into the classifier's maps too; only out policies come
    //              back as Encap ids).
    static constexpr uint32_t kNoId = SaTable::kNoId;
    uint32_t sa_id(const Sa &sa) const { return sas_.id_of(sa); }  // kNoId if not ours
    Sa *sa_by_id(uint32_t id) const { return sas_.by_id(id); }     // nullptr if none
    const PolicyConfig *policy_by_id(uint32_t id) const { return spd_.by_id(id); }
    size_t policy_count() const { return spd_.size(); }

    const SaTable &sas() const { return sas_; }
    const EngineStats &stats() const { return stats_; }
    const EngineOptions &options() const { return options_; }
    // The gateway's addresses changed (EngineOptions::local).
    void set_local(std::vector<IpAddr> local) { options_.local = std::move(local); }
    // Whether sa may decrypt: `dir in`, or no `dir` and its destination is ours.
    bool inbound(const Sa &sa) const;
    // Expire notifications (soft and hard lifetimes) as they happen, for every SA (shared
    // ones too: not while another engine runs them; EngineOptions::on_expire is for that).
    void on_expire(Sa::ExpireFn fn);
    // Time limits (`limit time-*`): Sa::check_time() for every SA that has one. Call about
    // once a second, off the data path.
    void check_time(uint64_t now);

    enum class Dirn : uint8_t { None, Encap, Decap };

private:
    Dirn classify(Pkt &p, Sa **sa);
    Dirn resolve_decap(Pkt &p, const Classified &c, Sa **sa);
    Dirn resolve_encap(Pkt &p, const Classified &c, Sa **sa);
    Sa *out_sa(uint32_t id, const PolicyConfig &pol, const IpHeader &h);
    void dispatch(Pkt *const *pkts, const Dirn *dirn, Sa *const *owner, size_t n);
    Dirn classify_esp(Pkt &p, const uint8_t *ip, uint32_t esp_off, bool udp, const IpAddr &dst,
                      Sa **sa);
    Dirn check_unprotected(Pkt &p, const FlowKey &flow);
    void inbound_policy_check(Sa &sa, Pkt &p);
    bool too_big(Sa &sa, Pkt &p);
    void account(Pkt &p, Sa *sa);

    EngineOptions options_;
    SaTable sas_;
    Spd spd_;
    // By policy id: the SA of an out policy whose template names both addresses, found at
    // create() (the tables do not change afterwards). Transport templates that take the
    // addresses from the packet are looked up per packet.
    std::vector<Sa *> policy_sa_;
    std::vector<Sa *> timed_;  // the SAs with time limits
    // Replaced under the same keys: the new SA and the one whose replay window it inherits
    // (take_over()).
    std::vector<std::pair<Sa *, std::shared_ptr<Sa>>> inherit_;
    EngineStats stats_;
};

}  // namespace xesp
