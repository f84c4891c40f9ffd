#pragma once
// Lays a model's optimizer state out in the shared arena: for every layer (split into shards of
// at most max_shard_elements) the regions a StepDriver needs, with standard names
// "L<layer>.S<shard>.<what>", and the segment size to ask for up front.
//
//   const std::vector<uint64_t> layers = {...};  // parameters per layer, from the job plan
//   ShardLayoutOptions lo{.accumulation_steps = 4};
//   const uint64_t bytes = ArenaBytesFor(layers, lo, pool_options);
//   ASSIGN_OR_RETURN(SharedSegment seg, SharedSegment::Create(bytes, {.try_huge_pages = true}));
//   ASSIGN_OR_RETURN(Arena arena, Arena::Format(&seg, {.max_regions = RegionsFor(layers, lo, n)}));
//   ASSIGN_OR_RETURN(std::vector<ShardSpec> shards, AllocateShards(&arena, layers, lo, processes));
//   ... copy initial weights into each shard's master region, then WorkerPool::Start(...)
//
// Fresh memfd pages are zero, which is what exp_avg, exp_avg_sq and the step counters must start
// at. Free functions; thread-compatible.

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "ipc/arena.h"
#include "workers/adamw_compact.h"
#include "workers/step_driver.h"
#include "workers/worker_pool.h"

namespace offloadd::workers {

struct ShardLayoutOptions {
  GradDtype grad_dtype = GradDtype::kBf16;
  // The 16-bit copy of the new weights the workers write for the device; kNone: no such region
  // (weights_offset 0; the device reads the fp32 masters and casts them itself).
  WeightDtype weight_dtype = WeightDtype::kBf16;
  uint32_t accumulation_steps = 1;  // > 1 adds an fp32 accumulation buffer per shard
  // Split layers into shards of at most this many elements (rounded up to kChunkElements);
  // 0: one shard per layer. Smaller shards spread one layer over several worker processes.
  uint64_t max_shard_elements = 0;
  // false: fp32 master weights and Adam moments live elsewhere (the NVMe store); their regions
  // are not allocated (offsets 0) and the caller stages them through its own slots
  // (StepDriver::SetBeforeUpdate).
  bool states_resident = true;
  // Per layer (empty: none): its 16-bit weight copy lives elsewhere (the NVMe store, staged through
  // the caller's slots, StepDriver::SetBeforeUpdate setting weights_offset); no region for it.
  std::vector<bool> weights_elsewhere = {};
  // The master's and states' formats (workers/adamw_compact.h): the regions are sized by it
  // (MasterRegionBytes, StateRegionBytes) and every shard's AdamW runs in it.
  OptimizerMode mode = {};
};

// Number of arena regions AllocateShards plus a pool of `processes` workers will create.
uint32_t RegionsFor(const std::vector<uint64_t>& layers, const ShardLayoutOptions& options,
                    uint32_t processes);
// Segment bytes (data area) for the shards, the pool's rings and redo slots, and the region table.
uint64_t ArenaBytesFor(const std::vector<uint64_t>& layers, const ShardLayoutOptions& options,
                       const WorkerPoolOptions& pool);
// Host RAM per parameter of the shards' tensors (gradient staging, master and moments in the
// mode's formats when states_resident: 12 bytes exact, 8 with bf16 states, 6.03 with int8, the
// 16-bit weight copy unless weight_dtype is kNone, the fp32 accumulation buffer): what planners
// multiply by the parameter count. ArenaBytesFor adds to that the step counters (16 B per 2048
// parameters), 4 KiB rounding per region, the rings and the table. bf16 compute, RAM tier, no
// accumulation: 2 + 12 + 2 = 16 with the 16-bit copy, 14 without.
double BytesPerParameter(const ShardLayoutOptions& options);
// Moves every shard's state onto the NUMA node of the worker that updates it (no-op when the
// workers run on one node). Call after WorkerPool::Start and before the first step; needs the
// shards to be mapped by this process only or CAP_SYS_NICE (mbind MPOL_MF_MOVE).
Status BindShardsToWorkers(const ipc::Arena& arena, const std::vector<ShardSpec>& shards,
                           const WorkerPool& pool);
// Allocates every shard's regions; shard s goes to worker s % processes.
StatusOr<std::vector<ShardSpec>> AllocateShards(ipc::Arena* arena,
                                                const std::vector<uint64_t>& layers,
                                                const ShardLayoutOptions& options,
                                                uint32_t processes);

}  // namespace offloadd::workers
