// Portable path: plain C++ (compiled with -ffp-contract=off so the compiler cannot fuse
// multiplies and adds that PyTorch rounds separately; the explicit std::fma calls mirror the
// vector paths' FMAs, so this path computes the same bits as they do).
#include "workers/adamw_kernel_impl.h"

namespace offloadd::workers::internal::portable {

double FusedAdamW(const AdamWSpan& span, const AdamWScalars& s) {
  const AdamWOut out(span);
  NormLanes sq;
  for (size_t i = 0; i < span.n; ++i) {
    const float g = LoadGrad(span.grad, span.grad_dtype, i);
    sq.Add(i, g);
    AdamWElement(g, span.master[i], span.exp_avg[i], span.exp_avg_sq[i], &out.master[i],
                 &out.exp_avg[i], &out.exp_avg_sq[i], s);
    StoreWeight(span.weights, span.weight_dtype, i, out.master[i]);
  }
  return sq.Sum();
}

double AccumulateGrad(float* acc, const float* acc_in, const void* grad, GradDtype dtype, size_t n,
                      bool overwrite) {
  NormLanes sq;
  for (size_t i = 0; i < n; ++i) {
    const float g = LoadGrad(grad, dtype, i);
    acc[i] = overwrite ? g : acc_in[i] + g;
    sq.Add(i, g);
  }
  return sq.Sum();
}

double GradSquaredNorm(const void* grad, GradDtype dtype, size_t n) {
  NormLanes sq;
  for (size_t i = 0; i < n; ++i) sq.Add(i, LoadGrad(grad, dtype, i));
  return sq.Sum();
}

double CorrectAdamW(const AdamWSpan& span, const AdamWScalars& s) {
  const AdamWOut out(span);
  NormLanes sq;
  for (size_t i = 0; i < span.n; ++i) {
    const float g = LoadGrad(span.grad, span.grad_dtype, i);
    sq.Add(i, g);
    CorrectElement(g, span.master[i], span.exp_avg[i], span.exp_avg_sq[i], &out.master[i],
                   &out.exp_avg[i], &out.exp_avg_sq[i], s);
    StoreWeight(span.weights, span.weight_dtype, i, out.master[i]);
  }
  return sq.Sum();
}

}  // namespace offloadd::workers::internal::portable
