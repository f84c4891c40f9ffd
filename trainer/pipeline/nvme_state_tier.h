#pragma once
// NvmeStateTier: the NVMe tier of the host optimizer's states (HostOptimizerOptions::tier nvme).
// Owns the offloadd-store process, the staging slots a block's states (master, exp_avg,
// exp_avg_sq) pass through between their read and their write-back, the compute copies of NVMe
// blocks (the fp32 master under fp32 compute, a bf16 master's weights), and, for blocks whose
// 16-bit weights live in the store too (nvme_weight_blocks), the slots' weight regions and the read
// buffers FetchWeights fills. The states are stored and staged in the optimizer mode's own byte
// format (HostOptimizerOptions::mode, workers/adamw_compact.h: one region per tensor, as the
// workers step it; fp32 for exact AdamW, bf16 or int8 codes with their block scales, a bf16 master
// with its compensation), so a compact mode reads and writes fewer bytes and needs smaller slots.
//
// HostOptimizer (host_optimizer.h) owns the arena, the worker pool and the step driver, and drives
// this tier from its optimizer thread: StageIn before a block's update (the step driver's
// before-update hook; it issues the next block's reads ahead), AfterUpdate right after it (the
// write-back, behind the update), Drain at the step's end, BeginStep at its start. The slots and
// the store's I/O are the optimizer thread's: every method is for that thread except Start,
// the destructor, the constant accessors and TakeTotals / weight_prefetch_hits (any thread).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "ipc/arena.h"
#include "ipc/shm_segment.h"
#include "job/host_optimizer_options.h"
#include "workers/step_driver.h"

namespace offloadd::storage {
class StoreProcess;
}

namespace offloadd::trainer {

class NvmeStateTier {
 public:
  // The NVMe options HostOptimizer::Create refuses, naming the field: no store directory,
  // nvme_blocks of another length than the model, 16-bit weights on NVMe where they cannot act.
  static Status CheckOptions(const HostOptimizerOptions& o);
  // Allocates in `arena` the staging slots, the weights' regions, the in-RAM states of the blocks
  // nvme_blocks keeps in RAM (their offsets are written into `shards`) and the fp32 compute
  // copies, and launches the store over `segment`. `shards` (one per block) must outlive the tier;
  // it reads their sizes and on_device marks from then on.
  static StatusOr<std::unique_ptr<NvmeStateTier>> Start(const HostOptimizerOptions& o,
                                                        const ipc::SharedSegment& segment,
                                                        ipc::Arena* arena,
                                                        std::vector<workers::ShardSpec>* shards);
  ~NvmeStateTier();  // shuts the store down, bounded (a stopped store is killed)

  // The step driver whose updates a slot waits for before it is reused; set before the first step.
  void SetDriver(workers::StepDriver* driver) { driver_ = driver; }

  // The block's states live in the store (HostOptimizerOptions::nvme_blocks).
  bool OnNvme(size_t block) const { return on_nvme_[block]; }
  // The block's 16-bit weights live in the store too (HostOptimizerOptions::nvme_weight_blocks).
  bool WeightsOnNvme(size_t block) const { return weights_on_nvme_[block]; }
  // The weights the device computes with for an NVMe block, copied from the staged master after
  // each update: the fp32 master under fp32 compute, a bf16 master's bf16 half (unless its weights
  // are on NVMe); null otherwise.
  void* compute_copy(size_t block) const;
  const storage::StoreProcess& store() const { return *store_; }

  // ---- optimizer thread ----
  // A step begins: every NVMe block's states are read again, even one a slot still holds from the
  // last step (its read is where a dead store shows before the block is updated).
  Status BeginStep() { return ScratchSlot().status(); }
  // Before block's update: its states staged into a slot (read ahead or now), the next block's
  // read issued, and `spec` pointed at the slot.
  Status StageIn(size_t block, workers::ShardSpec* spec);
  // Right after block's update: the compute copy, and the write-back of its states (and of its
  // 16-bit weights on NVMe) issued.
  Status AfterUpdate(size_t block);
  // Waits for every read and write in flight (the step's last write-backs).
  Status Drain();
  // Between steps. Initial values: `fill` writes the block's fp32 master weights (into a slot, or
  // a buffer a bf16 master is rounded from); the compute copy and the 16-bit weights are derived
  // from them, the moments start at zero and all is written to the store.
  Status InitializeBlock(size_t block, const std::function<Status(float* master)>& fill);
  // Checkpoint I/O of a block's states (each elements(block) floats) through the store; a null
  // pointer skips that tensor. In a compact mode only the master (decoded to fp32; restored by
  // rounding, workers::EncodeBf16Master) and the moments are null: their regions are below.
  Status ReadStates(size_t block, float* master, float* exp_avg, float* exp_avg_sq);
  Status RestoreStates(size_t block, const float* master, const float* exp_avg,
                       const float* exp_avg_sq);
  // A block's master region (kind 0) or exp_avg / exp_avg_sq region (1, 2) byte for byte as the
  // workers hold it (RegionBytes), through the store. Restoring the master region derives the
  // weights the device reads from it again.
  Status ReadRegion(size_t block, int kind, uint8_t* out);
  Status RestoreRegion(size_t block, int kind, const uint8_t* in);
  // The bytes of a block's region `kind` (0 master, 1 exp_avg, 2 exp_avg_sq) in the mode's format.
  uint64_t RegionBytes(int kind, uint64_t elements) const;
  // HostOptimizer::PrefetchWeights / FetchWeights, once their arguments are checked.
  Status PrefetchWeights(int block, int buffer);
  StatusOr<const void*> FetchWeights(int block, int buffer);

