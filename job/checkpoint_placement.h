#pragma once
// Where each offloaded layer input (a recomputed layer's checkpoint, recompute_offload_cpu) waits
// between its forward and its backward: in pinned host RAM, or on NVMe through the activation
// spill (trainer/activation_spill.h) when the host memory limit cannot hold them all, as at long
// sequence lengths (an 8B model's 32 layer inputs at 128K tokens are 32 GiB in bf16).
//
// The planner moves the lowest layers first: their inputs are written first and read back last,
// so each write has the whole rest of the forward and most of the backward to finish, and the
// top layers, whose inputs the backward wants first, stay in RAM. It moves as few as free what the
// limit needs, counting the spill's pinned staging buffer that the first move brings. Each moved
// layer costs its input's bytes written and read once per micro-batch at the store's rates (the
// node profile's), priced against the step's compute.
//
// Torch-free; thread-compatible.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::trainer {

// The activation spill's pinned staging buffer for the largest record it will hold: five records
// (one being written, reads ahead, one being consumed, and room for first-fit's holes when the
// micro-batches' lengths differ), and for offload_nvme blocks' whole saved activations at least
// 64 MiB. 0 when nothing goes to NVMe.
uint64_t ActivationSpillBufferBytes(uint64_t largest_keep_record, uint64_t largest_checkpoint);
// A record's bytes in the spill: 4 KiB-aligned (O_DIRECT).
uint64_t SpillRecordBytes(uint64_t bytes);

struct CheckpointPlacementInputs {
  // Per block: its offloaded checkpoint's bytes per micro-batch; 0 for a block without one.
  std::vector<uint64_t> bytes;
  // Predicted host RAM beyond the limit with every checkpoint in RAM (0: they all fit).
  uint64_t ram_over = 0;
  // The store directories exist (nvme_path): without them nothing can move.
  bool nvme_configured = false;
  // The staging buffer the spill has anyway (offload_nvme blocks), and their largest record.
  uint64_t largest_keep_record = 0;
  int accumulation = 1;  // micro-batches per step: each writes and reads every moved input
  // The store's rates (node profile; 0: not measured, the time is then not priced).
  double write_bytes_per_s = 0, read_bytes_per_s = 0;
  double compute_seconds = 0;  // the step's compute, what the I/O overlaps (0: unknown)
};

struct CheckpointPlacement {
  std::vector<bool> to_nvme;  // per block
  int moved = 0;
  uint64_t ram_bytes = 0;        // checkpoints left in pinned RAM
  uint64_t nvme_bytes = 0;       // checkpoints on NVMe, per micro-batch
  uint64_t buffer_bytes = 0;     // the spill's staging buffer with them (0: no spill)
  uint64_t disk_bytes = 0;       // their records on disk and the versions in flight
  double nvme_seconds = 0;       // their writes and reads per step at the store's rates
  double per_layer_seconds = 0;  // of the largest moved layer
  // "layer inputs: layers 0-5 on NVMe (6 x 2.0 GiB written and read per micro-batch: 4.1 s per
  // step at the store's rates against 9.2 s of compute), layers 6-31 in pinned RAM (52 GiB)".
  std::string Describe(const CheckpointPlacementInputs& in) const;
};

// The fewest lowest checkpoints on NVMe that bring the host RAM under its limit; every one of
// them when that is not enough (the caller's host memory check then refuses with the numbers).
// Nothing moves when nothing is over the limit or no store directory is configured.
CheckpointPlacement PlaceCheckpoints(const CheckpointPlacementInputs& in);

// RESOURCE_EXHAUSTED naming the bytes needed when the moved checkpoints' disk (with what the store
// holds already, `other_disk_bytes`) exceeds `disk_free` (StoreDirsFreeBytes).
Status CheckCheckpointDisk(const CheckpointPlacement& p, uint64_t other_disk_bytes,
                           uint64_t disk_free);

}  // namespace offloadd::trainer
