#pragma once
// What a job's validation needs to know of one GPU and one store directory of this node: plain
// data the daemon's node probe fills (daemon/node/node_probe.h) and job validation reads
// (job_validator.h NodeBudget), here so that job/ depends on no part of the daemon.

#include <cstdint>
#include <string>

namespace offloadd::daemon {

struct GpuFacts {
  int index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  std::string pci_bus_id;
  int numa_node = -1;
};

struct StoreDirFacts {
  std::string path;
  double weight = 1;
  uint64_t capacity_bytes = 0;
  uint64_t available_bytes = 0;
  std::string problem;  // empty when usable
};

}  // namespace offloadd::daemon
