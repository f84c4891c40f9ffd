#pragma once
// The fused CPU AdamW kernel: one pass over a shard reads the gradients (bf16, fp16 or fp32),
// updates the fp32 master weights, exp_avg and exp_avg_sq in place, writes a bf16/fp16 copy of the
// new weights for the GPU, and returns the sum of squares of the gradients it read (for global-norm
// clipping). Also gradient accumulation into fp32 across micro-batches, and a norm-only pass.
//
// Numerics follow torch.optim.AdamW (decoupled weight decay, bias correction) operation by
// operation in fp32, with the per-step scalars computed in double as PyTorch does:
//   g  = grad * grad_scale                  (grad_scale = clip coefficient, 1 when not clipping)
//   p  = p * (1 - lr * wd)
//   m  = lerp(m, g, 1 - beta1)              (fused multiply-add, as ATen's vectorised lerp)
//   v  = fma((1 - beta2) * g, g, v * beta2)  (ATen's vectorised addcmul)
//   p  = p + (-lr / (1 - beta1^k)) * m / (sqrt(v) / sqrt(1 - beta2^k) + eps)
// so results agree with PyTorch to fp32 rounding (see tests/python/workers for the tolerance).
// Code paths: AVX-512 with AVX512_BF16 conversions, AVX-512 (integer bf16 rounding), AVX2+F16C+FMA
// and portable C++, chosen at run time from cpuid; all give the same results bit for bit, the
// 16-bit weight copy included (round to nearest even with denormals kept, as c10::BFloat16 and
// the CUDA cast of the fp32 masters: the AVX512_BF16 instruction's flush of fp32 denormals is
// avoided for vectors that hold one).
//
// Thread-safe: pure functions over caller-owned memory; callers split shards between threads.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::workers {

enum class GradDtype : uint8_t { kBf16 = 0, kFp32 = 1, kFp16 = 2 };
inline size_t GradBytes(GradDtype dt) { return dt == GradDtype::kFp32 ? 4 : 2; }
enum class WeightDtype : uint8_t { kNone = 0, kBf16 = 1, kFp16 = 2 };
enum class KernelPath : uint8_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  uint64_t step = 1;        // Adam step k >= 1 after this update (bias correction)
  float grad_scale = 1.0f;  // gradients are multiplied by this first (global-norm clipping)
};
// INVALID_ARGUMENT naming the field for out-of-range hyper-parameters (step 0, beta outside
// [0, 1), eps <= 0, negative lr or weight decay, non-finite values).
Status ValidateHyper(const AdamWHyper& h);

struct AdamWSpan {
  const void* grad = nullptr;
  GradDtype grad_dtype = GradDtype::kBf16;
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  void* weights = nullptr;  // may be null when weight_dtype is kNone
  WeightDtype weight_dtype = WeightDtype::kBf16;
  size_t n = 0;
  // Where the new master/exp_avg/exp_avg_sq go; null: in place. Writing them elsewhere (a small
  // cache-resident redo buffer) leaves the shared state untouched until the caller commits it.
  float* out_master = nullptr;
  float* out_exp_avg = nullptr;
  float* out_exp_avg_sq = nullptr;
};

// Returns sum(grad^2) of the unscaled gradients (accumulated in fp32 lanes, summed in double). An
// inf or NaN gradient makes the sum inf or NaN (fp16 loss scaling detects overflow from it).
double FusedAdamW(const AdamWSpan& span, const AdamWHyper& hyper, KernelPath path);
// acc = (overwrite ? 0 : acc_in) + grad, acc_in defaulting to acc. Returns sum(grad^2) of the
// gradients read.
double AccumulateGrad(float* acc, const void* grad, GradDtype dtype, size_t n, bool overwrite,
                      KernelPath path, const float* acc_in = nullptr);
double GradSquaredNorm(const void* grad, GradDtype dtype, size_t n, KernelPath path);
// Turns the state FusedAdamW left with grad_scale 1 (span: master, exp_avg, exp_avg_sq after
// that update, and the same gradients) into the state it leaves with hyper.grad_scale = c:
//   m_c = m_1 + w (c g - g)                (w = 1 - beta1: m is linear in g)
//   v_c = max(0, v_1 + (1 - beta2) ((c g)^2 - g^2))
//   p_c = p_1 - u(m_1, v_1) + u(m_c, v_c)  (u: the Adam step FusedAdamW added)
// in fp32. Not bit-identical to FusedAdamW with c: each quantity carries about one more rounding,
// and v_c's relative error is at most 2^-24 v_1 / v_c <= 2^-24 / c^2 (v_0 below v_1's last bit is
// lost); workers/README.md derives the bound on the update. Returns sum(grad^2) as FusedAdamW.
double CorrectAdamW(const AdamWSpan& span, const AdamWHyper& hyper, KernelPath path);

bool PathSupported(KernelPath path);
std::vector<KernelPath> SupportedPaths();  // fastest first
KernelPath BestPath();
std::string_view KernelPathName(KernelPath path);  // "portable", "avx2", "avx512", "avx512bf16"
// Accepts the names above and "auto" (BestPath()). FAILED_PRECONDITION if this CPU lacks it,
// naming the missing instruction set.
StatusOr<KernelPath> ParseKernelPath(std::string_view name);
// The instruction sets `path` needs that this CPU lacks ("AVX-512F, AVX-512BW"); empty when
// supported.
std::string MissingInstructionSets(KernelPath path);

// Forces the kernel flavour of every process that would otherwise pick "auto": set it in the
// environment of offloadd, offloadd-train or a test run (values as for ParseKernelPath).
inline constexpr char kKernelEnvVar[] = "OFFLOADD_ADAMW_KERNEL";

struct KernelChoice {
  KernelPath path = KernelPath::kPortable;
  // Why this one: "fastest this CPU supports", "OFFLOADD_ADAMW_KERNEL=avx2" or "requested".
  std::string reason;
  std::string Describe() const;  // "avx2 (OFFLOADD_ADAMW_KERNEL=avx2)"
};
// An explicit request (anything but "auto" or empty) wins; otherwise the environment variable,
// then the fastest supported path. Errors name the setting that asked for an unusable path.
StatusOr<KernelChoice> ResolveKernelPath(std::string_view requested);

}  // namespace offloadd::workers
