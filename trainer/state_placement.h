#pragma once
// Where each block's fp32 master weights and AdamW moments live between updates: in the shared
// arena (RAM) or in the NVMe store. One function decides it from the blocks' sizes, the host RAM
// left under the job's limit and the store directories' free space; the trainer applies it to the
// NVMe tier (HostOptimizerOptions::nvme_blocks) and the host-memory prediction prices it.
// Torch-free (library offloadd_trainer_arena).
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

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
  int ram_blocks() const;
  // HostOptimizerOptions::nvme_blocks: true for the blocks on NVMe.
  std::vector<bool> nvme_blocks() const;
  // "blocks 0-11, 14 in RAM (57.0 GiB), 12-13, 15-31 on NVMe (32.1 GiB)".
  std::string Describe() const;
};

// Blocks go into RAM in block order while they fit in `ram_available` (block 0 first: its update
// is the last of backward and the next forward needs it first, so a read from disk there would
// stall the step, while the later blocks' reads and writes overlap the rest of backward); a block
// that does not fit goes to NVMe and smaller later ones may still take RAM. A block with ram 0 and
// disk 0 (its states on the GPU) stays in RAM. Refused (ResourceExhausted, with the numbers) when
// the NVMe blocks need more than `disk_free`.
StatusOr<StatePlacement> PlaceBlockStates(const std::vector<BlockStateBytes>& blocks,
                                          uint64_t ram_available, uint64_t disk_free);

}  // namespace offloadd::trainer
