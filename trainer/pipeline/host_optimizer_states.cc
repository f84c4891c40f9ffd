// HostOptimizer's checkpoint I/O between steps: a block's states as fp32 values (ReadStates,
// RestoreStates) and, in a compact mode, its master and state regions byte for byte as the workers
// hold them. A block in the arena is copied there; a block whose states are on the NVMe tier goes
// through the store on the optimizer thread (NvmeStateTier, which keeps the same formats).
#include <algorithm>
#include <cstring>

#include "trainer/pipeline/host_optimizer.h"
#include "trainer/pipeline/nvme_state_tier.h"
#include "workers/adamw_compact.h"

namespace offloadd::trainer {

Status HostOptimizer::ReadStates(int block, float* master, float* exp_avg, float* exp_avg_sq) {
  if (follower_) return FollowerReadStates(block, master, exp_avg, exp_avg_sq);
  // In a compact mode the states are bytes of their own format: ReadStateRegions.
  if (!options_.mode.Exact() && (exp_avg != nullptr || exp_avg_sq != nullptr))
    return FailedPreconditionError("compact states are read with ReadStateRegions");
  if (OnNvme(block)) {
    return RunOnThread(
        [&]() -> Status { return tier_->ReadStates(block, master, exp_avg, exp_avg_sq); });
  }
  const auto& s = shards_[block];
  const uint64_t bytes = s.num_elements * 4;
  if (options_.mode.master == workers::MasterDtype::kBf16) {
    workers::DecodeBf16Master(
        arena_->At<uint16_t>(s.master_offset),
        arena_->At<uint16_t>(s.master_offset + workers::MasterCompOffset(s.num_elements)),
        s.num_elements, master);
  } else {
    std::memcpy(master, arena_->At<void>(s.master_offset), bytes);
  }
  if (exp_avg != nullptr) std::memcpy(exp_avg, arena_->At<void>(s.exp_avg_offset), bytes);
  if (exp_avg_sq != nullptr) std::memcpy(exp_avg_sq, arena_->At<void>(s.exp_avg_sq_offset), bytes);
  return OkStatus();
}

Status HostOptimizer::RestoreStates(int block, const float* master, const float* exp_avg,
                                    const float* exp_avg_sq, uint64_t adam_step) {
  if (follower_)
    return FailedPreconditionError(
        "only rank 0 of a data-parallel group holds the optimizer states");
  if (!options_.mode.Exact() && (exp_avg != nullptr || exp_avg_sq != nullptr))
    return FailedPreconditionError("compact states are restored with RestoreStateRegions");
  const auto& s = shards_[block];
  const uint64_t bytes = s.num_elements * 4;
  uint64_t* counters = arena_->At<uint64_t>(s.counters_offset);
  std::fill(counters, counters + workers::NumChunks(s.num_elements), adam_step);
  if (OnNvme(block)) {
    return RunOnThread(
        [&]() -> Status { return tier_->RestoreStates(block, master, exp_avg, exp_avg_sq); });
  }
  if (options_.mode.master == workers::MasterDtype::kBf16) {
    EncodeMaster(static_cast<size_t>(block), 0, master, s.num_elements);
  } else {
    std::memcpy(arena_->At<void>(s.master_offset), master, bytes);
  }
  if (options_.mode.Exact()) {  // compact states: RestoreStateRegions
    std::memcpy(arena_->At<void>(s.exp_avg_offset), exp_avg, bytes);
    std::memcpy(arena_->At<void>(s.exp_avg_sq_offset), exp_avg_sq, bytes);
  }
  if (s.weights_offset != 0)  // the 16-bit copy the device reads
    internal::To16(options_.compute, master, arena_->At<uint16_t>(s.weights_offset),
                   s.num_elements);
  return OkStatus();
}

void HostOptimizer::EncodeMaster(size_t block, uint64_t begin, const float* p, uint64_t count) {
  const workers::ShardSpec& s = shards_[block];
  auto* master = arena_->At<uint16_t>(s.master_offset);
  auto* comp = arena_->At<uint16_t>(s.master_offset + workers::MasterCompOffset(s.num_elements));
  workers::EncodeBf16Master(p, count, master + begin, comp + begin);
}

uint64_t HostOptimizer::master_region_bytes(int block) const {
  return workers::MasterRegionBytes(options_.mode.master, shards_[block].num_elements);
}

uint64_t HostOptimizer::state_region_bytes(int block) const {
  return workers::StateRegionBytes(options_.mode.state, shards_[block].num_elements);
}

// The compact regions through the store (NvmeStateTier's kinds: 0 the master region, 1 and 2 the
// exp_avg and exp_avg_sq regions). Reading them is logically const: the store's I/O runs on the
// optimizer thread, which RunOnThread hands it to.
Status HostOptimizer::ReadMasterRegion(int block, uint8_t* region) const {
  if (follower_ || options_.mode.master != workers::MasterDtype::kBf16)
    return FailedPreconditionError("no bf16 master region in this arena");
  if (OnNvme(block)) {
    return const_cast<HostOptimizer*>(this)->RunOnThread(
        [&]() -> Status { return tier_->ReadRegion(block, 0, region); });
  }
  std::memcpy(region, arena_->At<void>(shards_[block].master_offset), master_region_bytes(block));
  return OkStatus();
}

Status HostOptimizer::RestoreMasterRegion(int block, const uint8_t* region) {
  if (follower_ || options_.mode.master != workers::MasterDtype::kBf16)
    return FailedPreconditionError("no bf16 master region in this arena");
  if (OnNvme(block))  // the weights the device reads follow from it (NvmeStateTier)
    return RunOnThread([&]() -> Status { return tier_->RestoreRegion(block, 0, region); });
  std::memcpy(arena_->At<void>(shards_[block].master_offset), region, master_region_bytes(block));
  return OkStatus();
}

Status HostOptimizer::ReadStateRegions(int block, uint8_t* exp_avg, uint8_t* exp_avg_sq) const {
  if (follower_) return FailedPreconditionError("no state regions in this arena");
  if (OnNvme(block)) {
    return const_cast<HostOptimizer*>(this)->RunOnThread([&]() -> Status {
      RETURN_IF_ERROR(tier_->ReadRegion(block, 1, exp_avg));
      return tier_->ReadRegion(block, 2, exp_avg_sq);
    });
  }
  const auto& s = shards_[block];
  std::memcpy(exp_avg, arena_->At<void>(s.exp_avg_offset), state_region_bytes(block));
  std::memcpy(exp_avg_sq, arena_->At<void>(s.exp_avg_sq_offset), state_region_bytes(block));
  return OkStatus();
}

Status HostOptimizer::RestoreStateRegions(int block, const uint8_t* exp_avg,
                                          const uint8_t* exp_avg_sq) {
  if (follower_) return FailedPreconditionError("no state regions in this arena");
  if (OnNvme(block)) {
    return RunOnThread([&]() -> Status {
      RETURN_IF_ERROR(tier_->RestoreRegion(block, 1, exp_avg));
      return tier_->RestoreRegion(block, 2, exp_avg_sq);
    });
  }
  const auto& s = shards_[block];
  std::memcpy(arena_->At<void>(s.exp_avg_offset), exp_avg, state_region_bytes(block));
  std::memcpy(arena_->At<void>(s.exp_avg_sq_offset), exp_avg_sq, state_region_bytes(block));
  return OkStatus();
}

}  // namespace offloadd::trainer
