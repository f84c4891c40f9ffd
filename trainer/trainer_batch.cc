// The automatic batch size in the trainer (issue #13 item 4; trainer/batch_planner.h): each
// candidate micro-batch is priced by the step planner on inputs of its own (the static memory
// estimate or the cached shape profile at that micro-batch, its GPU work at the GEMM rate measured
// at that size, the node profile's rates), and the fastest in tokens/s is set before anything is
// sized by the batch. Also the pieces PlanDevice shares with it: the initial activation modes, the
// static memory estimate, the GPU budget and the node profile.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <limits>

#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "common/units.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

namespace {

engine::SaveMode ToSaveMode(ActivationMode m) {
  switch (m) {
    case ActivationMode::kRecompute:
    case ActivationMode::kRecomputeOffloadCpu:
      return engine::SaveMode::kRecompute;
    case ActivationMode::kOffloadCpu:
    case ActivationMode::kOffloadNvme:
      return engine::SaveMode::kOffload;
    default:
      return engine::SaveMode::kKeep;
  }
}

void Synchronize(bool cuda) {
#if OFFLOADD_WITH_CUDA
  if (cuda) at::cuda::getCurrentCUDAStream().synchronize();
#else
  (void)cuda;
#endif
}

}  // namespace

Status Trainer::Impl::InitialModes() {
  modes.assign(n, engine::SaveMode::kKeep);
  spill_nvme.assign(n, false);
  offload_checkpoint.assign(n, false);
  for (const auto& [layer, m] : cfg.offload.layer_overrides) {
    if (layer < 0 || layer >= n - 2)
      return InvalidArgumentError("activation override for layer " + std::to_string(layer) +
                                  ": the model has " + std::to_string(n - 2) + " layers");
  }
  for (int b = 1; b + 1 < n; ++b) {
    auto it = cfg.offload.layer_overrides.find(b - 1);
    ActivationMode m = it != cfg.offload.layer_overrides.end() ? it->second : cfg.offload.activations;
    // AUTO: keep in host memory; on the GPU recompute every layer (what gradient checkpointing
    // does in the PyTorch baseline): the static estimates of kept activations proved too
    // optimistic against the CUDA kernels' real footprint, and an out-of-memory error mid-job
    // costs more than the recompute.
    if (m == ActivationMode::kAuto) m = cuda ? ActivationMode::kRecompute : ActivationMode::kKeep;
    modes[b] = ToSaveMode(m);
    spill_nvme[b] = m == ActivationMode::kOffloadNvme;
    offload_checkpoint[b] = m == ActivationMode::kRecomputeOffloadCpu;
  }
  return OkStatus();
}

Trainer::Impl::MemoryEstimate Trainer::Impl::EstimateMemory(int64_t B) const {
  const int64_t T = SeqLength();
  const int64_t elem = c10::elementSize(dtype);
  MemoryEstimate est;
  int64_t max_block = 0, max_keep = 0;
  est.cost.resize(n);
  for (int b = 0; b < n; ++b) {
    est.cost[b] = model->block(b).EstimateCost(B, T, dtype);
    const int64_t wb = static_cast<int64_t>(layout[b].numel) * elem;
    est.weights += wb;
    max_block = std::max(max_block, wb);
    max_keep = std::max(max_keep, est.cost[b].saved_bytes_keep);
  }
  // Transients: a block's backward (recompute + gradients of its activations), its parameter
  // gradients, the head's chunked logits (engine/head_chunk.h), allocator slack.
  est.workspace = 2 * max_keep + 3 * max_block + (int64_t{1280} << 20);
  const bool tied = !model->block(n - 1).shared_params().empty();
  est.streamed = static_cast<int64_t>(WeightResidency::kWindow + 2) * max_block +
                 (tied ? static_cast<int64_t>(layout[0].numel) * elem : 0);
  return est;
}

int64_t Trainer::Impl::DeviceBudget() const {
  return cfg.offload.gpu_memory_limit > 0 ? static_cast<int64_t>(cfg.offload.gpu_memory_limit)
                                           : streams->FreeMemory() * 9 / 10;
}

