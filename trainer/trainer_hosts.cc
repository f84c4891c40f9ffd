// Trainer across hosts (docs/data_parallel.md, "Across hosts"): ZeRO-1 with one rank per host.
// The per-block reduce-scatter already leaves rank r with shard r of the group's gradient sum;
// here rank r's own host optimizer holds the fp32 masters and AdamW states of exactly that slice,
// so no arena is shared between hosts. The clipping decision sums every host's squared norms
// (DataParallel::SumAcrossHosts, from the optimizer thread), and after each step the updated
// slices are all-gathered into every rank's whole weights, which its compute reads.
#include <algorithm>
#include <cstring>

#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

int64_t Trainer::Impl::SliceBegin(int b) const {
  const int64_t numel = static_cast<int64_t>(layout[b].numel);
  const int64_t chunk = dp->Padded(numel) / dp->world();
  return std::min<int64_t>(numel, dp->rank() * chunk);
}

int64_t Trainer::Impl::SliceLength(int b) const {
  const int64_t numel = static_cast<int64_t>(layout[b].numel);
  const int64_t chunk = dp->Padded(numel) / dp->world();
  return std::min<int64_t>(chunk, numel - SliceBegin(b));
}

Status Trainer::Impl::CheckAcrossHosts(const std::string& what) {
  const ParallelConfig& p = cfg.parallel;
  if (p.hosts < 1)
    return InvalidArgumentError("parallel.hosts must be >= 1, got " + std::to_string(p.hosts));
  if (p.hosts == 1) return OkStatus();
  const std::string across = what + " across " + std::to_string(p.hosts) + " hosts";
  if (p.hosts != p.world_size) {
    return UnimplementedError(
        across + ": parallel.hosts " + std::to_string(p.hosts) + " with world_size " +
        std::to_string(p.world_size) +
        " is not built; across hosts each host runs one rank (LOCAL_WORLD_SIZE=1)");
  }
  if (cfg.offload.device_optimizer_blocks > 0 || cfg.offload.device_optimizer_share >= 0) {
    return UnimplementedError(across +
                              " with optimizer states on the GPU (device_optimizer_blocks " +
                              std::to_string(cfg.offload.device_optimizer_blocks) +
                              ") is not built yet; leave it auto (none across hosts) or 0");
  }
  cfg.offload.device_optimizer_blocks = 0;  // auto places none: every state is partitioned
  if (cfg.offload.tier == StateTier::kNvme) {
    return UnimplementedError(across + " with offload_optimizer device nvme is not built yet");
  }
  if (cfg.save_steps > 0) {
    return UnimplementedError(
        across + " with save_steps " + std::to_string(cfg.save_steps) +
        " is not built yet: checkpoints per partition are not written; the final "
        "model is exported");
  }
  if (!cfg.resume_from.empty()) {
    return UnimplementedError(across + ": resume_from " + cfg.resume_from +
                              " is not built yet (checkpoints per partition)");
  }
  return OkStatus();
}

HostOptimizerOptions Trainer::Impl::SliceOptions(HostOptimizerOptions ho) {
  for (int b = 0; b < n; ++b) ho.block_elements[b] = static_cast<uint64_t>(SliceLength(b));
  ho.combine_sq_norm = [d = dp.get()](double local_sq) { return d->SumAcrossHosts(local_sq); };
  return ho;
}

Status Trainer::Impl::InitializeAcrossHosts(
    const std::vector<HostOptimizer::InitPiece>& pieces,
    const std::function<Status(const HostOptimizer::InitPiece&, float*)>& fill) {
  const c10::ScalarType host_dtype = host->weights_fp32() ? at::kFloat : dtype;
  full_weights.assign(static_cast<size_t>(n), at::Tensor());
  return host->Initialize([&](int b, float* master) -> Status {
    at::Tensor whole = at::empty({static_cast<int64_t>(layout[b].numel)}, at::kFloat);
    for (const HostOptimizer::InitPiece& piece : pieces) {
      if (piece.block == b) RETURN_IF_ERROR(fill(piece, whole.data_ptr<float>() + piece.begin));
    }
    std::memcpy(master, whole.data_ptr<float>() + SliceBegin(b),
                static_cast<size_t>(SliceLength(b)) * sizeof(float));
    // Rounded as the host optimizer rounds its 16-bit copy (round to nearest even).
    full_weights[b] = whole.to(host_dtype).contiguous();
    return OkStatus();
  });
}

Status Trainer::Impl::GatherWeights(int64_t k) {
  ASSIGN_OR_RETURN(workers::StepResult r, host->WaitFinished(static_cast<uint64_t>(k)));
  (void)r;  // a skipped step gathers the unchanged slices
  const c10::ScalarType host_dtype = host->weights_fp32() ? at::kFloat : dtype;
  // NCCL gathers device tensors; Gloo, CPU ones.
  const auto opts = at::TensorOptions().dtype(host_dtype).device(device);
  for (int b = 0; b < n; ++b) {
    const int64_t numel = static_cast<int64_t>(layout[b].numel);
    const int64_t padded = dp->Padded(numel);
    const int64_t len = SliceLength(b);
    at::Tensor shard = at::zeros({padded / dp->world()}, opts);
    if (len > 0) {
      shard.narrow(0, 0, len).copy_(
          at::from_blob(host->compute_weights(b), {len}, at::TensorOptions().dtype(host_dtype)));
    }
    at::Tensor all = at::empty({padded}, opts);
    RETURN_IF_ERROR(dp->AllGather(shard, all));
    full_weights[b].copy_(all.narrow(0, 0, numel));
    weights->OnUpdated(b);
  }
  return OkStatus();
}

StatusOr<std::vector<at::Tensor>> Trainer::Impl::GatherMasters() {
  std::vector<at::Tensor> out(static_cast<size_t>(n));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  for (int b = 0; b < n; ++b) {
    const int64_t numel = static_cast<int64_t>(layout[b].numel);
    const int64_t padded = dp->Padded(numel);
    const int64_t len = SliceLength(b);
    at::Tensor mine = at::zeros({padded / dp->world()}, at::kFloat);
    if (len > 0) RETURN_IF_ERROR(host->ReadStates(b, mine.data_ptr<float>(), nullptr, nullptr));
    at::Tensor shard = mine.to(device);
    at::Tensor all = at::empty({padded}, opts);
    RETURN_IF_ERROR(dp->AllGather(shard, all));
    out[b] = all.narrow(0, 0, numel).to(at::kCPU).contiguous();
  }
  return out;
}

}  // namespace offloadd::trainer
