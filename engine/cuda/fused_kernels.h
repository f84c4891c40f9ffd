// Fused elementwise kernels for the CUDA flavour: RMSNorm in each family's rounding (forward,
// re-apply from a saved rstd, backward with the residual add) and the gated MLP activations
// SwiGLU and GeGLU (forward, backward that also rebuilds the product).
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

// How the weight scales n = x * rstd (fp32), as engine/ops.h's RmsScale:
//   kCastThenScale  y = to_dtype(w * to_dtype(n))          (Llama)
//   kScaleThenCast  y = to_dtype(w * n)                    (OLMo 2)
//   kOneOffset      y = to_dtype(n * (1 + w))              (Gemma)
// with w read as fp32 (exact) and, in the last two, no rounding before the final cast.
enum class RmsScale { kCastThenScale, kScaleThenCast, kOneOffset };

// Largest hidden size the RMSNorm backward handles (its dW partial sums live in shared memory).
constexpr int64_t kMaxRmsNormHidden = 12288;

// Every pointer is to contiguous row-major data; `rows` x `h`. Rows of up to 32 x 4 vectors
// (h <= 1024 in 16-bit, 512 in fp32; per-head q/k norm) run 16 or 32 threads per row, several
// rows per block; longer rows run one 256-thread block per row.
// y as above, rstd = rsqrt(mean(x^2) + eps) (fp32, one per row).
void RmsNormForward(DType t, RmsScale s, const void* x, const void* w, float eps, int64_t rows,
                    int64_t h, void* y, float* rstd, cudaStream_t stream);
// y with the rstd saved by the forward.
void RmsNormApply(DType t, RmsScale s, const void* x, const void* w, const float* rstd,
                  int64_t rows, int64_t h, void* y, cudaStream_t stream);
// dx = [residual +] to_dtype(rstd * (dn - n * mean(dn * n))); kCastThenScale: dn =
// to_dtype(dy * w), dw = to_dtype(sum_rows to_dtype(dy * to_dtype(n))); the others: dn = dy * s
// (s = w or 1 + w), dw = to_dtype(sum_rows dy * n), all fp32. `residual` may be null. `partial`
// is fp32 scratch of RmsNormBackwardScratch(rows, h) floats.
int64_t RmsNormBackwardScratch(int64_t rows, int64_t h);
void RmsNormBackward(DType t, RmsScale s, const void* dy, const void* x, const void* w,
                     const float* rstd, const void* residual, int64_t rows, int64_t h, void* dx,
                     void* dw, float* partial, cudaStream_t stream);

// Gated MLP activations act(g) * u: kSilu (SwiGLU) and kGeluTanh (GeGLU, gelu with
// approximate="tanh"), each computed as ATen's CUDA kernel computes it (fp32 opmath).
enum class Glu { kSilu, kGeluTanh };
// a = to_dtype(act(g)) * u, rounded to the dtype (n elements).
void GluForward(DType t, Glu act, const void* g, const void* u, int64_t n, void* a,
                cudaStream_t stream);
// dg = act_backward(to_dtype(da * u), g), du = da * to_dtype(act(g)), and, when `a` is not
// null, a = to_dtype(act(g)) * u (the product the down projection's weight gradient needs).
void GluBackward(DType t, Glu act, const void* da, const void* g, const void* u, int64_t n,
                 void* dg, void* du, void* a, cudaStream_t stream);

}  // namespace offloadd::engine::cuda