StatusOr<NodeProfile> Trainer::Impl::PlanNodeProfile() {
  if (node_profile) return *node_profile;
  const HostOptimizerOptions ho = HostOptions();
  bool cached = false;
  std::string cache_problem;
  ASSIGN_OR_RETURN(NodeProfile prof,
                   LoadOrMeasureNodeProfile(cfg.profile_dir,
                                            static_cast<int>(ho.worker_processes * ho.worker_threads),
                                            cfg.adamw_kernel, device,
                                            cfg.offload.nvme_dirs.empty() ? "" : cfg.offload.nvme_dirs[0],
                                            &cached, &cache_problem));
  Log(TrainObserver::Level::kInfo, std::string("node profile (") + (cached ? "cached" : "measured") +
                                       "): " + DescribeNodeProfile(prof));
  if (!cache_problem.empty()) {
    Log(TrainObserver::Level::kWarning, "node profile " + cache_problem + " (--profile-dir " +
                                            cfg.profile_dir + "); it is measured again next run");
  }
  node_profile = prof;
  return prof;
}

double Trainer::Impl::SecondsPerFlop(int64_t micro) {
  // The MLP's up projection at this micro-batch's rows: the GEMMs are most of a decoder layer's
  // work, and their efficiency is what changes with the micro-batch. Capped where the rate has
  // long saturated (and where a CPU device would take seconds).
  const engine::ModelConfig& mc = model->config();
  const int64_t rows = std::min<int64_t>(micro * SeqLength(), cuda ? 16384 : 2048);
  const int64_t h = std::max<int64_t>(1, mc.hidden_size);
  const int64_t f = std::max<int64_t>(1, mc.intermediate_size);
  const auto opts = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor x = at::randn({rows, h}, opts), w = at::randn({h, f}, opts);
  at::Tensor y = at::mm(x, w);  // warm-up: library handles, kernel choice
  Synchronize(cuda);
  constexpr int kReps = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) y = at::mm(x, w);
  Synchronize(cuda);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kReps;
  return secs / (2.0 * static_cast<double>(rows) * static_cast<double>(h) * static_cast<double>(f));
}

