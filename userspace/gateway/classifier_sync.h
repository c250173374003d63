// Keeps the XDP classifier's maps in step with the engine, at the cost of each change.
//
// The classifier hands every redirected frame to userspace with an id in its metadata: the
// engine's own id of the SA or policy (Engine::Prepared), stable while the entry lives and
// never naming another entry soon after it is gone (engine.h's IdPool). A frame classified by
// an entry the engine does not have (written a moment before the engine's change is
// published, or kept a moment after) names an id the engine's tables lack: the gateway then
// has the engine look the packet up itself (`reclassified`), rather than drop it.
//
// A change is made in two steps around Engine::commit(), so that no packet ever finds neither
// the old nor the new entry of something that stays:
//   stage(p)     before: writes what p adds or changes (an updated policy or SA overwrites
//                its entry in place, under the same id), except bypass policies; on error
//                undoes it, and the maps are as before;
//   commit(p)    after: writes p's bypass policies (never before the engine has them: that
//                would let plaintext through early), deletes what p removes.
// Both run on the thread that makes changes.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "bpf/xdp_program.h"
#include "userspace/esp/engine.h"

namespace xesp {

class ClassifierSync {
public:
    explicit ClassifierSync(XdpProgram &prog) : prog_(prog) {}

    Result<void> stage(const Engine::Prepared &p);
    // Takes back the last stage() (the change is not published after all).
    void unstage() { rollback(staged_); }
    void commit(const Engine::Prepared &p);

    size_t sas() const { return sas_.size(); }

private:
    struct SaEntry {
        uint32_t id;
        uint32_t flags;  // XESP_SA_F_*
    };
    // One undoable step of stage().
    struct Undo {
        enum Kind { PutSa, PutPolicy, ReplacedPolicy } kind;
        SaKey key;
        std::optional<SaEntry> sa;  // before: none, or what it was
        uint32_t id = 0;
        Spd::Policy policy;  // the policy before (null: none) and after
        Spd::Policy now;
        uint32_t new_id = 0;  // ReplacedPolicy: the id `now` has (`id` is policy's)
    };
    Result<void> stage_sa(const SaConfig &c, uint32_t id, std::vector<Undo> &undo,
                          std::vector<XdpProgram::SaEntry> &writes,
                          std::vector<std::optional<SaEntry>> &was);
    Result<void> write_sas(const std::vector<XdpProgram::SaEntry> &writes,
                           const std::vector<std::optional<SaEntry>> &was, std::vector<Undo> &undo);
    static bool relaxes(const PolicyConfig &p);
    // The policy p deletes that `put` adds again (same selector and direction), if any.
    static const Engine::Prepared::PolicyDel *added_again(const Engine::Prepared &p,
                                                          const Engine::Prepared::PolicyPut &put);
    Result<void> put_policy(const Engine::Prepared &p, const Engine::Prepared::PolicyPut &put,
                            std::vector<Undo> *undo);
    void rollback(std::vector<Undo> &undo);

    XdpProgram &prog_;
    std::vector<Undo> staged_;  // how to take back the last stage()
    // The inbound SAs in the classifier's SA map (only inbound ESP is classified by SA).
    std::unordered_map<SaKey, SaEntry, ConfigKeyHash> sas_;
};

}  // namespace xesp
