// NvmeStateTier: the staging slots, the store's reads and writes, and the prefetch of the next
// block's states while one is updated (trainer/pipeline/nvme_state_tier.h).
#include "trainer/pipeline/nvme_state_tier.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

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
  const uint64_t max_n = std::max<uint64_t>(1, internal::MaxElements(o));
  for (uint32_t s = 0; s < std::max<uint32_t>(2, o.nvme_slots); ++s) {
    auto slot = std::make_unique<Slot>();
    const ipc::RegionKind kinds[3] = {ipc::RegionKind::kMaster, ipc::RegionKind::kExpAvg,
                                      ipc::RegionKind::kExpAvgSq};
    for (int k = 0; k < 3; ++k) {
      ASSIGN_OR_RETURN(ipc::Region r,
                       arena_->Allocate("slot" + std::to_string(s) + "." + std::to_string(k),
                                        kinds[k], max_n * 4));
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
    const uint64_t bytes4 = shards[b].num_elements * 4;
    if (!on_nvme_[b]) {  // this block's states stay in RAM
      ASSIGN_OR_RETURN(ipc::Region m,
                       arena_->Allocate(prefix + "master", ipc::RegionKind::kMaster, bytes4));
      ASSIGN_OR_RETURN(ipc::Region v1,
                       arena_->Allocate(prefix + "exp_avg", ipc::RegionKind::kExpAvg, bytes4));
      ASSIGN_OR_RETURN(ipc::Region v2,
                       arena_->Allocate(prefix + "exp_avg_sq", ipc::RegionKind::kExpAvgSq, bytes4));
      shards[b].master_offset = m.offset;
      shards[b].exp_avg_offset = v1.offset;
      shards[b].exp_avg_sq_offset = v2.offset;
    } else if (o.compute == HostDtype::kFp32) {
      ASSIGN_OR_RETURN(ipc::Region r, arena_->Allocate(prefix + "compute",
                                                       ipc::RegionKind::kParamStaging, bytes4));
      compute_copy_[b] = r.offset;
    }
  }
  return OkStatus();
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
  if (compute_copy_[shard] != 0) {
    std::memcpy(arena_->At<void>(compute_copy_[shard]), arena_->At<void>(slot.offset[0]),
                elements(shard) * 4);
  }
  return WriteBack(shard);
}

Status NvmeStateTier::WriteBack(size_t shard) {
  Slot& slot = *slots_[slot_of_[shard]];
  const uint64_t bytes = elements(shard) * 4;
  for (int k = 0; k < 3; ++k) {
    const uint64_t id = next_io_id_;
    RETURN_IF_ERROR(
        StoreIo(true, static_cast<uint32_t>(shard), kKinds[k], slot.offset[k], bytes, false));
    slot.pending_writes.push_back(id);
  }
  if (WeightsOnNvme(shard)) {  // the new 16-bit weights the update wrote into the slot
    DropWeightReads(shard);
    const uint64_t id = next_io_id_;
    RETURN_IF_ERROR(StoreIo(true, static_cast<uint32_t>(shard), kHalf, slot.offset[3],
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
  const uint64_t bytes = elements(shard) * 4;
  for (int k = 0; k < 3; ++k) {
    const uint64_t id = next_io_id_;
    RETURN_IF_ERROR(
        StoreIo(false, static_cast<uint32_t>(shard), kKinds[k], slot.offset[k], bytes, false));
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
  if (WeightsOnNvme(shard)) spec->weights_offset = slot.offset[3];  // the update writes them there
  AddBusy(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return OkStatus();
}

// ---- between steps: initial values and checkpoints ----

Status NvmeStateTier::InitializeBlock(size_t b, const std::function<Status(float*)>& fill) {
  const uint64_t n = elements(b);
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  float* master = arena_->At<float>(slot->offset[0]);
  RETURN_IF_ERROR(fill(master));
  if (compute_copy_[b] != 0) std::memcpy(arena_->At<void>(compute_copy_[b]), master, n * 4);
  RETURN_IF_ERROR(Derive16(b, master, slot));
  std::memset(arena_->At<void>(slot->offset[1]), 0, n * 4);
  std::memset(arena_->At<void>(slot->offset[2]), 0, n * 4);
  for (int k = 0; k < 3; ++k) {
    RETURN_IF_ERROR(
        StoreIo(true, static_cast<uint32_t>(b), kKinds[k], slot->offset[k], n * 4, true));
  }
  return OkStatus();
}

Status NvmeStateTier::ReadStates(size_t b, float* master, float* exp_avg, float* exp_avg_sq) {
  const uint64_t bytes = elements(b) * 4;
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  float* dst[3] = {master, exp_avg, exp_avg_sq};
  for (int k = 0; k < 3; ++k) {
    RETURN_IF_ERROR(
        StoreIo(false, static_cast<uint32_t>(b), kKinds[k], slot->offset[k], bytes, true));
    std::memcpy(dst[k], arena_->At<void>(slot->offset[k]), bytes);
  }
  return OkStatus();
}

Status NvmeStateTier::RestoreStates(size_t b, const float* master, const float* exp_avg,
                                    const float* exp_avg_sq) {
  const uint64_t bytes = elements(b) * 4;
  ASSIGN_OR_RETURN(Slot * slot, ScratchSlot());
  const float* src[3] = {master, exp_avg, exp_avg_sq};
  for (int k = 0; k < 3; ++k) {
    std::memcpy(arena_->At<void>(slot->offset[k]), src[k], bytes);
    RETURN_IF_ERROR(
        StoreIo(true, static_cast<uint32_t>(b), kKinds[k], slot->offset[k], bytes, true));
  }
  if (compute_copy_[b] != 0) std::memcpy(arena_->At<void>(compute_copy_[b]), master, bytes);
  return Derive16(b, master, slot);
}

}  // namespace offloadd::trainer
