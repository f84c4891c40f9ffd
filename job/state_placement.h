#pragma once
// Where each block's fp32 master weights and AdamW moments live between updates: in the shared
// arena (RAM) or in the NVMe store. One function decides it from the blocks' sizes, the host RAM
// left under the job's limit and the store directories' free space; the trainer applies it to the
// NVMe tier (HostOptimizerOptions::nvme_blocks) and the host-memory prediction prices it.
// Torch-free (library offloadd_job_arena).
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/host_memory.h"

namespace offloadd::trainer {

enum class BlockTier : uint8_t { kRam, kNvme };

struct BlockStateBytes {
  uint64_t ram = 0;   // host RAM the block's states add when they live in the arena
  uint64_t disk = 0;  // disk they take in the store (the latest version)
};

struct StatePlacement {
  std::vector<BlockTier> tiers;  // per block
  uint64_t ram_bytes = 0;        // of the states placed in RAM
  uint64_t disk_bytes = 0;       // of the states placed on NVMe
  // Per block (empty: every one in RAM): where its 16-bit weights live (PlaceStatesUnderLimit with
  // nvme_weights_allowed); weight_disk_bytes of them on NVMe.
  std::vector<BlockTier> weight_tiers;
  uint64_t weight_disk_bytes = 0;
  int ram_blocks() const;
  // HostOptimizerOptions::nvme_blocks: true for the blocks on NVMe.
  std::vector<bool> nvme_blocks() const;
  // HostOptimizerOptions::nvme_weight_blocks: true for the blocks whose weights are on NVMe.
  std::vector<bool> nvme_weight_blocks() const;
  // "blocks 0-11, 14 in RAM (57.0 GiB), 12-13, 15-31 on NVMe (32.1 GiB)", and with weights on
  // NVMe "; 16-bit weights of blocks 20-31 on NVMe (4.1 GiB)".
  std::string Describe() const;
  // "16-bit weights of blocks 20-31 on NVMe (4.1 GiB)"; empty when none is.
  std::string DescribeWeights() const;
};

// Blocks go into RAM while they fit in `ram_available`, the largest first (the embedding and the
// head: the NVMe tier's staging slots are sized by the largest block on NVMe), blocks of equal size
// in block order (block 0 first: its update is the last of backward and the next forward needs it
// first, while the higher blocks' reads and writes overlap the rest of backward); a block that
// does not fit goes to NVMe and smaller ones may still take RAM. A block with ram 0 and
// disk 0 (its states on the GPU) stays in RAM. Refused (ResourceExhausted, with the numbers) when
// the NVMe blocks need more than `disk_free`.
StatusOr<StatePlacement> PlaceBlockStates(const std::vector<BlockStateBytes>& blocks,
                                          uint64_t ram_available, uint64_t disk_free);

// The NVMe tier under a host limit: `in` predicted with every block on NVMe leaves the RAM under
// `limit` that the blocks' states may take (PlaceBlockStates, each block at what its master and
// moments add to the arena; then again with the smaller staging slots of that placement);
// `disk_free` (the store directories' free space) less the new versions in flight and the spilled
// activations is the disk. Sets in->optimizer.nvme_blocks. States first, then weights: when every
// block's states on NVMe still leave the prediction above `limit` and in->nvme_weights_allowed,
// NVMe blocks' 16-bit weights go to the store too (in->optimizer.nvme_weight_blocks), the
// smallest blocks first (the slots' and read buffers' weight regions take the largest one's size),
// equal ones from the last block down, until it fits (with in->nvme_weights_forced: every NVMe
// block's, PlaceWeightsOnNvme). Refused (ResourceExhausted) when that
// disk is short, naming the disk it lacks and the smallest host limit that would fit
// (SmallestHostLimitForDisk); in->optimizer.nvme_blocks is then empty (every block on NVMe).
StatusOr<StatePlacement> PlaceStatesUnderLimit(HostMemoryInputs* in, uint64_t limit,
                                               uint64_t disk_free);

// Where NVMe blocks' 16-bit weights live, once their states are placed (in->optimizer.nvme_blocks,
// empty: every block on NVMe): with in->nvme_weights_forced every block whose states are on NVMe
// and which the GPU does not update (optimizer.device_blocks) keeps its weights there too; else,
// with in->nvme_weights_allowed, as PlaceStatesUnderLimit places them under `limit`. None with
// fp32 compute (the device reads the fp32 masters). Sets in->optimizer.nvme_weight_blocks (empty:
// none) and returns the blocks' weight tiers (StatePlacement::weight_tiers, weight_disk_bytes).
StatePlacement PlaceWeightsOnNvme(HostMemoryInputs* in, uint64_t limit);

// The smallest host limit (rounded up to 1 MiB) above `limit` under which PlaceStatesUnderLimit's
// placement needs no more than `disk_free` of disk (more blocks' states in RAM); 0 when none does,
// not even with every block in RAM. What a refusal for disk space names beside the disk it lacks.
uint64_t SmallestHostLimitForDisk(const HostMemoryInputs& in, uint64_t limit, uint64_t disk_free);

// The free bytes of the file systems of `dirs` (each counted once; a directory not made yet counts
// its nearest existing parent); UINT64_MAX when none can be asked.
uint64_t StoreDirsFreeBytes(const std::vector<std::string>& dirs);

}  // namespace offloadd::trainer
