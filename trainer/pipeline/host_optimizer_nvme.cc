// HostOptimizer's NVMe tier: the staging slots, the store's reads and writes, and the prefetch of
// the next block's states while one is updated (trainer/pipeline/host_optimizer.h).
#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/logging.h"
#include "storage/format.h"
#include "storage/store_client.h"
#include "trainer/pipeline/host_optimizer.h"
#include "trainer/pipeline/host_optimizer_layout.h"
#include "workers/shard_layout.h"
#include "workers/worker_pool.h"

namespace offloadd::trainer {
namespace {

using storage::TensorKind;
constexpr uint32_t kKinds[3] = {static_cast<uint32_t>(TensorKind::kParamFp32),
                                static_cast<uint32_t>(TensorKind::kAdamM),
                                static_cast<uint32_t>(TensorKind::kAdamV)};
constexpr uint32_t kHalf = static_cast<uint32_t>(TensorKind::kParamHalf);

}  // namespace

StatusOr<HostOptimizer::Slot*> HostOptimizer::ScratchSlot() {
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

Status HostOptimizer::StoreIo(bool write, uint32_t layer, uint32_t kind, uint64_t offset,
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
    std::lock_guard<std::mutex> lock(mu_);
    (write ? totals_.nvme_write_bytes : totals_.nvme_read_bytes) += bytes;
  }
  if (!wait) return OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  while (std::find(io_done_.begin(), io_done_.end(), id) == io_done_.end())
    RETURN_IF_ERROR(PumpStore(true));
  io_done_.erase(std::find(io_done_.begin(), io_done_.end(), id));
  std::lock_guard<std::mutex> lock(mu_);
  totals_.nvme_busy_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return OkStatus();
}

Status HostOptimizer::PumpStore(bool block) {
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

Status HostOptimizer::WriteBack(size_t shard) {
  Slot& slot = *slots_[slot_of_[shard]];
  const uint64_t bytes = shards_[shard].num_elements * 4;
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
                            shards_[shard].num_elements * 2, false));
    slot.pending_writes.push_back(id);
  }
  return OkStatus();
}

StatusOr<int> HostOptimizer::IssueReads(size_t shard) {
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
  const uint64_t bytes = shards_[shard].num_elements * 4;
  for (int k = 0; k < 3; ++k) {
    const uint64_t id = next_io_id_;
    RETURN_IF_ERROR(
        StoreIo(false, static_cast<uint32_t>(shard), kKinds[k], slot.offset[k], bytes, false));
    slot.pending_reads.push_back(id);
  }
  return slot_index;
}

int HostOptimizer::PrefetchCandidate(size_t shard) const {
  const int s = static_cast<int>(shard);
  const int step = last_staged_ >= 0 && last_staged_ < s ? 1 : -1;  // backward: down
  for (int b = s + step; b >= 0 && b < num_blocks(); b += step) {
    if (OnNvme(static_cast<size_t>(b)) && !shards_[b].on_device) return slot_of_[b] >= 0 ? -1 : b;
  }
  return -1;
}

Status HostOptimizer::StageIn(size_t shard, workers::ShardSpec* spec) {
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
  std::lock_guard<std::mutex> lock(mu_);
  totals_.nvme_busy_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return OkStatus();
}

}  // namespace offloadd::trainer
