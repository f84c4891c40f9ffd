#pragma once
// The largest-trainable-model arithmetic for one job on one node: the physical limit (what the
// host memory limit and the store directories' free space hold at the bytes per parameter the
// optimizer mode cannot do without: 12 for exact AdamW, its master and both moments) and what the
// job's plan holds per parameter in RAM and on disk together, part by part, so that a reader sees
// which bytes beyond the 12 keep a larger model out. offloadd-train --validate-only prints it.
// Also the compact optimizer modes a host-memory or disk refusal may offer. Torch-free
// (offloadd_job_arena); thread-compatible.
#include <cstdint>
#include <optional>
#include <string>

#include "job/host_memory.h"

namespace offloadd::trainer {

struct CapacityFigures {
  uint64_t params = 0;     // the job's parameters
  uint64_t limit = 0;      // the host memory limit the job runs under
  uint64_t disk_free = 0;  // the store directories' free space (0: none configured)
  // Bytes per parameter the optimizer mode cannot do without: its master and states
  // (workers::StateBytesPerParam: 12 exact, 8 with bf16 states, 6.03 with int8).
  double floor_bytes = 12;
  double physical_params = 0;  // (limit + disk_free) / floor_bytes
  double fraction = 0;         // params / physical_params
  // What the plan holds per parameter, RAM and disk together (averaged over every parameter):
  double states = 0;         // master and moments (those on the GPU count 0)
  double gradients = 0;      // the gradient staging (and the fp32 accumulation buffer)
  double weight_copies = 0;  // 16-bit weights beside fp32 masters, and fp32 compute copies
  double rest = 0;           // staging slots, versions in flight, processes, activations, rounding
  double held() const { return states + gradients + weight_copies + rest; }
  // "capacity: 10.43 B parameters, 65.1% of the 16.02 B this node holds for exact AdamW ((host
  // memory limit 116.3 GiB + 62.9 GiB free in the store directories) / 12 B); the plan holds
  // 17.2 B per parameter in RAM and on disk: 12 master and states, 2 gradients, 2 16-bit weight
  // copies, 1.2 the rest (...)"
  std::string Describe() const;
};

// The figures for `in` as placed (in.optimizer.nvme_blocks, nvme_weight_blocks, device_blocks)
// under `limit`, with `disk_free` bytes free in the store directories (UINT64_MAX, unknown, counts
// as 0).
CapacityFigures JobCapacity(const HostMemoryInputs& in, uint64_t limit, uint64_t disk_free);

// A compact optimizer mode (docs/optimizer-modes.md, not exact) under which `in`, with its states
// in RAM, fits `limit`: the least lossy of bf16 states, then int8 states (with the fp32 master),
// then int8 states with a bf16 master (bf16 compute: it replaces a 16-bit copy the job keeps).
// Nothing when `in` is compact already or none fits. The text names the settings and
// the RAM: "a compact optimizer mode, not exact: optimizer.state_dtype: int8 (--state-dtype=int8):
// host RAM 99.1 GiB (arena ...)".
std::optional<std::string> CompactModeFix(const HostMemoryInputs& in, uint64_t limit);

}  // namespace offloadd::trainer
