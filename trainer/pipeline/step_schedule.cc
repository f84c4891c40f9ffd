// StepSchedule: forward, backward and gradient hand-off, block by block.
#include "trainer/pipeline/step_schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "trainer/pipeline/trace.h"

namespace offloadd::trainer {

StepSchedule::StepSchedule(const Options& options)
    : options_(options),
      layout_(*options.layout),
      n_(options.model->num_blocks()),
      cuda_(options.device.is_cuda()),
      host_grads_(n_),
      checkpoint_ticket_(n_, 0),
      device_opt_(options.device_optimizer) {
  options_.offload_checkpoint.resize(n_, false);
  for (int b = 0; b < n_; ++b) {
    for (const auto& slot : layout_[b].params) {
      owner_[slot.compressed ? slot.compressed->name : slot.param->name] = {b, slot.offset};
    }
  }
}

StatusOr<std::unique_ptr<StepSchedule>> StepSchedule::Create(const Options& options) {
  std::unique_ptr<StepSchedule> s(new StepSchedule(options));
  HostOptimizer* host = options.host;
  const auto opts = at::TensorOptions().dtype(options.dtype).device(c10::kCPU);
  for (int b = 0; b < s->n_; ++b) {
    const int64_t numel = static_cast<int64_t>(host->elements(b));  // across hosts: the slice
    s->host_grads_[b] = at::from_blob(host->grad_staging(b), {numel}, opts);
    RETURN_IF_ERROR(options.streams->Pin(host->grad_staging(b), host->grad_staging_bytes(b)));
  }
  if (s->cuda_) {
    s->host_norms_ = at::empty({s->n_}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  }
  return s;
}

void StepSchedule::BeginStep(int64_t step) {
  step_ = step;
  options_.activations->Reset();
  saved_ = std::vector<engine::SavedState>(n_);
  std::fill(checkpoint_ticket_.begin(), checkpoint_ticket_.end(), 0);
}

namespace {

// Data parallel, before the head: the other ranks' router statistics join `s`, so that the
// load-balancing loss and its gradient are the global micro-batch's.
Status JoinGroupRouterStats(DataParallel& dp, engine::MoeRouterStats& s) {
  // The load-balancing loss and its gradient are sums over the statistics' entries (one per
  // sparse layer). This rank's sums, all-reduced, give the group's; the difference, the other
  // ranks' rows, becomes one more entry, so that engine::MoeRouterStats::AuxLoss and AuxProbGrad
  // are the global micro-batch's on every rank (a recompute in backward re-sets the layers' own
  // entries to the same values and leaves it in place). Every rank issues this one all-reduce
  // between its forward and its backward, in the step loop's order.
  at::Tensor c, p;
  int64_t rows = 0;
  for (size_t l = 0; l < s.counts.size(); ++l) {
    if (!s.counts[l].defined()) continue;
    c = c.defined() ? c + s.counts[l] : s.counts[l];
    p = p.defined() ? p + s.prob_sums[l] : s.prob_sums[l];
    rows += s.rows[l];
  }
  if (!c.defined()) return OkStatus();
  // fp64: the counts stay exact integers when summed over the ranks.
  const at::Tensor local = at::cat({c.to(at::kDouble), p.to(at::kDouble)});
  at::Tensor group = local.clone();
  RETURN_IF_ERROR(dp.AllReduceSum(group));
  const at::Tensor rest = group - local;
  s.counts.push_back(rest.narrow(0, 0, s.num_experts).to(at::kFloat));
  s.prob_sums.push_back(rest.narrow(0, s.num_experts, s.num_experts).to(at::kFloat));
  // Every rank holds the same number of rows of the global micro-batch, of the same length.
  s.rows.push_back(rows * (dp.world() - 1));
  return OkStatus();
}

}  // namespace

StatusOr<at::Tensor> StepSchedule::Forward(engine::MicroBatch& mb, uint32_t micro) {
  WeightResidency& weights = *options_.weights;
  // The first forward of step k uses each block as updated by step k-1: no stale weights.
  const uint64_t wait = micro == 0 ? static_cast<uint64_t>(step_ - 1) : 0;
  double* stall = &options_.accounting->stalls().weights;
  at::Tensor x;
  for (int b = 0; b < n_; ++b) {
    RETURN_IF_ERROR(weights.Ensure(b, wait, stall));
    for (int p = 1; p <= WeightResidency::kWindow; ++p) weights.Prefetch(b + p, wait);
    if (b == n_ - 1 && options_.scaler) {
      // The head computes its gradients in the forward, so the loss scale must be final: step
      // k-1's overflow check is done (its updates are: this forward waited for each of them).
      if (micro == 0) RETURN_IF_ERROR(options_.accounting->ReportPrevious());
      mb.loss_scale = options_.scaler->scale();
    }
    if (b == n_ - 1 && options_.dp && mb.moe && mb.moe->aux_coef > 0) {
      RETURN_IF_ERROR(JoinGroupRouterStats(*options_.dp, *mb.moe));
    }
    engine::Block& block = options_.model->block(b);
    options_.streams->BeginCompute("forward " + block.name());
    ASSIGN_OR_RETURN(
        x, block.Forward(mb, x, options_.modes[b], &saved_[b], options_.activations->callbacks()));
    options_.streams->EndCompute();
    if (options_.offload_checkpoint[b] && options_.modes[b] == engine::SaveMode::kRecompute) {
      // The checkpoint leaves the device until this block's backward (device-to-host after the
      // compute stream's work so far; the device copy is freed once the copy has read it).
      ASSIGN_OR_RETURN(checkpoint_ticket_[b], options_.activations->callbacks()->offload(
                                                  b, std::move(saved_[b].tensors())));
      saved_[b].tensors().clear();
    }
    // The last blocks stay for the backward, which starts with them.
    if (b < n_ - 1 - WeightResidency::kWindow) weights.Release(b);
  }
  return x.detach();
}

Status StepSchedule::Backward(const engine::MicroBatch& mb, uint32_t micro) {
  WeightResidency& weights = *options_.weights;
  const bool last_micro = micro + 1 == options_.accumulation_steps;
  at::Tensor g, tied_grad;
  for (int b = n_ - 1; b >= 0; --b) {
    RETURN_IF_ERROR(weights.Ensure(b, 0, &options_.accounting->stalls().weights));
    for (int p = 1; p <= WeightResidency::kWindow; ++p) weights.Prefetch(b - p, 0);
    if (b > 0) options_.activations->Prefetch(b - 1);
    ASSIGN_OR_RETURN(at::Tensor grads, GradientBuffer(b));
    ASSIGN_OR_RETURN(g, BackwardBlock(mb, b, g, grads, &tied_grad));
    RETURN_IF_ERROR(HandOff(b, micro, grads));
    // The first blocks stay for the next micro-batch's forward, which starts with them.
    if (b > WeightResidency::kWindow || last_micro) weights.Release(b);
  }
  return OkStatus();
}

StatusOr<at::Tensor> StepSchedule::EvalLoss(engine::MicroBatch& mb) {
  WeightResidency& weights = *options_.weights;
  double stall = 0;  // between steps: not a training step's stall
  at::Tensor x;
  for (int b = 0; b < n_; ++b) {
    RETURN_IF_ERROR(weights.Ensure(b, 0, &stall));
    for (int p = 1; p <= WeightResidency::kWindow; ++p) weights.Prefetch(b + p, 0);
    engine::Block& block = options_.model->block(b);
    engine::SavedState saved;  // dropped: no backward follows
    options_.streams->BeginCompute("eval " + block.name());
    ASSIGN_OR_RETURN(x, block.Forward(mb, x, engine::SaveMode::kRecompute, &saved,
                                      options_.activations->callbacks()));
    options_.streams->EndCompute();
    if (b < n_ - 1 - WeightResidency::kWindow) weights.Release(b);
  }
  for (int b = std::max(0, n_ - 1 - WeightResidency::kWindow); b < n_; ++b) weights.Release(b);
  return x.detach();
}

Status StepSchedule::ProbeGradients(engine::MicroBatch& mb, const ProbeSink& sink) {
  std::set<std::string> wanted;
  for (const auto& bl : layout_) {
    for (const auto& slot : bl.params) {
      if (slot.compressed) wanted.insert(slot.compressed->name);
    }
  }
  const engine::SaveMode mode = cuda_ ? engine::SaveMode::kRecompute : engine::SaveMode::kKeep;
  WeightResidency& weights = *options_.weights;
  std::vector<engine::SavedState> saved(n_);
  double stall = 0;
  at::Tensor x;
  for (int b = 0; b < n_; ++b) {
    RETURN_IF_ERROR(weights.Ensure(b, 0, &stall));
    ASSIGN_OR_RETURN(x, options_.model->block(b).Forward(mb, x, mode, &saved[b], options_.activations->callbacks()));
    if (cuda_) weights.Release(b);
  }
  std::map<std::string, at::Tensor> grads;
  engine::GradCallback collect = [&](const std::string& name, const at::Tensor& grad) {
    if (wanted.count(name)) grads[name] = grad.to(at::kFloat);
  };
  at::Tensor g;
  for (int b = n_ - 1; b >= 0; --b) {
    RETURN_IF_ERROR(weights.Ensure(b, 0, &stall));
    ASSIGN_OR_RETURN(g, options_.model->block(b).Backward(mb, g, &saved[b], collect,
                                                           options_.activations->callbacks()));
    saved[b] = engine::SavedState();
    if (cuda_) weights.Release(b);
    if (!grads.empty()) RETURN_IF_ERROR(sink(std::move(grads)));
    grads.clear();
  }
  return OkStatus();
}

StatusOr<at::Tensor> StepSchedule::GradientBuffer(int b) {
  if (OnDevice(b)) return device_opt_->GradientBuffer(b);
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(options_.host->WaitStagingFree(b));
  options_.accounting->stalls().grads +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (options_.dp != nullptr) {  // a private buffer, zero past the block, for the reduce-scatter
    const int64_t numel = static_cast<int64_t>(layout_[b].numel);
    const int64_t padded = options_.dp->Padded(numel);
    at::Tensor full = at::empty({padded}, at::TensorOptions().dtype(options_.dtype).device(options_.device));
    if (padded > numel) full.narrow(0, numel, padded - numel).zero_();
    if (padded_.empty()) padded_.resize(static_cast<size_t>(n_));
    padded_[b] = full;
    return full.narrow(0, 0, numel);
  }
  if (!cuda_) return host_grads_[b];
  return at::empty({static_cast<int64_t>(layout_[b].numel)},
                   at::TensorOptions().dtype(options_.dtype).device(options_.device));
}

StatusOr<at::Tensor> StepSchedule::BackwardBlock(const engine::MicroBatch& mb, int b,
                                                 const at::Tensor& grad_out,
                                                 const at::Tensor& grads, at::Tensor* tied_grad) {
  Status grad_status;
  engine::GradCallback on_grad = [&](const std::string& name, const at::Tensor& grad) {
    auto it = owner_.find(name);
    if (it == owner_.end()) {
      grad_status = InternalError("gradient for unknown parameter " + name);
      return;
    }
    if (it->second.first != b) {  // the tied embedding, used by the head
      *tied_grad = tied_grad->defined() ? *tied_grad + grad : grad;
      return;
    }
    for (const auto& slot : layout_[b].params) {
      if (slot.offset != it->second.second) continue;
      if (!slot.compressed) {
        slot.View(grads).copy_(grad);
        continue;
      }
      // LSP: P^T G Q, inline in this block's backward; GPU-timed on its own track.
      options_.streams->BeginInner("lsp compress", "compress " + slot.compressed->name);
      slot.View(grads).copy_(options_.compress(slot, grad));
      options_.streams->EndInner();
    }
  };
  engine::Block& block = options_.model->block(b);
  if (checkpoint_ticket_[b] != 0) {
    ASSIGN_OR_RETURN(saved_[b].tensors(),
                     options_.activations->callbacks()->fetch(b, checkpoint_ticket_[b]));
    checkpoint_ticket_[b] = 0;
  }
  options_.streams->BeginCompute("backward " + block.name());
  ASSIGN_OR_RETURN(at::Tensor g, block.Backward(mb, grad_out, &saved_[b], on_grad,
                                                options_.activations->callbacks()));
  RETURN_IF_ERROR(grad_status);
  if (b == 0 && tied_grad->defined()) {
    const std::string& tied_name = options_.model->block(n_ - 1).shared_params()[0]->name;
    for (const auto& slot : layout_[0].params) {
      if (slot.param->name == tied_name) slot.View(grads).add_(*tied_grad);
    }
    *tied_grad = at::Tensor();
  }
  options_.streams->EndCompute();
  return g;
}

std::function<double()> StepSchedule::LandedSquaredNorm(int b) const {
  const float* landed = host_norms_.data_ptr<float>() + b;
  return [landed]() {
    const double n = *landed;
    return n * n;
  };
}

Status StepSchedule::GradsReadyAfter(int b, uint32_t micro, DeviceStreams::EventPtr e,
                                     std::vector<at::Tensor> keep,
                                     std::function<double()> sq_norm) {
  // The optimizer thread waits for the copy, dispatching updates while it is not done; the
  // capture keeps the device buffers alive until then.
  return options_.host->GradsReady(
      b, micro, [e, keep = std::move(keep)]() { return DeviceStreams::Synchronize(e); },
      [e]() {
        try {
          return DeviceStreams::Completed(e);
        } catch (const c10::Error&) {
          return true;  // Synchronize reports the error
        }
      },
      std::move(sq_norm));
}

Status StepSchedule::LandOnDevice(int b, uint32_t micro) {
  DeviceOptimizer& device = *device_opt_;
  if (options_.dp != nullptr) {  // every rank's replica is updated with the group's sum
    at::Tensor g = device.GradientBuffer(b);
    RETURN_IF_ERROR(options_.dp->AllReduceSum(g));
  }
  at::Tensor norm = device.Land(b, micro);
  if (!norm.defined()) return options_.host->GradsReady(b, micro, nullptr);  // more to come
  if (!cuda_) {
    const double n = norm.item<float>();
    if (!device.held()) RETURN_IF_ERROR(device.UpdateNow(b));
    return options_.host->GradsReady(b, micro, nullptr, nullptr, [sq = n * n]() { return sq; });
  }
  at::Tensor slot = host_norms_.narrow(0, b, 1);
  auto e = options_.streams->CopyToHost(slot, norm, "gradient norm " + options_.model->block(b).name());
  if (!device.held()) {  // behind the norm: it may scale the gradients in place
    options_.streams->BeginCompute("device update " + options_.model->block(b).name());
    const Status updated = device.UpdateNow(b);
    options_.streams->EndCompute();
    RETURN_IF_ERROR(updated);
  }
  return GradsReadyAfter(b, micro, std::move(e), {norm}, LandedSquaredNorm(b));
}

Status StepSchedule::HandOffShard(int b, uint32_t micro) {
  DataParallel& dp = *options_.dp;
  at::Tensor full = std::move(padded_[b]);
  const int64_t chunk = full.numel() / dp.world();
  at::Tensor shard = at::empty({chunk}, full.options());
  RETURN_IF_ERROR(dp.ReduceScatter(full, shard));
  const int64_t numel = static_cast<int64_t>(layout_[b].numel);
  const int64_t offset = std::min<int64_t>(numel, dp.rank() * chunk);
  const int64_t len = std::min<int64_t>(chunk, numel - offset);
  if (len == 0) {  // a block smaller than the group: this rank's shard is all padding
    return options_.host->GradsReady(b, micro, nullptr, nullptr, []() { return 0.0; });
  }
  const int per_host = options_.ranks_per_host > 0 ? options_.ranks_per_host : dp.world();
  const int64_t host_begin = std::min<int64_t>(numel, dp.rank() / per_host * per_host * chunk);
  at::Tensor dst = host_grads_[b].narrow(0, offset - host_begin, len);
  at::Tensor src = shard.narrow(0, 0, len);
  if (!cuda_) {  // rank 0's driver measures the norm over the whole staging buffer, as without dp
    dst.copy_(src);
    return options_.host->GradsReady(b, micro, nullptr);
  }
  const std::string name = options_.model->block(b).name();
  at::Tensor norm;
  std::function<double()> sq_norm;
  if (options_.accumulation_steps == 1) {  // this shard's part of ||g||^2; rank 0 sums the parts
    norm = at::linalg_vector_norm(src, 2.0, std::nullopt, false, at::kFloat).view({1});
    at::Tensor slot = host_norms_.narrow(0, b, 1);
    options_.streams->CopyToHost(slot, norm, "gradient norm " + name);
    sq_norm = LandedSquaredNorm(b);
  }
  auto e = options_.streams->CopyToHost(dst, src, "gradient shard " + name);
  return GradsReadyAfter(b, micro, std::move(e), {full, shard, norm}, std::move(sq_norm));
}

Status StepSchedule::HandOff(int b, uint32_t micro, const at::Tensor& grads) {
  if (OnDevice(b)) return LandOnDevice(b, micro);
  if (options_.dp != nullptr) return HandOffShard(b, micro);
  if (!cuda_) return options_.host->GradsReady(b, micro, nullptr);
  const std::string name = options_.model->block(b).name();
  // Without accumulation the block's ||g|| is measured here, on the device, beside the copy (one
  // more read of the gradients in device memory, none in host memory): the clipping decision
  // then waits for no CPU pass, and none for the speculative updates (StepDriver::GradsReady).
  // Copied first on the same stream, it has landed when the gradients have.
  at::Tensor norm;
  std::function<double()> sq_norm;
  if (options_.accumulation_steps == 1) {
    norm = at::linalg_vector_norm(grads, 2.0, std::nullopt, false, at::kFloat).view({1});
    at::Tensor slot = host_norms_.narrow(0, b, 1);
    options_.streams->CopyToHost(slot, norm, "gradient norm " + name);
    sq_norm = LandedSquaredNorm(b);
  }
  auto e = options_.streams->CopyToHost(host_grads_[b], grads, "gradients " + name);
  return GradsReadyAfter(b, micro, std::move(e), {grads, norm}, std::move(sq_norm));
}

}  // namespace offloadd::trainer
