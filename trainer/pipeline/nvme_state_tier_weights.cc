// NvmeStateTier's 16-bit weights on NVMe (HostOptimizerOptions::nvme_weight_blocks, offload_param:
// {device: nvme}): checked and allocated at Start, derived into the store at initialisation and
// restore, and read back for the device (FetchWeights). The update side is the tier's own
// (nvme_state_tier.cc: the update writes them into the block's staging slot, the write-back takes
// them to the store with the states).
#include <algorithm>
#include <cstring>
#include <string>

#include "job/arena_layout.h"
#include "storage/format.h"
#include "trainer/pipeline/host_optimizer.h"  // internal::To16
#include "trainer/pipeline/nvme_state_tier.h"

namespace offloadd::trainer {
namespace {

constexpr uint32_t kHalf = static_cast<uint32_t>(storage::TensorKind::kParamHalf);

}  // namespace

Status NvmeStateTier::CheckWeightPlacement(const HostOptimizerOptions& o) {
  const std::vector<bool>& w = o.nvme_weight_blocks;
  bool any = false;
  for (bool b : w) any = any || b;
  if (!any) return OkStatus();
  const std::string what = "the 16-bit weights on NVMe (nvme_weight_blocks)";
  if (w.size() != o.block_elements.size()) {
    return InvalidArgumentError("nvme_weight_blocks names " + std::to_string(w.size()) +
                                " blocks, the model has " +
                                std::to_string(o.block_elements.size()));
  }
  if (o.tier != StateTier::kNvme)
    return InvalidArgumentError(what + " need the optimizer states on NVMe (tier nvme)");
  if (o.compute == HostDtype::kFp32) {
    return InvalidArgumentError(what +
                                " need 16-bit compute (bf16 or fp16): with fp32 compute the device "
                                "reads the fp32 masters");
  }
  if (o.group != nullptr)
    return InvalidArgumentError(what + " are not available with data parallelism");
  for (size_t b = 0; b < w.size(); ++b) {
    if (!w[b]) continue;
    if (!internal::OnNvme(o, b)) {
      return InvalidArgumentError(what + ": block " + std::to_string(b) +
                                  " keeps its optimizer states in RAM; only a block whose states "
                                  "are on NVMe may have its weights there");
    }
    if (b < o.device_blocks.size() && o.device_blocks[b]) {
      return InvalidArgumentError(what + ": block " + std::to_string(b) +
                                  " is updated on the device, whose weights stay there");
    }
  }
  return OkStatus();
}

Status NvmeStateTier::AllocateWeightRegions(uint64_t w) {
  max_weight_elements_ = w;
  if (w == 0) return OkStatus();
  // A bf16 master is its own weights: its slot region's first half is what goes to the store.
  for (size_t s = 0; mode_.master != workers::MasterDtype::kBf16 && s < slots_.size(); ++s) {
    ASSIGN_OR_RETURN(ipc::Region r, arena_->Allocate("slot" + std::to_string(s) + ".weights",
                                                     ipc::RegionKind::kParamStaging, w * 2));
    slots_[s]->offset[3] = r.offset;
  }
  for (int i = 0; i < kArenaWeightBuffers; ++i) {
    ASSIGN_OR_RETURN(ipc::Region r, arena_->Allocate("weights" + std::to_string(i),
                                                     ipc::RegionKind::kParamStaging, w * 2));
    weight_buffers_.push_back(r.offset);
  }
  weight_reads_.assign(kArenaWeightBuffers, WeightRead{});
  return OkStatus();
}

Status NvmeStateTier::Derive16(size_t b, const float* master, const Slot* slot) {
  const uint64_t n = elements(b);
  if (mode_.master == workers::MasterDtype::kBf16) {  // the staged master's first half
    if (!WeightsOnNvme(b)) {
      std::memcpy(arena_->At<void>(compute_copy_[b]), arena_->At<void>(slot->offset[0]), n * 2);
      return OkStatus();
    }
    DropWeightReads(b);
    return StoreIo(true, static_cast<uint32_t>(b), kHalf, slot->offset[0], n * 2, true);
  }
  if (!WeightsOnNvme(b)) {
    const uint64_t weights = (*shards_)[b].weights_offset;
    if (weights != 0) internal::To16(compute_, master, arena_->At<uint16_t>(weights), n);
    return OkStatus();
  }
  internal::To16(compute_, master, arena_->At<uint16_t>(slot->offset[3]), n);
  DropWeightReads(b);
  return StoreIo(true, static_cast<uint32_t>(b), kHalf, slot->offset[3], n * 2, true);
}

void NvmeStateTier::DropWeightReads(size_t block) {
  for (WeightRead& r : weight_reads_) {
    if (r.block == static_cast<int>(block)) r.stale = true;
  }
}

Status NvmeStateTier::ClaimIo(uint64_t id) {
  while (std::find(io_done_.begin(), io_done_.end(), id) == io_done_.end())
    RETURN_IF_ERROR(PumpStore(true));
  io_done_.erase(std::find(io_done_.begin(), io_done_.end(), id));
  return OkStatus();
}

Status NvmeStateTier::IssueWeightRead(int block, int buffer) {
  WeightRead& r = weight_reads_[static_cast<size_t>(buffer)];
  // The buffer's earlier read must land before another may write into it.
  if (r.id != 0) RETURN_IF_ERROR(ClaimIo(r.id));
  r = WeightRead{};
  // The block's last write-back must have reached the store: a read of the latest version would
  // otherwise find the one before it.
  const int s = slot_of_[static_cast<size_t>(block)];
  if (s >= 0) {
    while (!slots_[static_cast<size_t>(s)]->pending_writes.empty())
      RETURN_IF_ERROR(PumpStore(true));
  }
  const uint64_t id = next_io_id_;
  RETURN_IF_ERROR(StoreIo(false, static_cast<uint32_t>(block), kHalf,
                          weight_buffers_[static_cast<size_t>(buffer)],
                          elements(static_cast<size_t>(block)) * 2, false));
  r.block = block;
  r.id = id;
  return OkStatus();
}

Status NvmeStateTier::PrefetchWeights(int block, int buffer) {
  const WeightRead& r = weight_reads_[static_cast<size_t>(buffer)];
  if (r.block == block && r.id != 0 && !r.stale) return OkStatus();  // already on its way
  return IssueWeightRead(block, buffer);
}

StatusOr<const void*> NvmeStateTier::FetchWeights(int block, int buffer) {
  WeightRead& r = weight_reads_[static_cast<size_t>(buffer)];
  if (r.block == block && r.id != 0 && !r.stale) {
    ++weight_prefetch_hits_;
  } else {
    RETURN_IF_ERROR(IssueWeightRead(block, buffer));
  }
  const uint64_t id = r.id;
  r.id = 0;
  r.block = -1;
  RETURN_IF_ERROR(ClaimIo(id));
  return static_cast<const void*>(weight_buffer(buffer));
}

void* NvmeStateTier::weight_buffer(int buffer) const {
  if (buffer < 0 || static_cast<size_t>(buffer) >= weight_buffers_.size()) return nullptr;
  return arena_->At<void>(weight_buffers_[static_cast<size_t>(buffer)]);
}

uint64_t NvmeStateTier::weight_buffer_bytes() const {
  return weight_buffers_.empty() ? 0 : max_weight_elements_ * 2;
}

}  // namespace offloadd::trainer
