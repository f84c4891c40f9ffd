#pragma once
// HostOptimizerOptions, what the trainer's host optimizer is made from, and the size of the shared
// arena those options need. Torch-free and in job/ so that the daemon's validation and the
// planners size the arena with the trainer's own formula (arena_size.cc), never a copy of it.
// The arena's layout behind these figures: job/arena_layout.h.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/train_config.h"
#include "workers/adamw_compact.h"

namespace offloadd::trainer {

class GroupLink;  // trainer/pipeline/group_link.h (data parallel): set by the trainer only

enum class HostDtype { kFp32, kBf16, kFp16 };  // compute dtype as the host sees it

// What a HostOptimizer (trainer/pipeline/host_optimizer.h) is made from.
struct HostOptimizerOptions {
  std::vector<uint64_t> block_elements;  // parameters per block, in block order
  HostDtype compute = HostDtype::kFp32;
  // 16-bit compute, RAM tier: keep a 16-bit copy of the weights beside the fp32 masters for the
  // device to read (16 bytes per parameter). false: no copy (14 bytes per parameter); the
  // device reads the masters (compute_weights is fp32) and rounds them itself, to the same bits
  // (trainer/README.md prices both). The NVMe tier always keeps the copy: its masters are not in
  // RAM between updates.
  bool host_weight_copy = true;
  // fp16 dynamic loss scaling: updates wait for the global norm and a non-finite one skips the
  // step (workers::OptimizerConfig::skip_nonfinite).
  bool skip_nonfinite = false;
  uint32_t accumulation_steps = 1;
  OptimConfig optim;
  StateTier tier = StateTier::kCpu;
  // NVMe tier, per block (empty: every block): true where the block's fp32 masters and moments
  // live in the store; the others keep theirs in the arena, as on the RAM tier (with the 16-bit
  // copy). job/state_placement.h decides it from the host memory limit.
  std::vector<bool> nvme_blocks;
  // NVMe tier, per block (empty: none; offload_param: {device: nvme}): true where the block's
  // 16-bit weights live in the store too, beside its states (the block must be on NVMe, the
  // compute 16-bit, no data-parallel group). The update writes them into the block's staging slot
  // and they are written back with the states (TensorKind::kParamHalf); compute_weights(block) is
  // null and FetchWeights reads them. job/state_placement.h prices it.
  std::vector<bool> nvme_weight_blocks;
  std::vector<std::string> nvme_dirs;
  uint32_t nvme_queue_depth = 32;
  uint32_t nvme_block_size = 0;  // offloadd-store --block-size; 0: its default
  uint32_t nvme_slots = 3;       // staging slots for the NVMe tier
  int defer_below_block = 0;     // LSP transition (without clipping, or with speculation)
  uint32_t update_depth = 1;     // updates queued per worker process (workers::OptimizerConfig)
  std::string worker_binary, store_binary;
  uint32_t worker_processes = 1, worker_threads = 1;
  std::string kernel_path = "auto";  // workers::ResolveKernelPath's request
  uint64_t host_memory_limit = 0;    // refuse an arena larger than this
  // Threads that populate (fault in) the arena's pages at creation: 1, the kernel's MAP_POPULATE
  // on one thread; more split it (ipc::SegmentOptions::populate_threads).
  uint32_t populate_threads = 1;
  // With populate_threads > 1, the RAM tier and no data-parallel group: the arena is populated in
  // the background (trainer/pipeline/arena_population.h), each block's masters and 16-bit weights
  // first in block order, then the gradient staging, then the rest; InitializePieces fills block b
  // once its pages are in, and WaitPopulated() waits for the whole arena.
  bool populate_in_background = false;
  // Tests: ArenaPopulationOptions::before_chunk of the background population.
  std::function<void(size_t chunk)> populate_hook;
  // Per block (empty: none): its optimizer states live on the GPU and the trainer updates it
  // there (DeviceOptimizer). The driver counts its gradient norm, given with GradsReady's last
  // micro-batch, into the step's decision (WaitDecided); no worker touches it.
  std::vector<bool> device_blocks;
  // Data parallel (trainer/pipeline/group_link.h, may be null): rank 0 publishes through it what
  // the other ranks follow. A rank > 0 starts no workers or store: it attaches to the leader's
  // arena at `leader_arena_path` (ArenaPath() there), lands its gradient shards in the shared
  // staging buffers and follows the leader's updates and decisions (host_optimizer_group.cc).
  GroupLink* group = nullptr;
  std::string leader_arena_path;
  // ZeRO-1 across hosts (may be empty): block_elements are this host's slice of each block, and
  // the step's decision is taken on the sum of every host's squared norms that this returns
  // (workers::StepDriver::SetCombineSquaredNorm).
  std::function<StatusOr<double>(double local_sq)> combine_sq_norm;
  // The master's and states' formats (workers/adamw_compact.h), in the arena and, on the NVMe
  // tier, in the store and its staging slots alike; a bf16 master needs bf16 compute, and is
  // itself the weights the device reads (no 16-bit copy, host_weight_copy does not apply; an NVMe
  // block keeps a copy of its bf16 half in RAM, or in the store with nvme_weight_blocks). Create
  // and the trainer refuse the rest, naming it.
  workers::OptimizerMode mode = {};
};

// Pinned arena buffers the 16-bit weights on NVMe are read into (HostOptimizer::FetchWeights):
// one in use while the next is read.
inline constexpr int kArenaWeightBuffers = 2;

// Bytes the arena needs for these options (for planning and validation).
uint64_t ArenaBytes(const HostOptimizerOptions& options);
// The arena's bytes per parameter for these options (workers::BytesPerParameter of the layout):
// 16 for bf16/fp16 compute with the 16-bit copy, 14 without, 16 for fp32 compute, +4 with
// gradient accumulation; 2 (+4) on the NVMe tier, whose states live in the store.
// Compact modes: their master and state bytes instead of 12 (workers::StateBytesPerParam).
double ArenaBytesPerParameter(const HostOptimizerOptions& options);
// True when the weights the device reads (HostOptimizer::compute_weights) are fp32 although the
// device may compute in 16 bits: fp32 compute, or no 16-bit copy (host_weight_copy false, RAM
// tier).
bool ArenaWeightsAreFp32(const HostOptimizerOptions& options);

}  // namespace offloadd::trainer
