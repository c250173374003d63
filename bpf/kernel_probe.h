// What the gateway needs from the running kernel, checked before it sets anything up: the BPF
// program and map types, each helper the classifier calls, AF_XDP sockets, the tc clsact qdisc,
// an XDP attachment, and the classifier itself through this kernel's verifier. A kernel that
// lacks one gets one line saying what is missing and which kernel has it, instead of a
// verifier log. `xesp daemon --check` runs only this; the daemon runs it at start-up.
//
// The oldest supported kernel is 6.1 (tested in a VM with Debian 12's 6.1 and 6.12, see
// tests/vm/). What sets it is bpf_loop (5.17), which walks the policy tuples; the rest dates
// from 4.x and 5.x (the table in kernel_probe.cpp gives each feature's first kernel).
#pragma once

#include <string>

#include "userspace/base/result.h"

namespace xesp {

inline constexpr const char *kOldestSupportedKernel = "6.1";

// Ok, or an error whose message is one line: "kernel RELEASE: no FEATURE (Linux X.Y and later
// have it; xesp supports 6.1 and later)". Needs root (CAP_BPF, CAP_NET_ADMIN). Leaves nothing
// behind: what it attaches to lo is a bpf_link, gone with the probe.
Result<void> probe_kernel();

// The running kernel's release (uname -r).
std::string kernel_release();

}  // namespace xesp
