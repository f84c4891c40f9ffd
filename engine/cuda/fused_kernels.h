// Fused elementwise kernels for the CUDA flavour: RMSNorm (forward, re-apply from a saved rstd,
// backward with the residual add) and SwiGLU (forward, backward that also rebuilds the product).
//
// Each kernel does in one pass what the ATen op sequence in engine/ops.cc does in 4-13 kernels,
// with the same roundings: every intermediate the op sequence stores in the model dtype is
// rounded to it here too, the rest stays fp32, and no multiply-add is contracted where the op
// sequence rounds between them. Only the order of the fp32 row/column sums differs, so results
// agree with the ATen path to fp32 summation order (see tests/engine/fused_kernels_test.cc).
//
// Plain pointers and a stream, no ATen: nvcc never compiles the LibTorch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace offloadd::engine::cuda {

enum class DType { kFloat, kBFloat16, kHalf };

// Largest hidden size the RMSNorm backward handles (its dW partial sums live in shared memory).
constexpr int64_t kMaxRmsNormHidden = 12288;

// Every pointer is to contiguous row-major data; `rows` x `h`.
// y = w * to_dtype(x * rstd), rstd = rsqrt(mean(x^2) + eps) (fp32, one per row).
void RmsNormForward(DType t, const void* x, const void* w, float eps, int64_t rows, int64_t h,
                    void* y, float* rstd, cudaStream_t stream);
// y = w * to_dtype(x * rstd) with the rstd saved by the forward.
void RmsNormApply(DType t, const void* x, const void* w, const float* rstd, int64_t rows, int64_t h,
                  void* y, cudaStream_t stream);
// dx = [residual +] to_dtype(rstd * (dn - n * mean(dn * n))), dn = to_dtype(dy * w),
// dw = to_dtype(sum_rows to_dtype(dy * to_dtype(n))). `residual` may be null. `partial` is fp32
// scratch of RmsNormBackwardScratch(rows, h) floats.
int64_t RmsNormBackwardScratch(int64_t rows, int64_t h);
void RmsNormBackward(DType t, const void* dy, const void* x, const void* w, const float* rstd,
                     const void* residual, int64_t rows, int64_t h, void* dx, void* dw,
                     float* partial, cudaStream_t stream);

// a = to_dtype(silu(g)) * u, rounded to the dtype (n elements).
void SwiGluForward(DType t, const void* g, const void* u, int64_t n, void* a, cudaStream_t stream);
// dg = silu_backward(to_dtype(da * u), g), du = da * to_dtype(silu(g)), and, when `a` is not
// null, a = to_dtype(silu(g)) * u (the product the down projection's weight gradient needs).
void SwiGluBackward(DType t, const void* da, const void* g, const void* u, int64_t n, void* dg,
                    void* du, void* a, cudaStream_t stream);

}  // namespace offloadd::engine::cuda
