// The engine: SA and policy tables plus the classification that decides, per packet, whether
// it is ESP for one of our SAs (decrypt), plaintext an outbound policy protects (encrypt),
// blocked, or not ours (pass). `xesp pcap` drives it over a capture; the gateway's XDP program
// does the classification in the kernel and hands the result over in the frame's metadata.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "userspace/config.h"
#include "userspace/esp.h"
#include "userspace/sa.h"

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
class SaTable {
public:
    void add(std::unique_ptr<Sa> sa);
    Sa *find_in(const IpAddr &dst, uint32_t spi) const;
    Sa *find_out(const PolicyTmpl &tmpl, const FlowKey &flow) const;
    const std::vector<std::unique_ptr<Sa>> &all() const { return sas_; }

private:
    std::vector<std::unique_ptr<Sa>> sas_;
    std::unordered_map<SaKey, Sa *, SaKeyHash> by_spi_;
    std::unordered_map<FlowSaKey, Sa *, SaKeyHash> by_flow_;
};

// Policies per direction in priority order (lower first, then the order they were added).
// Linear: the gateway classifies with LPM tries in XDP; this serves `xesp pcap` and the check
// after decryption.
class Spd {
public:
    void add(const PolicyConfig &p);
    // The first policy that matches. A fragment carries no ports, so policies with port
    // selectors cannot match it; if one of those that protects or blocks would have come
    // first, *unsure is set (RFC 4301 7: such a fragment cannot be classified safely).
    const PolicyConfig *lookup(Dir dir, const FlowKey &flow, bool *unsure = nullptr) const;

private:
    std::vector<PolicyConfig> by_dir_[4];
};

bool tmpl_matches(const PolicyTmpl &tmpl, const SaConfig &sa);

// What the engine knows of the links around it.
struct EngineOptions {
    uint32_t link_mtu = 0;      // MTU of the side encrypted packets leave on; 0 = no check
    IpAddr icmp_src4, icmp_src6;   // source of the ICMP errors we send; else the SA's own address
};

struct EngineStats {
    uint64_t encrypted = 0, decrypted = 0, passed = 0, dropped = 0, too_big = 0;
    uint64_t esp_unknown_spi = 0, ike = 0, keepalive = 0;
    Counters drops;     // every drop, whatever SA it belongs to
};

class Engine {
public:
    static Result<std::unique_ptr<Engine>> create(const Config &config, Backend backend,
                                                  const EngineOptions &options = {});

    // Classifies and processes a burst of IP packets in place; each gets its verdict.
    void process(Pkt *const *pkts, size_t n);

    const SaTable &sas() const { return sas_; }
    const EngineStats &stats() const { return stats_; }
    // Expire notifications (soft and hard lifetimes) as they happen.
    void on_expire(Sa::ExpireFn fn);

    enum class Dirn : uint8_t { None, Encap, Decap };

private:
    Dirn classify(Pkt &p, Sa **sa);
    Dirn classify_esp(Pkt &p, const uint8_t *ip, uint32_t esp_off, bool udp, const IpAddr &dst,
                      Sa **sa);
    Dirn check_unprotected(Pkt &p, const FlowKey &flow);
    void inbound_policy_check(Sa &sa, Pkt &p);
    bool too_big(Sa &sa, Pkt &p);
    void account(Pkt &p, Sa *sa);

    EngineOptions options_;
    SaTable sas_;
    Spd spd_;
    EngineStats stats_;
};

} // namespace xesp
