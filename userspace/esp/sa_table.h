// The SA table: every SA of an engine by id (what the XDP classifier names), by destination
// and SPI (inbound ESP), and by flow (outbound templates), each O(1) whatever the number of
// tunnels; and the ids' pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "userspace/base/flat_map.h"
#include "userspace/esp/esp.h"
#include "userspace/esp/sa.h"
#include "userspace/esp/sa_config.h"

namespace xesp {

struct FlowSaKey {
    IpAddr src, dst;
    uint32_t reqid;
    bool operator==(const FlowSaKey &o) const = default;
};
struct SaKeyHash {
    size_t operator()(const SaKey &k) const;
    size_t operator()(const FlowSaKey &k) const { return flow(k.src, k.dst, k.reqid); }
    // The FlowSaKey's hash from its parts where they are: a key just built on the stack and
    // read back in words would stall on store forwarding.
    static size_t flow(const IpAddr &src, const IpAddr &dst, uint32_t reqid);
};

// The SAs that may carry one outbound flow (source, destination, reqid), for templates that
// name no SPI. An out policy whose template names the flow whole (both addresses) is linked
// to it (SaTable::link(), kept in the policy's SPD slot and cells by Engine), so that a packet
// goes from its policy to its SA without a hash lookup, as a VPP policy names its SA: the flow
// stays where it is while a policy links it, with or without SAs, and rekeys change its SAs,
// never the policy.
struct OutFlow {
    Sa *newest = nullptr;  // the one that carries the flow; first, for the data path
    std::vector<std::pair<uint64_t, Sa *>> all;  // by order
    FlowSaKey key;
    uint32_t links = 0;  // policies linked to it
};

// SAs by (destination, SPI) for inbound ESP and by (source, destination, reqid) for templates:
// both O(1) whatever the number of tunnels; and by id.
//
// Every SA has an id, given by its owner: the XDP classifier's SA map carries it, so a
// redirected packet names its SA directly. The low 24 bits are an index into the table,
// the high 8 a generation, so that an id from a moment ago does not name the SA that took
// its index since. Several SAs may serve one flow (a rekey adds the new one before the old
// one goes): the one with the highest `order` wins, as the newest SA does in the kernel.
class SaTable {
public:
    static constexpr uint32_t kNoId = UINT32_MAX;
    static constexpr uint32_t kIndexMask = 0xffffff;

    // Adds sa under `id`, or puts it in place of the SA with that id (same destination and
    // SPI: `sa update`). An SA put in place keeps its order.
    void put(uint32_t id, uint64_t order, std::shared_ptr<Sa> sa);
    void remove(uint32_t id);
    uint32_t add(std::shared_ptr<Sa> sa);  // put() with the next index; returns the id

    Sa *find_in(const IpAddr &dst, uint32_t spi) const;
    Sa *find_out(const PolicyTmpl &tmpl, const FlowKey &flow) const;
    // find_out() in steps, for a burst whose packets each take a cache miss at every step:
    // out_key() names what the template looks for (addresses the template leaves out are
    // the packet's own, from `flow`) and asks for its slot; out_candidate() finds the SA and
    // asks for its runtime part; out_check() decides. out_check(out_candidate(k), k) is
    // find_out().
    struct OutKey {
        FlowSaKey flow;
        uint64_t hash;
        uint32_t spi;  // the template's; 0: by flow
        Mode mode;
        const OutFlow *found = nullptr;  // out_candidate()'s, for out_check()
    };
    OutKey out_key(const PolicyTmpl &tmpl, const FlowKey &flow) const;
    Sa *out_candidate(OutKey &k) const;
    Sa *out_check(Sa *candidate, const OutKey &k) const;
    Sa *by_id(uint32_t id) const
    {
        size_t i = id & kIndexMask;
        return i < slots_.size() && slots_[i].id == id ? slots_[i].sa.get() : nullptr;
    }
    void prefetch_id(uint32_t id) const
    {
        size_t i = id & kIndexMask;
        if (i < slots_.size())
            __builtin_prefetch(&slots_[i]);
    }
    uint32_t id_of(const Sa &sa) const;  // kNoId if the SA is not in this table
    const std::shared_ptr<Sa> &ref(uint32_t id) const;
    // The SA configured exactly as `cfg` (same_sa), to be shared with another table, runtime
    // state and all; nullptr if there is none. Reads only: safe while another thread runs
    // packets through this table.
    std::shared_ptr<Sa> share(const SaConfig &cfg) const;
    // Every SA, by index; an index without an SA holds nullptr.
    const std::vector<std::shared_ptr<Sa>> &all() const { return all_; }
    size_t size() const { return count_; }
    size_t flows() const { return by_flow_.size(); }  // OutFlows: with SAs, or linked
    // The SAs with time limits (Sa::check_time), in no order: one leaves in O(1), the last
    // taking its place.
    const std::vector<Sa *> &timed() const { return timed_; }

    // The flow of an out policy's template, held until unlink(): see OutFlow.
    const OutFlow *link(const FlowSaKey &k);
    void unlink(const OutFlow *f);

private:
    static constexpr uint32_t kNotTimed = UINT32_MAX;
    struct Slot {
        uint32_t id = kNoId;
        uint32_t timed_at = kNotTimed;  // its SA's place in timed_
        uint64_t order = 0;
        std::shared_ptr<Sa> sa;
    };
    void index(Slot &s);
    void unindex(Slot &s);
    void flow_add(const FlowSaKey &k, uint64_t order, Sa *sa);
    void flow_remove(const FlowSaKey &k, Sa *sa);

    std::vector<Slot> slots_;
    std::vector<std::shared_ptr<Sa>> all_;  // slots_[i].sa, for all()
    size_t count_ = 0;
    uint32_t added_ = 0;  // add()'s next index
    struct Found {
        Sa *sa = nullptr;
        uint32_t index = 0;
    };
    FlatMap<SaKey, Found, SaKeyHash> by_spi_;
    // A flow's slot: where links point, and its newest SA inline, so that a lookup by hash
    // (a template that leaves an address to the packet) reads the slot it prefetched and
    // nothing behind it.
    struct FlowSlot {
        std::unique_ptr<OutFlow> flow;
        Sa *newest = nullptr;  // flow->newest
    };
    FlatMap<FlowSaKey, FlowSlot, SaKeyHash> by_flow_;
    FlowSlot &flow_slot(const FlowSaKey &k);  // made, with its OutFlow, if it is not there
    std::vector<Sa *> timed_;
    std::vector<uint32_t> timed_slot_;  // the index in slots_ of each, to mend its timed_at
};

// Ids for a table of SAs or policies: an index below 2^24 and a generation above it. An index
// comes back only after `kReuseAfter` others were freed, and with the next generation: an id
// read from a packet's metadata a moment ago never names the entry that reused its index.
class IdPool {
public:
    static constexpr size_t kReuseAfter = 1024;
    uint32_t take();
    void give_back(uint32_t id);

private:
    std::deque<uint32_t> free_;  // ids freed, with their next generation
    uint32_t next_ = 0;          // the next index never given
};

}  // namespace xesp
