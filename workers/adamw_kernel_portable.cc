// Portable path: plain C++ (compiled with -ffp-contract=off so the compiler cannot fuse
// multiplies and adds that PyTorch rounds separately).
#include "workers/adamw_kernel_impl.h"

namespace offloadd::workers::internal::portable {

double FusedAdamW(const AdamWSpan& span, const AdamWScalars& s) {
  const AdamWOut out(span);
  double sq = 0;
  for (size_t i = 0; i < span.n; ++i) {
    const float g = LoadGrad(span.grad, span.grad_dtype, i);
    sq += AdamWElement(g, span.master[i], span.exp_avg[i], span.exp_avg_sq[i], &out.master[i],
                       &out.exp_avg[i], &out.exp_avg_sq[i], s);
    StoreWeight(span.weights, span.weight_dtype, i, out.master[i]);
  }
  return sq;
}

double AccumulateGrad(float* acc, const float* acc_in, const void* grad, GradDtype dtype, size_t n,
                      bool overwrite) {
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const float g = LoadGrad(grad, dtype, i);
    acc[i] = overwrite ? g : acc_in[i] + g;
    sq += static_cast<double>(g * g);
  }
  return sq;
}

double GradSquaredNorm(const void* grad, GradDtype dtype, size_t n) {
  double sq = 0;
  for (size_t i = 0; i < n; ++i) {
    const float g = LoadGrad(grad, dtype, i);
    sq += static_cast<double>(g * g);
  }
  return sq;
}

}  // namespace offloadd::workers::internal::portable
