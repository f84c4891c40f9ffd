// NvmeStateTier: the staging slots, the store's reads and writes, and the prefetch of the next
// block's states while one is updated (trainer/pipeline/nvme_state_tier.h).
#include "trainer/pipeline/nvme_state_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/logging.h"
#include "job/arena_layout.h"
#include "storage/format.h"
#include "storage/store_client.h"

namespace offloadd::trainer {
namespace {

using storage::TensorKind;
constexpr uint32_t kKinds[3] = {static_cast<uint32_t>(TensorKind::kParamFp32),
                                static_cast<uint32_t>(TensorKind::kAdamM),
                                static_cast<uint32_t>(TensorKind::kAdamV)};
constexpr uint32_t kHalf = static_cast<uint32_t>(TensorKind::kParamHalf);

}  // namespace

Status NvmeStateTier::CheckOptions(const HostOptimizerOptions& o) {
  if (o.tier == StateTier::kNvme && o.nvme_dirs.empty())
    return InvalidArgumentError("the NVMe tier needs at least one store directory");
  if (!o.nvme_blocks.empty() && o.nvme_blocks.size() != o.block_elements.size()) {
    return InvalidArgumentError("nvme_blocks names " + std::to_string(o.nvme_blocks.size()) +
                                " blocks, the model has " +
                                std::to_string(o.block_elements.size()));
  }
  return CheckWeightPlacement(o);
}

StatusOr<std::unique_ptr<NvmeStateTier>> NvmeStateTier::Start(
    const HostOptimizerOptions& o, const ipc::SharedSegment& segment, ipc::Arena* arena,
    std::vector<workers::ShardSpec>* shards) {
  std::unique_ptr<NvmeStateTier> t(new NvmeStateTier());
  t->compute_ = o.compute;
  t->mode_ = o.mode;
  t->arena_ = arena;
  t->shards_ = shards;
  for (size_t b = 0; b < shards->size(); ++b) {
    t->on_nvme_.push_back(internal::OnNvme(o, b));
    t->weights_on_nvme_.push_back(internal::WeightsOnNvme(o, b));
  }
  RETURN_IF_ERROR(t->Allocate(o, shards));
  // Versions must grow per key, also across runs over the same directories.
  t->write_version_ = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch() /
                                            std::chrono::nanoseconds(1));
  storage::StoreProcessOptions so;
  so.binary = o.store_binary;
  for (const auto& d : o.nvme_dirs) so.args.push_back("--dir=" + d);
  so.args.push_back("--queue-depth=" + std::to_string(o.nvme_queue_depth));
  if (o.nvme_block_size > 0) so.args.push_back("--block-size=" + std::to_string(o.nvme_block_size));
  ASSIGN_OR_RETURN(t->store_, storage::StoreProcess::Launch(segment, arena, so));
  return t;
}

Status NvmeStateTier::Allocate(const HostOptimizerOptions& o,
                               std::vector<workers::ShardSpec>* shards_out) {
  // Regions in the mode's format (internal::ExtraBytes prices the same).
  const uint64_t max_n = std::max<uint64_t>(1, internal::MaxElements(o));
  const ipc::RegionKind kinds[3] = {ipc::RegionKind::kMaster, ipc::RegionKind::kExpAvg,
                                    ipc::RegionKind::kExpAvgSq};
  for (uint32_t s = 0; s < std::max<uint32_t>(2, o.nvme_slots); ++s) {
    auto slot = std::make_unique<Slot>();
    for (int k = 0; k < 3; ++k) {
      ASSIGN_OR_RETURN(ipc::Region r,
                       arena_->Allocate("slot" + std::to_string(s) + "." + std::to_string(k),
                                        kinds[k], RegionBytes(k, max_n)));
      slot->offset[k] = r.offset;
    }
    slots_.push_back(std::move(slot));
  }
  RETURN_IF_ERROR(AllocateWeightRegions(internal::MaxWeightElements(o)));
  std::vector<workers::ShardSpec>& shards = *shards_out;
  slot_of_.assign(shards.size(), -1);
  compute_copy_.assign(shards.size(), 0);
  for (size_t b = 0; b < shards.size(); ++b) {
    const std::string prefix = "B" + std::to_string(b) + ".";
    const uint64_t n = shards[b].num_elements;
    if (!on_nvme_[b]) {  // this block's states stay in RAM
      const char* names[3] = {"master", "exp_avg", "exp_avg_sq"};
      uint64_t* offsets[3] = {&shards[b].master_offset, &shards[b].exp_avg_offset,
                              &shards[b].exp_avg_sq_offset};
      for (int k = 0; k < 3; ++k) {
        ASSIGN_OR_RETURN(ipc::Region r,
                         arena_->Allocate(prefix + names[k], kinds[k], RegionBytes(k, n)));
        *offsets[k] = r.offset;
      }
    } else if (const uint64_t copy = internal::NvmeComputeCopyBytes(o, b); copy > 0) {
      ASSIGN_OR_RETURN(ipc::Region r,
                       arena_->Allocate(prefix + "compute", ipc::RegionKind::kParamStaging, copy));
      compute_copy_[b] = r.offset;
    }
  }
  return OkStatus();
}

