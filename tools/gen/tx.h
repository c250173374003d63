// The senders of xesp-gen: the same frames as fast as one thread can hand them to the device,
// through an AF_XDP socket per TX queue (copy mode on veth) or an AF_PACKET socket with
// sendmmsg. Both bypass the qdisc. On a veth pair here (one thread, into an XDP program that
// drops, quiet machine) AF_XDP sent 2.1-2.2 Mpps of 64-byte frames and 1.9 Mpps of 1400-byte
// ones, sendmmsg 1.4-1.7 and 1.35-1.5 Mpps: AF_XDP is the default.
//
// The sender's thread also runs what the device's peer does with the frame (veth delivers in
// the sender's softirq): on veth the rate measured is that of the whole path behind it, up to
// the first queue another thread drains, as much as the sender's.
#pragma once

#include <atomic>
#include <cstdint>

#include "tools/gen/frame.h"
#include "userspace/base/result.h"

namespace xesp::gen {

enum class TxMethod { Xsk, Packet };

const char *tx_method_name(TxMethod m);

struct TxOptions {
    Endpoints ep;
    uint32_t size = kMinFrame;  // frame bytes with FCS
    uint32_t flows = 1;
    // Address pairs: frame k goes from src + (k % pairs) * pair_step to dst + (k % pairs) *
    // pair_step, so that traffic spreads over that many subnets (the tunnels of a gateway).
    uint32_t pairs = 1;
    uint32_t pair_step = 0;
    double seconds = 1;
    double rate = 0;  // frames per second; 0: as fast as possible
    TxMethod method = TxMethod::Xsk;
};

struct TxResult {
    uint64_t sent = 0;     // frames the kernel took
    uint64_t refused = 0;  // frames the kernel refused (a full device queue), not retried
    double seconds = 0;
    uint32_t queues = 1;  // TX queues used (sockets, for AF_XDP)
};

// The distinct frames the options make, flows and address pairs combined: frame k has flow
// k % flows and pair k % pairs.
std::vector<std::vector<uint8_t>> tx_frames(const TxOptions &options);

// Runs for options.seconds or until `stop` is set.
Result<TxResult> run_tx(const TxOptions &options, const std::atomic<bool> &stop);

}  // namespace xesp::gen
