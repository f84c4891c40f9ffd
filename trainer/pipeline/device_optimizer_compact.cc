// DeviceOptimizer in the compact optimizer modes: the workers' regions on the device, stepped by
// the CUDA kernel (the workers' bits) or, on a CPU device, by workers::CompactAdamW itself.
#include <string>
#include <vector>

#include "trainer/pipeline/device_optimizer.h"
// The workers' scalars and stochastic-rounding keys, so the kernel steps with the same floats.
#include "workers/adamw_compact_impl.h"
#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "trainer/pipeline/cuda/compact_adamw.h"
#endif

namespace offloadd::trainer {
namespace {

workers::GradDtype GradDtypeOf(const at::Tensor& g) {
  if (g.scalar_type() == at::kBFloat16) return workers::GradDtype::kBf16;
  if (g.scalar_type() == at::kHalf) return workers::GradDtype::kFp16;
  return workers::GradDtype::kFp32;
}

at::Tensor ToHost(const at::Tensor& region, uint8_t* out) {
  return at::from_blob(out, {region.numel()}, at::TensorOptions().dtype(at::kByte)).copy_(region);
}

void FromHost(const at::Tensor& region, const uint8_t* in) {
  region.copy_(at::from_blob(const_cast<uint8_t*>(in), {region.numel()},
                             at::TensorOptions().dtype(at::kByte)));
}

#if OFFLOADD_WITH_CUDA
compact::Scalars KernelScalars(const workers::AdamWHyper& h, uint64_t seed) {
  const workers::internal::AdamWScalars x = workers::internal::MakeScalars(h);
  compact::Scalars s{};
  s.grad_scale = x.grad_scale;
  s.decay = x.decay;
  s.lerp_coeff = x.lerp_coeff;
  s.beta2 = x.beta2;
  s.one_minus_beta2 = x.one_minus_beta2;
  s.neg_step_size = x.neg_step_size;
  s.bc2_sqrt = x.bc2_sqrt;
  s.eps = x.eps;
  s.key_m = workers::internal::SrKey(seed, h.step, 0);
  s.key_v = workers::internal::SrKey(seed, h.step, 1);
  s.lerp_small = x.lerp_small;
  s.decay_on = x.decay_on;
  return s;
}
#endif

}  // namespace

void DeviceOptimizer::CreateRegions(const Options& options, uint64_t numel, BlockState* s) {
  const auto u8 = at::TensorOptions().dtype(at::kByte).device(options.device);
  const workers::OptimizerMode mode = options.mode;
  const auto n = static_cast<int64_t>(numel);
  s->master_region =
      at::zeros({static_cast<int64_t>(workers::MasterRegionBytes(mode.master, numel))}, u8);
  const auto state_bytes = static_cast<int64_t>(workers::StateRegionBytes(mode.state, numel));
  s->m_region = at::zeros({state_bytes}, u8);
  s->v_region = at::zeros({state_bytes}, u8);
  if (mode.master == workers::MasterDtype::kBf16) {
    s->weights = s->master_region.narrow(0, 0, 2 * n).view(at::kBFloat16);
  } else if (options.dtype == c10::kFloat) {
    s->weights = s->master_region.view(at::kFloat);
  } else {
    s->weights = at::empty({n}, at::TensorOptions().dtype(options.dtype).device(options.device));
  }
}

Status DeviceOptimizer::UpdateCompact(int b, float grad_scale, uint64_t adam_step) {
  BlockState& s = state_[b];
  const at::Tensor& g = StepGradients(b);
  const OptimConfig& o = options_.optim;
  workers::AdamWHyper h;
  h.lr = lr_;
  h.beta1 = o.beta1;
  h.beta2 = o.beta2;
  h.eps = o.eps;
  h.weight_decay = o.weight_decay;
  h.step = adam_step;
  h.grad_scale = grad_scale;
  RETURN_IF_ERROR(workers::ValidateHyper(h));
  const workers::OptimizerMode mode = options_.mode;
  const uint64_t n = (*options_.layout)[b].numel;
  // A 16-bit copy to write: fp32 master with bf16/fp16 compute (else the master is the weights).
  const bool copy = mode.master == workers::MasterDtype::kFp32 && options_.dtype != c10::kFloat;
  const workers::WeightDtype weights = !copy                         ? workers::WeightDtype::kNone
                                       : options_.dtype == at::kHalf ? workers::WeightDtype::kFp16
                                                                     : workers::WeightDtype::kBf16;
  auto* master = static_cast<uint8_t*>(s.master_region.data_ptr());
  auto* m = static_cast<uint8_t*>(s.m_region.data_ptr());
  auto* v = static_cast<uint8_t*>(s.v_region.data_ptr());
  workers::CompactSpan span = workers::CompactSpanAt(mode, master, m, v, n, 0, n);
  span.grad = g.data_ptr();
  span.grad_dtype = GradDtypeOf(g);
  span.weights = copy ? s.weights.data_ptr() : nullptr;
  span.weight_dtype = weights;
  span.seed = static_cast<uint64_t>(b);
  if (options_.device.is_cpu()) {
    return workers::CompactAdamW(span, mode, h, workers::BestPath()).status();
  }
#if OFFLOADD_WITH_CUDA
  RETURN_IF_ERROR(workers::ValidateCompactSpan(span, mode));
  cuda::CompactArgs a;
  a.grad = span.grad;
  a.grad_dtype = span.grad_dtype == workers::GradDtype::kBf16   ? cuda::Grad::kBf16
                 : span.grad_dtype == workers::GradDtype::kFp16 ? cuda::Grad::kFp16
                                                                : cuda::Grad::kFp32;
  a.master = span.master;
  a.master_comp = span.master_comp;
  a.exp_avg = span.exp_avg;
  a.exp_avg_sq = span.exp_avg_sq;
  a.exp_avg_scale = span.exp_avg_scale;
  a.exp_avg_sq_scale = span.exp_avg_sq_scale;
  a.state = mode.state == workers::StateDtype::kInt8   ? cuda::State::kInt8
            : mode.state == workers::StateDtype::kBf16 ? cuda::State::kBf16
                                                       : cuda::State::kFp32;
  a.weights = span.weights;
  a.weight_dtype = weights == workers::WeightDtype::kBf16   ? cuda::Weights::kBf16
                   : weights == workers::WeightDtype::kFp16 ? cuda::Weights::kFp16
                                                            : cuda::Weights::kNone;
  a.n = static_cast<int64_t>(n);
  const cudaError_t e =
      cuda::CompactAdamW(a, KernelScalars(h, span.seed), at::cuda::getCurrentCUDAStream());
  if (e != cudaSuccess) {
    return InternalError("compact AdamW kernel of block " + std::to_string(b) + ": " +
                         cudaGetErrorString(e));
  }
  return OkStatus();
#else
  return UnimplementedError("compact optimizer states on " + options_.device.str() +
                            ": this build has no CUDA kernels");
#endif
}

Status DeviceOptimizer::ReadCompactMaster(int b, float* master, const float* exp_avg,
                                          const float* exp_avg_sq) const {
  if (exp_avg != nullptr || exp_avg_sq != nullptr) {
    return FailedPreconditionError("compact states are read with ReadRegions");
  }
  const BlockState& s = state_[b];
  const uint64_t n = (*options_.layout)[b].numel;
  if (options_.mode.master == workers::MasterDtype::kFp32) {
    at::from_blob(master, {static_cast<int64_t>(n)}, at::TensorOptions().dtype(at::kFloat))
        .copy_(s.master_region.view(at::kFloat));
    return OkStatus();
  }
  std::vector<uint8_t> region(static_cast<size_t>(s.master_region.numel()));
  ToHost(s.master_region, region.data());
  workers::DecodeBf16Master(
      reinterpret_cast<const uint16_t*>(region.data()),
      reinterpret_cast<const uint16_t*>(region.data() + workers::MasterCompOffset(n)), n, master);
  return OkStatus();
}

Status DeviceOptimizer::RestoreCompactMaster(int b, const float* master, const float* exp_avg,
                                             const float* exp_avg_sq) {
  if (exp_avg != nullptr || exp_avg_sq != nullptr) {
    return FailedPreconditionError("compact states are restored with RestoreRegions");
  }
  BlockState& s = state_[b];
  const uint64_t n = (*options_.layout)[b].numel;
  if (options_.mode.master == workers::MasterDtype::kFp32) {
    s.master_region.view(at::kFloat)
        .copy_(at::from_blob(const_cast<float*>(master), {static_cast<int64_t>(n)},
                             at::TensorOptions().dtype(at::kFloat)));
    if (options_.dtype != c10::kFloat) s.weights.copy_(s.master_region.view(at::kFloat));
    return OkStatus();
  }
  std::vector<uint8_t> region(static_cast<size_t>(s.master_region.numel()), 0);
  workers::EncodeBf16Master(
      master, n, reinterpret_cast<uint16_t*>(region.data()),
      reinterpret_cast<uint16_t*>(region.data() + workers::MasterCompOffset(n)));
  FromHost(s.master_region, region.data());
  return OkStatus();
}

Status DeviceOptimizer::ReadRegions(int b, uint8_t* master_region, uint8_t* exp_avg,
                                    uint8_t* exp_avg_sq) const {
  if (!owns(b)) return InternalError("block " + std::to_string(b) + " is not on the device");
  if (options_.mode.Exact()) return FailedPreconditionError("exact states have no regions");
  const BlockState& s = state_[b];
  if (master_region != nullptr) ToHost(s.master_region, master_region);
  if (exp_avg != nullptr) ToHost(s.m_region, exp_avg);
  if (exp_avg_sq != nullptr) ToHost(s.v_region, exp_avg_sq);
  return OkStatus();
}

Status DeviceOptimizer::RestoreRegions(int b, const uint8_t* master_region, const uint8_t* exp_avg,
                                       const uint8_t* exp_avg_sq) {
  if (!owns(b)) return InternalError("block " + std::to_string(b) + " is not on the device");
  if (options_.mode.Exact()) return FailedPreconditionError("exact states have no regions");
  BlockState& s = state_[b];
  if (master_region != nullptr) FromHost(s.master_region, master_region);
  if (exp_avg != nullptr) FromHost(s.m_region, exp_avg);
  if (exp_avg_sq != nullptr) FromHost(s.v_region, exp_avg_sq);
  if (master_region != nullptr && options_.mode.master == workers::MasterDtype::kFp32 &&
      options_.dtype != c10::kFloat) {
    s.weights.copy_(s.master_region.view(at::kFloat));
  }
  return OkStatus();
}

}  // namespace offloadd::trainer
