// Keeps the XDP classifier's maps in step with the configuration.
//
// The classifier hands every redirected frame to userspace with an id in its metadata. The
// engine's ids are indexes into the configuration, which shift when an entry is deleted, so
// the maps carry ids of their own instead: slots, given once per SA (by destination and SPI)
// and per policy (by selector, direction and everything else it says), never reused. A frame
// classified by an entry that is not live on the data thread (written a moment before the
// engine that knows it, or kept a moment after) names a slot the live tables do not have:
// the gateway then has the engine look the packet up itself (`reclassified`), rather than
// take it for another SA or policy, or drop it.
//
// A change is made in three steps, so that no packet ever finds neither the old nor the new
// entry of something that stays:
//   stage(next)    writes what `next` adds or changes (an updated policy overwrites the old
//                  one in place); on error undoes it and the maps are as before;
//   ids(next)      the tables that translate slots into the ids of the engine built from
//                  `next`; the caller makes that engine and these tables live together;
//   commit(next)   deletes what `next` no longer has.
// All three run on the thread that makes changes; the data thread only reads the SlotTables
// it was handed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bpf/xdp_program.h"
#include "userspace/config/config.h"
#include "userspace/esp/engine.h"
#include "userspace/gateway/slot_table.h"

namespace xesp {

class ClassifierSync {
public:
    explicit ClassifierSync(XdpProgram &prog) : prog_(prog) {}

    Result<void> stage(const Config &next);
    // From a metadata id to the id of the engine built from `next` (Engine::kNoId for a slot
    // that is gone), for SAs and for policies. After stage(next).
    struct Ids {
        SlotTable sa, policy;
    };
    Ids ids(const Config &next) const;
    void commit(const Config &next);

    size_t sas() const { return sas_.size(); }
    size_t policies() const { return policies_.size(); }

private:
    struct SaEntry {
        uint32_t slot;
        uint32_t flags;  // XESP_SA_F_*
        IpAddr dst;
        uint32_t spi;
    };
    struct PolicyEntry {
        uint32_t slot;
        PolicyConfig config;
    };
    // One undoable step of stage().
    struct Undo {
        enum Kind { AddedSa, FlippedSa, AddedPolicy, ReplacedPolicy } kind;
        std::string key;
        SaEntry sa{};
        PolicyEntry policy{};
    };

    Result<void> stage_sa(const SaConfig &c, std::vector<Undo> &undo);
    Result<void> stage_policy(const PolicyConfig &p, std::vector<Undo> &undo);
    void rollback(std::vector<Undo> &undo);

    XdpProgram &prog_;
    std::map<std::string, SaEntry> sas_;           // by describe_sa
    std::map<std::string, PolicyEntry> policies_;  // by describe_policy
    uint32_t next_slot_ = 0;                       // shared by SAs and policies
};

}  // namespace xesp
