// CPU lists as the kernel writes them (cpuset(7), taskset -c): "0,2,4-7".
#pragma once

#include <pthread.h>

#include <string>
#include <vector>

#include "userspace/base/result.h"

namespace xesp {

// The CPUs in order, ranges expanded; an error naming the item that is not a CPU number or a
// range of them (or a CPU past what the kernel's affinity calls take).
Result<std::vector<int>> parse_cpu_list(const std::string &s);

// Pins a thread (the calling one by default) to one CPU.
Result<void> pin_to_cpu(int cpu, pthread_t thread = pthread_self());

}  // namespace xesp
