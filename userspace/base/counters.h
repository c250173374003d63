// Every reason a packet is dropped, one list (VPP's foreach_ipsec_sa_err). It expands into the
// enum, the printable names and the kernel's /proc/net/xfrm_stat class each one is counted under.
//
//   X(enumerator, name shown to the operator, xfrm_stat class)
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace xesp {

#define XESP_FOREACH_DROP(X)                                                                       \
    X(InNoStates, "in-no-state", "XfrmInNoStates")                                                 \
    X(InReflected, "in-reflected", "XfrmInNoStates")                                               \
    X(InTruncated, "in-truncated", "XfrmInHdrError")                                               \
    X(InBadLength, "in-bad-length", "XfrmInHdrError")                                              \
    X(InShortIcv, "in-short-icv", "XfrmInHdrError")                                                \
    X(InBadBlockSize, "in-bad-block-size", "XfrmInStateProtoError")                                \
    X(InReplay, "in-replay", "XfrmInStateSeqError")                                                \
    X(InTooOld, "in-too-old", "XfrmInStateSeqError")                                               \
    X(InIcvFail, "in-icv-fail", "XfrmInStateProtoError")                                           \
    X(InBadPadding, "in-bad-padding", "XfrmInStateProtoError")                                     \
    X(InBadNextHeader, "in-bad-next-header", "XfrmInStateModeError")                               \
    X(InDummy, "in-dummy", "XfrmInStateProtoError")                                                \
    X(InBadInner, "in-bad-inner", "XfrmInHdrError")                                                \
    X(InMartian, "in-martian", "XfrmInHdrError")                                                   \
    X(InEcnDrop, "in-ecn-drop", "XfrmInError")                                                     \
    X(InSelectorMismatch, "in-selector-mismatch", "XfrmInStateMismatch")                           \
    X(InTmplMismatch, "in-tmpl-mismatch", "XfrmInTmplMismatch")                                    \
    X(InNoPolicy, "in-no-policy", "XfrmInNoPols")                                                  \
    X(InEncapMismatch, "in-encap-mismatch", "XfrmInStateMismatch")                                 \
    X(InUnprotected, "in-unprotected", "XfrmInTmplMismatch")                                       \
    X(InPolBlock, "in-policy-block", "XfrmInPolBlock")                                             \
    X(InExpired, "in-expired", "XfrmInStateExpired")                                               \
    X(InBufferError, "in-buffer", "XfrmInBufferError")                                             \
    X(InCryptoError, "in-crypto-error", "XfrmInError")                                             \
    X(OutNoStates, "out-no-state", "XfrmOutNoStates")                                              \
    X(FragmentUnclassifiable, "fragment-unclassifiable", "XfrmOutPolBlock")                        \
    X(OutPolBlock, "out-policy-block", "XfrmOutPolBlock")                                          \
    X(OutSeqExhausted, "out-seq-exhausted", "XfrmOutStateSeqError")                                \
    X(OutSeqUnreserved, "out-seq-unreserved", "XfrmOutStateSeqError")                              \
    X(OutExpired, "out-expired", "XfrmOutStateExpired")                                            \
    X(OutNoHeadroom, "out-no-headroom", "XfrmOutError")                                            \
    X(OutTooBig, "out-too-big", "XfrmOutError")                                                    \
    X(OutBadInner, "out-bad-inner", "XfrmOutError")                                                \
    X(OutModeMismatch, "out-mode-mismatch", "XfrmOutStateModeError")                               \
    X(OutTransportFragment, "out-transport-fragment", "XfrmOutStateModeError")                     \
    X(OutCryptoError, "out-crypto-error", "XfrmOutStateProtoError")

enum class Drop : uint8_t {
#define XESP_DROP_ENUM(e, name, klass) e,
    XESP_FOREACH_DROP(XESP_DROP_ENUM)
#undef XESP_DROP_ENUM
        Count
};

constexpr size_t kDropCount = size_t(Drop::Count);

constexpr std::array<std::string_view, kDropCount> kDropNames = {
#define XESP_DROP_NAME(e, name, klass) name,
    XESP_FOREACH_DROP(XESP_DROP_NAME)
#undef XESP_DROP_NAME
};

constexpr std::array<std::string_view, kDropCount> kDropXfrmClass = {
#define XESP_DROP_CLASS(e, name, klass) klass,
    XESP_FOREACH_DROP(XESP_DROP_CLASS)
#undef XESP_DROP_CLASS
};

constexpr std::string_view drop_name(Drop d)
{
    return kDropNames[size_t(d)];
}

// Counters of one SA, or of the whole engine. Plain integers: each SA's serial step owns them.
struct Counters {
    uint64_t packets = 0;
    uint64_t bytes = 0;
    std::array<uint64_t, kDropCount> drops{};

    void drop(Drop d) { drops[size_t(d)]++; }
    uint64_t operator[](Drop d) const { return drops[size_t(d)]; }
};

}  // namespace xesp
