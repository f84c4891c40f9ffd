// DeviceOptimizer: fp32 AdamW states of the device-resident blocks, updated by ATen's fused AdamW.
#include "trainer/pipeline/device_optimizer.h"

#include <ATen/ops/_fused_adamw.h>

#include <algorithm>
#include <string>

namespace offloadd::trainer {
namespace {

// The fp32 gradients of one update call are made this many elements at a time (128 MiB).
constexpr int64_t kChunk = int64_t{1} << 25;

}  // namespace

int64_t DeviceOptimizer::BlockBytes(uint64_t numel, c10::ScalarType dtype,
                                    uint32_t accumulation_steps, workers::OptimizerMode mode) {
  const auto n = static_cast<int64_t>(numel);
  const int64_t elem = c10::elementSize(dtype);
  // fp32 computes with the fp32 master, bf16 with a bf16 master (the first half of its region).
  const bool master_is_weights = dtype == c10::kFloat || mode.master == workers::MasterDtype::kBf16;
  const int64_t weights = master_is_weights ? 0 : n * elem;
  const int64_t accum = accumulation_steps > 1 ? n * 4 : 0;
  const auto states = static_cast<int64_t>(workers::MasterRegionBytes(mode.master, numel) +
                                           2 * workers::StateRegionBytes(mode.state, numel));
  return states + weights + n * elem + accum;
}

int64_t DeviceOptimizer::UpdateWorkspaceBytes() { return kChunk * 4; }

StatusOr<std::unique_ptr<DeviceOptimizer>> DeviceOptimizer::Create(const Options& options) {
  if (options.layout == nullptr) return InvalidArgumentError("DeviceOptimizer: no block layout");
  const auto& layout = *options.layout;
  if (options.blocks.size() != layout.size()) {
    return InvalidArgumentError("DeviceOptimizer: " + std::to_string(options.blocks.size()) +
                                " placements for " + std::to_string(layout.size()) + " blocks");
  }
  if (options.mode.master == workers::MasterDtype::kBf16 && options.dtype != c10::kBFloat16) {
    return InvalidArgumentError(
        "DeviceOptimizer: a bf16 master is the block's bf16 weights, but "
        "the compute dtype is " +
        std::string(c10::toString(options.dtype)));
  }
  std::unique_ptr<DeviceOptimizer> d(new DeviceOptimizer(options));
  d->state_.resize(layout.size());
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(options.device);
  const auto compute = at::TensorOptions().dtype(options.dtype).device(options.device);
  for (size_t b = 0; b < layout.size(); ++b) {
    if (!options.blocks[b]) continue;
    const auto n = static_cast<int64_t>(layout[b].numel);
    BlockState& s = d->state_[b];
    ++d->count_;
    d->params_ += layout[b].numel;
    s.grads = at::empty({n}, compute);
    if (options.accumulation_steps > 1) s.accum = at::empty({n}, f32);
    if (!options.mode.Exact()) {
      CreateRegions(options, layout[b].numel, &s);
      continue;
    }
    s.master = at::zeros({n}, f32);
    s.exp_avg = at::zeros({n}, f32);
    s.exp_avg_sq = at::zeros({n}, f32);
    s.weights = options.dtype == c10::kFloat ? s.master : at::empty({n}, compute);
    s.step = at::zeros({}, f32);  // the fused kernel reads the bias-correction step from here
  }
  return d;
}

at::Tensor DeviceOptimizer::Land(int b, uint32_t micro) {
  BlockState& s = state_[b];
  const uint32_t A = std::max<uint32_t>(1, options_.accumulation_steps);
  if (A > 1) {
    // The CPU workers' accumulation: fp32 sums of the compute-dtype gradients, the first
    // micro-batch overwriting.
    if (micro == 0) {
      s.accum.copy_(s.grads);
    } else {
      s.accum.add_(s.grads.to(at::kFloat));
    }
  }
  if (micro + 1 < A) return at::Tensor();
  return at::linalg_vector_norm(StepGradients(b), 2.0, std::nullopt, false, at::kFloat).view({1});
}

void DeviceOptimizer::BeginStep(double lr, uint64_t adam_step, float grad_scale) {
  lr_ = lr;
  adam_step_ = adam_step;
  grad_scale_ = grad_scale;
}

Status DeviceOptimizer::Update(int b, float grad_scale, uint64_t adam_step) {
  if (!options_.mode.Exact()) return UpdateCompact(b, grad_scale, adam_step);
  BlockState& s = state_[b];
  const at::Tensor& g_step = StepGradients(b);
  const int64_t n = s.master.numel();
  s.step.fill_(static_cast<double>(adam_step));
  const OptimConfig& o = options_.optim;
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t len = std::min(kChunk, n - at);
    // g = grad * grad_scale in fp32, as the workers compute it (and as clip_grad_norm_ leaves
    // the gradients before AdamW); an fp32 buffer is scaled in place (its last use).
    at::Tensor g = g_step.narrow(0, at, len);
    g = g.scalar_type() == at::kFloat ? g : g.to(at::kFloat);
    if (grad_scale != 1.0f) g.mul_(grad_scale);
    at::_fused_adamw_({s.master.narrow(0, at, len)}, {g}, {s.exp_avg.narrow(0, at, len)},
                      {s.exp_avg_sq.narrow(0, at, len)}, {}, {s.step}, lr_, o.beta1, o.beta2,
                      o.weight_decay, o.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  if (options_.dtype != c10::kFloat) s.weights.copy_(s.master);
  return OkStatus();
}

Status DeviceOptimizer::ReadStates(int b, float* master, float* exp_avg, float* exp_avg_sq) const {
  if (!owns(b)) return InternalError("block " + std::to_string(b) + " is not on the device");
  if (!options_.mode.Exact()) return ReadCompactMaster(b, master, exp_avg, exp_avg_sq);
  const BlockState& s = state_[b];
  const int64_t n = s.master.numel();
  const auto cpu = at::TensorOptions().dtype(at::kFloat);
  at::from_blob(master, {n}, cpu).copy_(s.master);
  at::from_blob(exp_avg, {n}, cpu).copy_(s.exp_avg);
  at::from_blob(exp_avg_sq, {n}, cpu).copy_(s.exp_avg_sq);
  return OkStatus();
}

Status DeviceOptimizer::RestoreStates(int b, const float* master, const float* exp_avg,
                                      const float* exp_avg_sq) {
  if (!owns(b)) return InternalError("block " + std::to_string(b) + " is not on the device");
  if (!options_.mode.Exact()) return RestoreCompactMaster(b, master, exp_avg, exp_avg_sq);
  BlockState& s = state_[b];
  const int64_t n = s.master.numel();
  const auto cpu = at::TensorOptions().dtype(at::kFloat);
  s.master.copy_(at::from_blob(const_cast<float*>(master), {n}, cpu));
  s.exp_avg.copy_(at::from_blob(const_cast<float*>(exp_avg), {n}, cpu));
  s.exp_avg_sq.copy_(at::from_blob(const_cast<float*>(exp_avg_sq), {n}, cpu));
  if (options_.dtype != c10::kFloat) s.weights.copy_(s.master);
  return OkStatus();
}

}  // namespace offloadd::trainer