StatusOr<BatchCandidate> Trainer::Impl::PriceBatch(int micro, int accumulation, const NodeProfile& prof) {
  BatchCandidate cand;
  cand.micro = micro;
  cand.accumulation = accumulation;
  const double A = accumulation;
  const MemoryEstimate est = EstimateMemory(micro);
  const std::optional<ShapeProfile> profiled = CachedShapeProfile(micro);
  const int64_t elem = c10::elementSize(dtype);
  using Weights = OffloadPlanConfig::Weights;
  const bool auto_states = cfg.offload.device_optimizer_blocks == OffloadPlanConfig::kAutoDeviceOptimizer &&
                           cfg.offload.device_optimizer_share < 0;
  // Where the activations wait, as PlanDevice decides it at this micro-batch.
  std::vector<bool> offloaded = offload_checkpoint;
  int64_t acts = 0, offloaded_bytes = 0;
  for (int b = 0; b < n; ++b) {
    if (modes[b] == engine::SaveMode::kKeep) acts += est.cost[b].saved_bytes_keep;
    if (modes[b] == engine::SaveMode::kRecompute && !offloaded[b]) acts += est.cost[b].saved_bytes_recompute;
    if (offloaded[b]) offloaded_bytes += est.cost[b].saved_bytes_recompute;
  }
  const int64_t workspace = profiled ? profiled->workspace_bytes + kProfiledWorkspaceSlack : est.workspace;
  bool resident = !cuda || cfg.offload.weights == Weights::kResident ||
                  (cfg.offload.weights == Weights::kAuto && !auto_states);
  int64_t held = 0;
  if (cuda) {
    auto fits = [&](int64_t w) { return w + acts + workspace <= gpu_budget; };
    if (resident && !fits(est.weights) && cfg.offload.weights != Weights::kResident) resident = false;
    const int64_t w = resident ? est.weights : est.streamed;
    for (int b = 1; b + 1 < n && !fits(w); ++b) {
      if (cfg.offload.layer_overrides.count(b - 1) || cfg.offload.activations != ActivationMode::kAuto ||
          modes[b] != engine::SaveMode::kRecompute || offloaded[b]) {
        continue;
      }
      offloaded[b] = true;
      acts -= est.cost[b].saved_bytes_recompute;
      offloaded_bytes += est.cost[b].saved_bytes_recompute;
    }
    held = w + acts + workspace;
    if (!fits(w)) {
      cand.why_not = "needs " + FormatByteSize(static_cast<uint64_t>(held)) + " of GPU memory, gpu_memory_limit " +
                     FormatByteSize(static_cast<uint64_t>(gpu_budget));
      return cand;
    }
  } else if (cfg.offload.host_memory_limit > 0 && static_cast<uint64_t>(acts) > cfg.offload.host_memory_limit / 2) {
    cand.why_not = "its activations need " + FormatByteSize(static_cast<uint64_t>(acts)) +
                   ", over half of host_memory_limit " + FormatByteSize(cfg.offload.host_memory_limit);
    return cand;
  }
  cand.feasible = true;

  // GPU work: the cached shape profile's measured times at this micro-batch, else the flops of
  // the blocks' training step at the GEMM rate measured at its size.
  const double spf = profiled ? 0 : SecondsPerFlop(micro);
  const bool may_keep = cuda && cfg.offload.activations == ActivationMode::kAuto && cfg.offload.layer_overrides.empty();
  const std::vector<int64_t> need = DeviceOptimizerNeeds(resident, accumulation);
  PlanInputs in;
  double gpu = 0, fwd = 0;
  for (int b = 0; b < n; ++b) {
    const engine::BlockCost& c = est.cost[b];
    const bool recomputed = modes[b] == engine::SaveMode::kRecompute;
    const double f = profiled ? profiled->blocks[b].forward_s : c.forward_flops * spf;
    const double r = recomputed ? (profiled ? profiled->blocks[b].recompute_s : f) : 0.0;
    fwd += f;
    // The head's cost counts its chunked backward inside its forward flops.
    gpu += profiled ? profiled->blocks[b].forward_s + profiled->blocks[b].backward_s
                    : (b == n - 1 ? f : 3 * f + r);
    in.params.push_back(static_cast<int64_t>(layout[b].numel));
    in.device_state_bytes.push_back(need[b + 1] - need[b]);
    in.keep_extra_bytes.push_back(
        may_keep && recomputed && !offloaded[b]
            ? std::max<int64_t>(1, static_cast<int64_t>(kKeepSafety * static_cast<double>(c.saved_bytes_keep -
                                                                                          c.saved_bytes_recompute)))
            : 0);
    in.recompute_seconds.push_back(A * r);
  }
  const double weight_bytes = static_cast<double>(est.weights);
  const double params = weight_bytes / static_cast<double>(elem);
  in.budget_bytes = cuda ? gpu_budget : 0;
  in.base_peak_bytes = held;
  in.gpu_seconds = A * gpu;
  in.gpu_forward_seconds = A * fwd;
  // Streamed weights cross twice per micro-batch (forward, backward), resident ones once per step
  // (the update); gradients leave per micro-batch; offloaded checkpoints go out and come back.
  if (cuda) {
    in.h2d_bytes = (resident ? weight_bytes : 2 * A * weight_bytes) + A * static_cast<double>(offloaded_bytes);
    in.d2h_bytes = A * 2.0 * params + A * static_cast<double>(offloaded_bytes);
  }
  in.host_bytes_per_s = prof.host_bytes_per_s;
  in.cpu_params_per_s = prof.cpu_params_per_s;
  in.cpu_params_per_s_during_dma = std::min(prof.cpu_params_per_s_during_dma, prof.cpu_params_per_s);
  in.h2d_bytes_per_s = prof.h2d_bytes_per_s > 0 ? prof.h2d_bytes_per_s : 1e30;
  in.d2h_bytes_per_s = prof.d2h_bytes_per_s > 0 ? prof.d2h_bytes_per_s : 1e30;
  in.place_states = cuda && auto_states;
  in.keep_activations = may_keep;
  in.held_updates = cfg.optim.max_grad_norm > 0 || scaler.has_value();
  if (!cuda) in.budget_bytes = std::numeric_limits<int64_t>::max() / 4;
  ASSIGN_OR_RETURN(cand.plan, SolvePlan(in));
  cand.tokens_per_s = CandidateTokensPerSecond(cand, SeqLength());
  return cand;
}