uint64_t NvmeStateTier::RegionBytes(int kind, uint64_t n) const {
  return kind == 0 ? workers::MasterRegionBytes(mode_.master, n)
                   : workers::StateRegionBytes(mode_.state, n);
}

uint64_t NvmeStateTier::SlotWeights(const Slot& slot) const {
  return mode_.master == workers::MasterDtype::kBf16 ? slot.offset[0] : slot.offset[3];
}

void NvmeStateTier::DecodeMaster(size_t b, const Slot& slot, float* out) const {
  const uint64_t n = elements(b);
  if (mode_.master == workers::MasterDtype::kFp32) {
    std::memcpy(out, arena_->At<void>(slot.offset[0]), n * 4);
    return;
  }
  const auto* master = arena_->At<uint16_t>(slot.offset[0]);
  workers::DecodeBf16Master(master, master + workers::MasterCompOffset(n) / 2, n, out);
}

void NvmeStateTier::EncodeMaster(size_t b, const float* master, const Slot& slot) {
  const uint64_t n = elements(b);
  if (mode_.master == workers::MasterDtype::kFp32) {
    std::memcpy(arena_->At<void>(slot.offset[0]), master, n * 4);
    return;
  }
  auto* bf16 = arena_->At<uint16_t>(slot.offset[0]);
  // The padding between the master and its compensation is zero, as in a fresh arena: the slot
  // held other blocks, and the region is stored and checkpointed whole.
  std::memset(bf16 + n, 0, workers::MasterCompOffset(n) - 2 * n);
  workers::EncodeBf16Master(master, n, bf16, bf16 + workers::MasterCompOffset(n) / 2);
}

NvmeStateTier::~NvmeStateTier() {
  if (!store_) return;
  // Bounded: a store that stopped answering is killed rather than waited on (a job that ends must
  // not hang on it).
  Status st = store_->Shutdown(/*timeout_ms=*/5000);
  if (!st.ok()) OFFLOADD_LOG(kWarning, "trainer") << "store shutdown: " << st.ToString();
}

void* NvmeStateTier::compute_copy(size_t block) const {
  return compute_copy_[block] == 0 ? nullptr : arena_->At<void>(compute_copy_[block]);
}

NvmeStateTier::Totals NvmeStateTier::TakeTotals() {
  std::lock_guard<std::mutex> lock(totals_mu_);
  Totals t = totals_;
  totals_ = Totals{};
  return t;
}

void NvmeStateTier::AddBusy(double seconds) {
  std::lock_guard<std::mutex> lock(totals_mu_);
  totals_.busy_seconds += seconds;
}

