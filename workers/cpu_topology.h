#pragma once
// Which cores the worker processes run on. NUMA nodes come from /sys/devices/system/node (a
// machine or container without it is one node); only cores in this process's affinity mask are
// used. Processes are spread over nodes round-robin so each process's threads share one node's
// memory controller; the daemon should place each shard's state on the node of the process that
// updates it (first touch), which is what keeping shard -> worker fixed achieves.
// Free functions; thread-safe.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::workers {

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}. INVALID_ARGUMENT on malformed lists.
StatusOr<std::vector<int>> ParseCpuList(std::string_view text);

// CPUs per NUMA node, restricted to `allowed`; `sys_root` is a seam for tests.
std::vector<std::vector<int>> NumaNodes(const std::vector<int>& allowed,
                                        const std::string& sys_root = "/sys/devices/system/node");
// The kernel's node ids of NumaNodes()'s entries, in the same order ({0} without sysfs).
std::vector<int> NumaNodeIds(const std::vector<int>& allowed,
                             const std::string& sys_root = "/sys/devices/system/node");

std::vector<int> AllowedCpus();  // sched_getaffinity of the calling thread

struct CpuPlan {
  std::vector<std::vector<int>> cpus;  // per process, one entry per thread
  std::vector<int> node;               // NUMA node of each process
  bool oversubscribed = false;         // fewer cores than processes x threads
};
CpuPlan PlanWorkerCpus(uint32_t processes, uint32_t threads,
                       const std::vector<std::vector<int>>& nodes);

}  // namespace offloadd::workers
