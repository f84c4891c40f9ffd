#pragma once
// How HostOptimizerOptions map onto the worker pool's shard layout, and the arena bytes beyond the
// shards. Torch-free, in its own library (offloadd_job_arena) so that the daemon's job
// validation sizes the arena with ArenaBytes itself (the trainer's HostOptimizer lays the arena
// out by the same functions), never a copy of its formula.
#include <cstdint>
#include <vector>

#include "job/host_optimizer_options.h"
#include "workers/adamw_compact.h"
#include "workers/shard_layout.h"
#include "workers/worker_pool.h"

namespace offloadd::trainer::internal {

workers::ShardLayoutOptions LayoutOptions(const HostOptimizerOptions& o);
workers::WorkerPoolOptions PoolOptions(const HostOptimizerOptions& o);
// The block's states live in the store (NVMe tier, HostOptimizerOptions::nvme_blocks).
bool OnNvme(const HostOptimizerOptions& o, size_t block);
// The largest block whose states pass through the NVMe staging slots (0: none).
uint64_t MaxElements(const HostOptimizerOptions& o);
// The block's 16-bit weights live in the store too (HostOptimizerOptions::nvme_weight_blocks).
bool WeightsOnNvme(const HostOptimizerOptions& o, size_t block);
// The largest block whose weights are on NVMe (0: none): the slots' and buffers' weight regions.
uint64_t MaxWeightElements(const HostOptimizerOptions& o);
// The weights the device reads for `block` are its fp32 master, which it rounds to its dtype
// itself: every block where ArenaWeightsAreFp32 (fp32 compute, or the RAM tier without a 16-bit
// copy); and on the NVMe tier, with 16-bit compute, an fp32 master and no host_weight_copy, a block
// whose states stay in RAM: its master is in the arena between updates, so it keeps no 16-bit copy
// beside it (2 B per parameter less), while the NVMe blocks keep theirs (their masters are in the
// store between updates). Such a block has no 16-bit region in the layout and its shard steps
// without one (weight_dtype kNone); HostOptimizer::compute_weights gives its master.
bool BlockWeightsFp32(const HostOptimizerOptions& o, size_t block);
// A block's master weights and both AdamW states in `mode` (workers::MasterRegionBytes + 2
// workers::StateRegionBytes, the int8 block scales included): what the NVMe store holds of a block
// of n parameters (12 n exact), and what the three regions take in the arena, each rounded to its
// pages (an in-RAM block's states, or a staging slot's).
uint64_t StoredStateBytes(workers::OptimizerMode mode, uint64_t n);
uint64_t ArenaStateBytes(workers::OptimizerMode mode, uint64_t n);
// The copy of the weights the device reads that the NVMe tier keeps in the arena for a block whose
// states are in the store (0 for the others): the fp32 master under fp32 compute (4 n), or a bf16
// master's weights, its first half (2 n), unless they are on NVMe too.
uint64_t NvmeComputeCopyBytes(const HostOptimizerOptions& o, size_t block);
// Bytes beyond the shard regions: NVMe staging slots and fp32 compute copies.
uint64_t ExtraBytes(const HostOptimizerOptions& o);
// The arena's region-table entries beyond the workers' own (workers::RegionsFor): the NVMe slots,
// each block's in-RAM states, compute copies and the rest. Start formats the arena with them, and
// ExtraBytes counts their table bytes.
uint32_t ExtraRegions(const HostOptimizerOptions& o);

// Compact optimizer modes (workers/adamw_compact.h, docs/optimizer-modes.md), for the planners
// (PredictHostMemory, the step planner's CPU-update term) once the arena holds them; exact mode
// gives what they price today. The arena's bytes per parameter in `mode` on the RAM tier
// (ArenaBytesPerParameter with the master and states in the mode's formats: 14 exact with bf16
// compute and no 16-bit copy, 8.03 with int8 states), and the bytes the CPU update moves per
// parameter per step (26 exact with bf16 compute and no copy to write, 14.06 with int8 states).
double ModeBytesPerParameter(const HostOptimizerOptions& o, workers::OptimizerMode mode);
double ModeUpdateTrafficPerParameter(const HostOptimizerOptions& o, workers::OptimizerMode mode);

}  // namespace offloadd::trainer::internal