StatusOr<NvmeStateTier::Slot*> NvmeStateTier::ScratchSlot() {
  while (io_outstanding_ > 0) RETURN_IF_ERROR(PumpStore(true));
  // Every slot's states are written back already; a prefetched one may be about to change in the
  // store (a restore), so none is kept.
  for (auto& slot : slots_) {
    if (slot->shard >= 0) slot_of_[slot->shard] = -1;
    slot->shard = -1;
  }
  next_slot_ = 0;
  last_staged_ = -1;
  return slots_[0].get();
}

Status NvmeStateTier::Drain() {
  while (io_outstanding_ > 0) RETURN_IF_ERROR(PumpStore(true));
  return OkStatus();
}

Status NvmeStateTier::StoreIo(bool write, uint32_t layer, uint32_t kind, uint64_t offset,
                              uint64_t bytes, bool wait) {
  storage::StoreCommand c;
  c.layer = layer;
  c.kind = kind;
  c.version = write ? ++write_version_ : storage::kLatestVersion;
  c.offset = offset;
  c.bytes = bytes;
  const uint64_t id = next_io_id_++;
  RETURN_IF_ERROR(
      store_->Submit(write ? storage::StoreOp::kWrite : storage::StoreOp::kRead, id, c));
  ++io_outstanding_;
  {
    std::lock_guard<std::mutex> lock(totals_mu_);
    (write ? totals_.write_bytes : totals_.read_bytes) += bytes;
  }
  if (!wait) return OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  while (std::find(io_done_.begin(), io_done_.end(), id) == io_done_.end())
    RETURN_IF_ERROR(PumpStore(true));
  io_done_.erase(std::find(io_done_.begin(), io_done_.end(), id));
  AddBusy(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return OkStatus();
}

Status NvmeStateTier::PumpStore(bool block) {
  auto c = store_->NextCompletion(block ? -1 : 0);
  if (!c.ok()) {
    if (!block && c.status().code() == StatusCode::kDeadlineExceeded) return OkStatus();
    return c.status().WithContext("NVMe store");
  }
  --io_outstanding_;
  RETURN_IF_ERROR(c->status().WithContext("NVMe store I/O " + std::to_string(c->id)));
  // Slot I/O is tracked by its slot; a synchronous StoreIo claims its id from io_done_.
  for (auto& slot : slots_) {
    for (auto* v : {&slot->pending_reads, &slot->pending_writes}) {
      auto it = std::find(v->begin(), v->end(), c->id);
      if (it != v->end()) {
        v->erase(it);
        return OkStatus();
      }
    }
  }
  io_done_.push_back(c->id);
  return OkStatus();
}

Status NvmeStateTier::AfterUpdate(size_t shard) {
  const Slot& slot = *slots_[slot_of_[shard]];
  if (compute_copy_[shard] != 0) {  // the fp32 master, or a bf16 master's first half
    std::memcpy(arena_->At<void>(compute_copy_[shard]), arena_->At<void>(slot.offset[0]),
                elements(shard) * (compute_ == HostDtype::kFp32 ? 4 : 2));
  }
  return WriteBack(shard);
}

Status NvmeStateTier::WriteBack(size_t shard) {
  Slot& slot = *slots_[slot_of_[shard]];
  for (int k = 0; k < 3; ++k) {
    const uint64_t id = next_io_id_;
    RETURN_IF_ERROR(StoreIo(true, static_cast<uint32_t>(shard), kKinds[k], slot.offset[k],
                            RegionBytes(k, elements(shard)), false));
    slot.pending_writes.push_back(id);
  }
  if (WeightsOnNvme(shard)) {  // the new 16-bit weights the update wrote into the slot
    DropWeightReads(shard);
    const uint64_t id = next_io_id_;
    RETURN_IF_ERROR(StoreIo(true, static_cast<uint32_t>(shard), kHalf, SlotWeights(slot),
                            elements(shard) * 2, false));
    slot.pending_writes.push_back(id);
  }
  return OkStatus();
}

StatusOr<int> NvmeStateTier::IssueReads(size_t shard) {
  // The next slot in turn; its previous shard must be updated and written back first (a
  // prefetched shard that was not staged after all is simply dropped: it is unchanged).
  Slot& slot = *slots_[next_slot_];
  const int slot_index = static_cast<int>(next_slot_);
  next_slot_ = (next_slot_ + 1) % slots_.size();
  if (slot.shard >= 0) {
    RETURN_IF_ERROR(driver_->WaitShardIdle(slot.shard));  // its update (and write-back issue)
    while (!slot.pending_writes.empty() || !slot.pending_reads.empty())
      RETURN_IF_ERROR(PumpStore(true));
    slot_of_[slot.shard] = -1;
  }
  slot.shard = static_cast<int>(shard);
  slot_of_[shard] = slot_index;
  for (int k = 0; k < 3; ++k) {
    const uint64_t id = next_io_id_;
    RETURN_IF_ERROR(StoreIo(false, static_cast<uint32_t>(shard), kKinds[k], slot.offset[k],
                            RegionBytes(k, elements(shard)), false));
    slot.pending_reads.push_back(id);
  }
  return slot_index;
}

int NvmeStateTier::PrefetchCandidate(size_t shard) const {
  const int s = static_cast<int>(shard);
  const int step = last_staged_ >= 0 && last_staged_ < s ? 1 : -1;  // backward: down
  const int n = static_cast<int>(shards_->size());
  for (int b = s + step; b >= 0 && b < n; b += step) {
    if (OnNvme(static_cast<size_t>(b)) && !(*shards_)[b].on_device)
      return slot_of_[b] >= 0 ? -1 : b;
  }
  return -1;
}

Status NvmeStateTier::StageIn(size_t shard, workers::ShardSpec* spec) {
  const auto t0 = std::chrono::steady_clock::now();
  int slot_index = slot_of_[shard];
  if (slot_index >= 0) {
    // Its reads were issued ahead (or, within this step, the slot still holds what its update
    // wrote back: that write must be done before the slot changes again).
    ++prefetch_hits_;
    while (!slots_[slot_index]->pending_writes.empty()) RETURN_IF_ERROR(PumpStore(true));
  } else {
    ASSIGN_OR_RETURN(slot_index, IssueReads(shard));
  }
  // Read the next shard's states while this one is updated (with at least three slots: one
  // updated, one writing back, one reading).
  if (slots_.size() >= 3) {
    const int next = PrefetchCandidate(shard);
    // Never into this shard's own slot (a slot kept from an earlier step sits anywhere in turn).
    if (next >= 0 && next_slot_ == static_cast<size_t>(slot_index))
      next_slot_ = (next_slot_ + 1) % slots_.size();
    if (next >= 0) RETURN_IF_ERROR(IssueReads(static_cast<size_t>(next)).status());
  }
  last_staged_ = static_cast<int>(shard);
  Slot& slot = *slots_[slot_index];
  while (!slot.pending_reads.empty()) RETURN_IF_ERROR(PumpStore(true));
  spec->master_offset = slot.offset[0];
  spec->exp_avg_offset = slot.offset[1];
  spec->exp_avg_sq_offset = slot.offset[2];
  // The update writes the 16-bit weights there (a bf16 master is its own weights).
  if (WeightsOnNvme(shard) && slot.offset[3] != 0) spec->weights_offset = slot.offset[3];
  AddBusy(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return OkStatus();
}

// ---- between steps: initial values and checkpoints ----

Status NvmeStateTier::InitializeBlock(size_t b, const std::function<Status(float*)>& fill) {
  const uint64_t n = elements(b);
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  std::vector<float> scratch;  // a bf16 master is rounded from fp32 values filled beside it
  if (mode_.master == workers::MasterDtype::kBf16) scratch.resize(n);
  float* master = scratch.empty() ? arena_->At<float>(slot->offset[0]) : scratch.data();
  RETURN_IF_ERROR(fill(master));
  if (!scratch.empty()) EncodeMaster(b, master, *slot);
  if (compute_copy_[b] != 0 && compute_ == HostDtype::kFp32)
    std::memcpy(arena_->At<void>(compute_copy_[b]), master, n * 4);
  RETURN_IF_ERROR(Derive16(b, master, slot));
  // Zero moments in every format (int8: zero codes and zero block scales).
  std::memset(arena_->At<void>(slot->offset[1]), 0, RegionBytes(1, n));
  std::memset(arena_->At<void>(slot->offset[2]), 0, RegionBytes(2, n));
  for (int k = 0; k < 3; ++k) {
    RETURN_IF_ERROR(StoreIo(true, static_cast<uint32_t>(b), kKinds[k], slot->offset[k],
                            RegionBytes(k, n), true));
  }
  return OkStatus();
}

Status NvmeStateTier::ReadStates(size_t b, float* master, float* exp_avg, float* exp_avg_sq) {
  const uint64_t n = elements(b);
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  float* dst[3] = {master, exp_avg, exp_avg_sq};
  for (int k = 0; k < 3; ++k) {
    if (dst[k] == nullptr) continue;
    if (k > 0 && !mode_.Exact())
      return FailedPreconditionError("compact states are read with ReadRegion");
    RETURN_IF_ERROR(StoreIo(false, static_cast<uint32_t>(b), kKinds[k], slot->offset[k],
                            RegionBytes(k, n), true));
    if (k == 0) {
      DecodeMaster(b, *slot, master);
    } else {
      std::memcpy(dst[k], arena_->At<void>(slot->offset[k]), n * 4);
    }
  }
  return OkStatus();
}

Status NvmeStateTier::RestoreStates(size_t b, const float* master, const float* exp_avg,
                                    const float* exp_avg_sq) {
  const uint64_t n = elements(b);
  if (!mode_.Exact() && (exp_avg != nullptr || exp_avg_sq != nullptr))
    return FailedPreconditionError("compact states are restored with RestoreRegion");
  if (mode_.Exact() && (exp_avg == nullptr || exp_avg_sq == nullptr))
    return InvalidArgumentError("exact AdamW restores both moments");
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  EncodeMaster(b, master, *slot);
  const float* src[3] = {master, exp_avg, exp_avg_sq};
  for (int k = 0; k < 3; ++k) {
    if (src[k] == nullptr) continue;  // compact moments: RestoreRegion
    if (k > 0) std::memcpy(arena_->At<void>(slot->offset[k]), src[k], n * 4);
    RETURN_IF_ERROR(StoreIo(true, static_cast<uint32_t>(b), kKinds[k], slot->offset[k],
                            RegionBytes(k, n), true));
  }
  if (compute_copy_[b] != 0 && compute_ == HostDtype::kFp32)
    std::memcpy(arena_->At<void>(compute_copy_[b]), master, n * 4);
  return Derive16(b, master, slot);
}

Status NvmeStateTier::ReadRegion(size_t b, int kind, uint8_t* out) {
  const uint64_t bytes = RegionBytes(kind, elements(b));
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  RETURN_IF_ERROR(
      StoreIo(false, static_cast<uint32_t>(b), kKinds[kind], slot->offset[kind], bytes, true));
  std::memcpy(out, arena_->At<void>(slot->offset[kind]), bytes);
  return OkStatus();
}

Status NvmeStateTier::RestoreRegion(size_t b, int kind, const uint8_t* in) {
  const uint64_t bytes = RegionBytes(kind, elements(b));
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  std::memcpy(arena_->At<void>(slot->offset[kind]), in, bytes);
  RETURN_IF_ERROR(
      StoreIo(true, static_cast<uint32_t>(b), kKinds[kind], slot->offset[kind], bytes, true));
  if (kind != 0) return OkStatus();
  // The weights the device reads, from the restored master (a bf16 master's own half).
  std::vector<float> master;
  if (mode_.master == workers::MasterDtype::kFp32) {
    master.resize(elements(b));
    DecodeMaster(b, *slot, master.data());
    if (compute_copy_[b] != 0)
      std::memcpy(arena_->At<void>(compute_copy_[b]), master.data(), bytes);
  }
  return Derive16(b, master.empty() ? nullptr : master.data(), slot);
}

}  // namespace offloadd::trainer