  // ---- any thread ----
  void* weight_buffer(int buffer) const;  // null where out of range or none
  uint64_t weight_buffer_bytes() const;
  uint64_t weight_prefetch_hits() const { return weight_prefetch_hits_.load(); }
  struct Totals {  // since the last TakeTotals()
    double busy_seconds = 0;
    uint64_t read_bytes = 0, write_bytes = 0;
  };
  Totals TakeTotals();

 private:
  // A staging slot: one block's states between their read and their write-back.
  struct Slot {
    // master, exp_avg, exp_avg_sq (the mode's regions); 16-bit weights (0: none on NVMe, or a
    // bf16 master, whose first half they are)
    uint64_t offset[4] = {};
    int shard = -1;           // whose states it holds
    bool loaded = false;      // reads complete
    std::vector<uint64_t> pending_reads, pending_writes;
  };
  struct WeightRead {  // per weight buffer: the read issued into it
    int block = -1;
    uint64_t id = 0;     // its store I/O, 0: none in flight
    bool stale = false;  // a write-back of the block came after it
  };
  NvmeStateTier() = default;
  Status Allocate(const HostOptimizerOptions& o, std::vector<workers::ShardSpec>* shards);
  Status AllocateWeightRegions(uint64_t max_weight_elements);
  static Status CheckWeightPlacement(const HostOptimizerOptions& o);
  uint64_t elements(size_t block) const { return (*shards_)[block].num_elements; }
  // Waits for all store I/O and hands out slot 0 for checkpoint / init copies.
  StatusOr<Slot*> ScratchSlot();
  // Takes the next slot in turn for `block` (once its previous block's update and write-back are
  // done) and issues the reads of its states; returns the slot.
  StatusOr<int> IssueReads(size_t block);
  // The NVMe block the next update will most likely stage, from the direction the staged blocks
  // move in (down during backward): -1 when none.
  int PrefetchCandidate(size_t block) const;
  Status WriteBack(size_t block);
  Status StoreIo(bool write, uint32_t layer, uint32_t kind, uint64_t offset, uint64_t bytes,
                 bool wait);
  Status PumpStore(bool block);
  Status ClaimIo(uint64_t id);  // waits for a non-slot I/O to complete
  void AddBusy(double seconds);
  // The 16-bit copy of `master` for block b: into its arena region, or (weights on NVMe) into
  // `slot`'s and written to the store. A bf16 master: its first half in `slot` (master unused)
  // into the compute copy, or to the store.
  Status Derive16(size_t b, const float* master, const Slot* slot);
  // The staged master's fp32 value into `out` (a bf16 master decoded with its compensation), and
  // `master` into the slot in the mode's format.
  void DecodeMaster(size_t b, const Slot& slot, float* out) const;
  void EncodeMaster(size_t b, const float* master, const Slot& slot);
  // The offset of the 16-bit weights a staged block's update leaves in `slot` (weights on NVMe).
  uint64_t SlotWeights(const Slot& slot) const;
  Status IssueWeightRead(int block, int buffer);
  void DropWeightReads(size_t block);  // its reads in flight are stale

  HostDtype compute_ = HostDtype::kFp32;
  workers::OptimizerMode mode_;
  ipc::Arena* arena_ = nullptr;
  const std::vector<workers::ShardSpec>* shards_ = nullptr;
  workers::StepDriver* driver_ = nullptr;
  std::vector<bool> on_nvme_, weights_on_nvme_;
  uint64_t max_weight_elements_ = 0;
  std::unique_ptr<storage::StoreProcess> store_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<int> slot_of_;              // per block: slot holding its states, -1
  std::vector<uint64_t> compute_copy_;    // per block: its compute copy's region (0: none)
  std::vector<uint64_t> weight_buffers_;  // FetchWeights' destinations (kArenaWeightBuffers)
  std::vector<WeightRead> weight_reads_;
  std::atomic<uint64_t> weight_prefetch_hits_{0};
  size_t next_slot_ = 0;
  int last_staged_ = -1;  // the block StageIn staged last
  uint64_t prefetch_hits_ = 0;
  uint64_t next_io_id_ = 1;
  uint64_t write_version_ = 0;
  std::vector<uint64_t> io_done_;  // ids completed but not yet claimed
  uint64_t io_outstanding_ = 0;
  std::mutex totals_mu_;
  Totals totals_;
};

}  // namespace offloadd::trainer
