// The mixture-of-experts side of the trainer's pricing (job/moe_pricing.h has the torch-free
// figures): which blocks are sparse, their experts' flops, and the rate of the experts' GEMMs at
// their own shape, which the batch planner and --validate-only price the experts' flops at when no
// shape profile or block timing gives the GPU's work.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "trainer/trainer_impl.h"

namespace offloadd::trainer {
bool Trainer::Impl::SparseBlock(int b) const {
  return b >= 1 && b + 1 < n && model->config().layer_sparse(b - 1);
}

double Trainer::Impl::LayerExpertFlops(int b, int64_t micro, int64_t seq) const {
  if (!SparseBlock(b)) return 0;
  const engine::ModelConfig& mc = model->config();
  // engine::MoePart::Flops less the router: top_k experts' three projections per token.
  return 2.0 * static_cast<double>(micro) * static_cast<double>(seq) *
         static_cast<double>(mc.moe.top_k) * 3.0 * static_cast<double>(mc.hidden_size) *
         static_cast<double>(mc.moe.intermediate_size);
}

double Trainer::Impl::ExpertSecondsPerFlop(int64_t micro, int64_t seq) {
  const engine::ModelConfig& mc = model->config();
  if (mc.moe.num_experts <= 0) return 0;
  const std::pair<int64_t, int64_t> key{micro, seq};
  if (auto it = planner.expert_seconds_per_flop.find(key);
      it != planner.expert_seconds_per_flop.end()) {
    return it->second;
  }
  const MoeStepFigures m = PriceMoeStep(mc, micro, seq, 0, 0, 0);
  const int64_t rows = std::max<int64_t>(1, std::llround(m.expert_rows));
  const int64_t h = std::max<int64_t>(1, mc.hidden_size);
  const int64_t f = std::max<int64_t>(1, mc.moe.intermediate_size);
  const int64_t experts = std::clamp<int64_t>(m.routed_experts, 1, 16);
  const auto opts = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor x = at::randn({rows, h}, opts);
  std::vector<at::Tensor> w;
  for (int64_t e = 0; e < experts; ++e) w.push_back(at::randn({h, f}, opts));
  at::Tensor y = at::mm(x, w[0]);  // warm-up
  Synchronize(cuda);
  constexpr int kReps = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) {
    for (const at::Tensor& we : w) y = at::mm(x, we);
  }
  Synchronize(cuda);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = kReps * static_cast<double>(experts) * 2.0 * static_cast<double>(rows) *
                       static_cast<double>(h) * static_cast<double>(f);
  return planner.expert_seconds_per_flop[key] = secs / flops;
}

}  // namespace offloadd::trainer