Status Trainer::Impl::ChooseBatchSize() {
  if (!cfg.auto_batch_size) return OkStatus();
  const int cap = cfg.batch_size > 0 ? cfg.batch_size : kDefaultAutoBatchCap;
  if (!cfg.resume_from.empty()) {
    // A resumed run keeps the shape its checkpoint trained with: pricing again (other measured
    // rates, another node) could change the global batch in the middle of a run.
    ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::Open(cfg.resume_from));
    if (const auto& kept = r.state().auto_batch) {
      if (kept->micro > cap || (cfg.global_batch_size > 0 && kept->micro * kept->accumulation != cfg.global_batch_size)) {
        return InvalidArgumentError(
            cfg.resume_from + " trained with micro-batch " + std::to_string(kept->micro) + " x " +
            std::to_string(kept->accumulation) + " (per_device_train_batch_size auto), which this job's " +
            (kept->micro > cap ? "cap of " + std::to_string(cap) : "train_batch_size " + std::to_string(cfg.global_batch_size)) +
            " contradicts");
      }
      cfg.batch_size = static_cast<int>(kept->micro);
      cfg.gradient_accumulation_steps = static_cast<int>(kept->accumulation);
      Log(TrainObserver::Level::kInfo, "batch size (auto): " + std::to_string(kept->micro) + " x " +
                                           std::to_string(kept->accumulation) + ", as " + cfg.resume_from +
                                           " trained (a resumed run keeps its shape)");
      return OkStatus();
    }
    Log(TrainObserver::Level::kWarning, cfg.resume_from + " does not record an automatic batch size (it was "
                                        "written by a run with a fixed one, or by an older build): pricing "
                                        "the candidates again");
  }
  RETURN_IF_ERROR(InitialModes());
  if (cuda) gpu_budget = DeviceBudget();
  ASSIGN_OR_RETURN(const NodeProfile prof, PlanNodeProfile());
  ASSIGN_OR_RETURN(std::vector<BatchCandidate> candidates,
                   BatchCandidates(cap, cfg.global_batch_size, cfg.gradient_accumulation_steps));
  c10::NoGradGuard no_grad;
  std::string over;  // larger micro-batches need more of everything: none above one that does not fit
  for (BatchCandidate& c : candidates) {
    if (!over.empty()) {
      c.why_not = "above " + over;
      continue;
    }
    ASSIGN_OR_RETURN(c, PriceBatch(c.micro, c.accumulation, prof));
    if (!c.feasible) over = std::to_string(c.micro);
  }
  auto chosen = ChooseBatch(candidates);
  if (!chosen.ok()) {
    return ResourceExhaustedError("per_device_train_batch_size auto: " + std::string(chosen.status().message()) +
                                  "; raise gpu_memory_limit or lower max_seq_length");
  }
  const BatchCandidate& c = candidates[*chosen];
  Log(TrainObserver::Level::kInfo,
      "batch size (auto" +
          (cfg.global_batch_size > 0 ? ", train_batch_size " + std::to_string(cfg.global_batch_size)
                                     : ", micro-batch at most " + std::to_string(cap)) +
          "): " + DescribeBatchChoice(candidates, *chosen, SeqLength()) +
          "; the step planner re-prices the placement with measured figures after the first steps");
  cfg.batch_size = c.micro;
  cfg.gradient_accumulation_steps = c.accumulation;
  return OkStatus();
}

}  // namespace offloadd::trainer
