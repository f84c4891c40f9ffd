// ArenaBytes, ArenaBytesPerParameter and ArenaWeightsAreFp32 (job/host_optimizer_options.h), and
// the layout options they size (job/arena_layout.h).
#include <algorithm>

#include "job/arena_layout.h"

namespace offloadd::trainer {
namespace internal {
namespace {

constexpr uint64_t kAlign = 4096;
uint64_t RoundUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

}  // namespace

workers::ShardLayoutOptions LayoutOptions(const HostOptimizerOptions& o) {
  workers::ShardLayoutOptions lo;
  switch (o.compute) {
    case HostDtype::kFp32:
      lo.grad_dtype = workers::GradDtype::kFp32;
      lo.weight_dtype = workers::WeightDtype::kNone;  // the device reads the master weights
      break;
    case HostDtype::kBf16:
      lo.grad_dtype = workers::GradDtype::kBf16;
      lo.weight_dtype = workers::WeightDtype::kBf16;
      break;
    case HostDtype::kFp16:
      lo.grad_dtype = workers::GradDtype::kFp16;
      lo.weight_dtype = workers::WeightDtype::kFp16;
      break;
  }
  if (ArenaWeightsAreFp32(o)) lo.weight_dtype = workers::WeightDtype::kNone;
  // A bf16 master is itself the device's bf16 weights (HostOptimizer::compute_weights): no copy.
  if (o.mode.master == workers::MasterDtype::kBf16) lo.weight_dtype = workers::WeightDtype::kNone;
  lo.accumulation_steps = std::max<uint32_t>(1, o.accumulation_steps);
  lo.states_resident = o.tier == StateTier::kCpu;
  for (size_t b = 0; b < o.block_elements.size(); ++b) {
    // No region of its own: its 16-bit weights are in the store (staged through the NVMe tier's
    // slots), or it keeps none beside its fp32 master in RAM (BlockWeightsFp32).
    const bool none = lo.weight_dtype != workers::WeightDtype::kNone && BlockWeightsFp32(o, b);
    if (WeightsOnNvme(o, b) || none) {
      lo.weights_elsewhere.resize(o.block_elements.size());
      lo.weights_elsewhere[b] = true;
    }
  }
  lo.mode = o.mode;
  return lo;
}

workers::WorkerPoolOptions PoolOptions(const HostOptimizerOptions& o) {
  workers::WorkerPoolOptions p;
  p.worker_binary = o.worker_binary;
  p.processes = std::max<uint32_t>(1, o.worker_processes);
  p.threads_per_process = std::max<uint32_t>(1, o.worker_threads);
  p.kernel_path = o.kernel_path;
  return p;
}

bool OnNvme(const HostOptimizerOptions& o, size_t block) {
  return o.tier == StateTier::kNvme && (o.nvme_blocks.empty() || o.nvme_blocks[block]);
}

uint64_t MaxElements(const HostOptimizerOptions& o) {
  uint64_t m = 0;
  for (size_t b = 0; b < o.block_elements.size(); ++b) {
    if (OnNvme(o, b)) m = std::max(m, o.block_elements[b]);
  }
  return m;
}

bool WeightsOnNvme(const HostOptimizerOptions& o, size_t block) {
  return OnNvme(o, block) && o.compute != HostDtype::kFp32 && block < o.nvme_weight_blocks.size() &&
         o.nvme_weight_blocks[block];
}

uint64_t MaxWeightElements(const HostOptimizerOptions& o) {
  uint64_t m = 0;
  for (size_t b = 0; b < o.block_elements.size(); ++b) {
    if (WeightsOnNvme(o, b)) m = std::max(m, o.block_elements[b]);
  }
  return m;
}

bool BlockWeightsFp32(const HostOptimizerOptions& o, size_t block) {
  if (ArenaWeightsAreFp32(o)) return true;
  if (o.mode.master != workers::MasterDtype::kFp32) return false;  // the bf16 master is read
  return o.tier == StateTier::kNvme && o.compute != HostDtype::kFp32 && !o.host_weight_copy &&
         !OnNvme(o, block);
}

uint64_t StoredStateBytes(workers::OptimizerMode mode, uint64_t n) {
  return workers::MasterRegionBytes(mode.master, n) + 2 * workers::StateRegionBytes(mode.state, n);
}

uint64_t ArenaStateBytes(workers::OptimizerMode mode, uint64_t n) {
  return RoundUp(workers::MasterRegionBytes(mode.master, n)) +
         2 * RoundUp(workers::StateRegionBytes(mode.state, n));
}

uint64_t NvmeComputeCopyBytes(const HostOptimizerOptions& o, size_t block) {
  if (!OnNvme(o, block)) return 0;
  const uint64_t n = o.block_elements[block];
  if (o.compute == HostDtype::kFp32) return n * 4;
  if (o.mode.master == workers::MasterDtype::kBf16 && !WeightsOnNvme(o, block)) return n * 2;
  return 0;
}

uint32_t ExtraRegions(const HostOptimizerOptions& o) {
  return 4 * o.nvme_slots + kArenaWeightBuffers +
         4 * static_cast<uint32_t>(o.block_elements.size()) + 32;
}

uint64_t ExtraBytes(const HostOptimizerOptions& o) {
  // Their entries in the region table (ipc::Arena's entry is 72 bytes; 80 as workers::ArenaBytesFor
  // counts its own).
  const uint64_t table = RoundUp(uint64_t{ExtraRegions(o)} * 80);
  if (o.tier != StateTier::kNvme) return table;
  const uint64_t slots = std::max<uint32_t>(2, o.nvme_slots);  // as HostOptimizer allocates them
  // Each slot holds a block's master and states in the mode's formats (workers/adamw_compact.h).
  uint64_t bytes = slots * ArenaStateBytes(o.mode, std::max<uint64_t>(1, MaxElements(o)));
  uint64_t regions = slots * 3 + o.block_elements.size() + 8;
  if (const uint64_t w = MaxWeightElements(o); w > 0) {
    // A 16-bit weight region per slot (a bf16 master is its own: none), and the buffers
    // FetchWeights reads into.
    const uint64_t slot_weights = o.mode.master == workers::MasterDtype::kBf16 ? 0 : slots;
    bytes += (slot_weights + kArenaWeightBuffers) * RoundUp(w * 2);
    regions += slot_weights + kArenaWeightBuffers;
  }
  for (size_t b = 0; b < o.block_elements.size(); ++b) {
    if (!OnNvme(o, b)) {  // its master and moments in the arena
      bytes += ArenaStateBytes(o.mode, o.block_elements[b]);
      regions += 3;
    } else if (const uint64_t copy = NvmeComputeCopyBytes(o, b); copy > 0) {
      bytes += RoundUp(copy);
    }
  }
  return table + bytes + 2 * kAlign * regions;
}

double ModeBytesPerParameter(const HostOptimizerOptions& o, workers::OptimizerMode mode) {
  HostOptimizerOptions in_mode = o;
  in_mode.mode = mode;
  return ArenaBytesPerParameter(in_mode);  // NVMe tier: the states live in the store
}

double ModeUpdateTrafficPerParameter(const HostOptimizerOptions& o, workers::OptimizerMode mode) {
  HostOptimizerOptions in_mode = o;
  in_mode.mode = mode;  // a bf16 master writes no 16-bit copy: it is the device's weights
  const workers::ShardLayoutOptions lo = LayoutOptions(in_mode);
  return workers::StepTrafficBytesPerParam(mode, lo.grad_dtype, lo.weight_dtype);
}

}  // namespace internal

uint64_t ArenaBytes(const HostOptimizerOptions& o) {
  return workers::ArenaBytesFor(o.block_elements, internal::LayoutOptions(o), internal::PoolOptions(o)) +
         internal::ExtraBytes(o);
}

double ArenaBytesPerParameter(const HostOptimizerOptions& o) {
  return workers::BytesPerParameter(internal::LayoutOptions(o));
}

bool ArenaWeightsAreFp32(const HostOptimizerOptions& o) {
  if (o.mode.master == workers::MasterDtype::kBf16) return false;  // the bf16 master is read
  return o.compute == HostDtype::kFp32 || (!o.host_weight_copy && o.tier == StateTier::kCpu);
}

}  // namespace offloadd::trainer
