#pragma once
// Internal to the kernel: per-call scalars and the per-path entry points (one TU per ISA, each
// compiled with its own -m flags so that nothing outside it assumes the ISA).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "workers/adamw_kernel.h"

namespace offloadd::workers::internal {

// Scalars derived once per call in double, then rounded to float as PyTorch does when a Python
// float meets a float32 tensor.
struct AdamWScalars {
  float grad_scale;
  float decay;       // 1 - lr * wd
  float lerp_coeff;  // 1 - beta1 (or -beta1 when 1 - beta1 >= 0.5, see ATen lerp)
  float one_minus_beta1;
  bool lerp_small;   // |1 - beta1| < 0.5: m + w (g - m); else g + (w - 1)(g - m)
  float beta2;
  float one_minus_beta2;
  float neg_step_size;  // -lr / (1 - beta1^k)
  float bc2_sqrt;       // sqrt(1 - beta2^k)
  float eps;
  bool decay_on;
};
AdamWScalars MakeScalars(const AdamWHyper& h);

inline float Bf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN -> 0x7fc0: c10::BFloat16's conversion.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float Fp16ToFloat(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);  // exact
}
inline uint16_t FloatToFp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);  // IEEE round-to-nearest-even
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

// Sums of squares (the clipping norm, the fp16 overflow check) take one canonical order on every
// path, so every flavour computes the same norm bit for bit, and with it the same clip
// coefficient and the same update: element i of a call goes into fp32 lane i % 16 by a fused
// multiply-add (the AVX-512 register layout; AVX2 keeps two 8-lane halves; absent tail elements
// add nothing), and the 16 lanes are summed in double in lane order.
inline constexpr size_t kNormLanes = 16;
struct NormLanes {
  alignas(64) float lane[kNormLanes] = {};
  void Add(size_t i, float g) { lane[i % kNormLanes] = std::fma(g, g, lane[i % kNormLanes]); }
  double Sum() const {
    double s = 0;
    for (float x : lane) s += x;
    return s;
  }
};

// One element, exactly the operation order of the vector paths; used by the portable path and
// for the tails of the AVX2 path.
// Reads p/m/v, writes op/om/ov (which may alias them).
inline void AdamWElement(float g_raw, float p, float m, float v, float* op, float* om, float* ov,
                          const AdamWScalars& s) {
  const float g = g_raw * s.grad_scale;
  float pp = p;
  if (s.decay_on) pp = pp * s.decay;
  const float diff = g - m;
  const float mm = s.lerp_small ? std::fma(s.lerp_coeff, diff, m) : std::fma(s.lerp_coeff, diff, g);
  const float vv = std::fma(s.one_minus_beta2 * g, g, v * s.beta2);  // ATen addcmul's fmadd
  const float denom = std::sqrt(vv) / s.bc2_sqrt + s.eps;
  pp = pp + (s.neg_step_size * mm) / denom;
  *op = pp;
  *om = mm;
  *ov = vv;
}

// CorrectAdamW on one element (see adamw_kernel.h); the same operations on every path.
inline void CorrectElement(float g_raw, float p1, float m1, float v1, float* op, float* om, float* ov,
                           const AdamWScalars& s) {
  const float gc = g_raw * s.grad_scale;
  const float mc = std::fma(s.one_minus_beta1, gc - g_raw, m1);
  const float vc_raw = std::fma(s.one_minus_beta2, gc * gc - g_raw * g_raw, v1);
  const float vc = vc_raw > 0.0f ? vc_raw : 0.0f;
  const float u1 = (s.neg_step_size * m1) / (std::sqrt(v1) / s.bc2_sqrt + s.eps);
  const float uc = (s.neg_step_size * mc) / (std::sqrt(vc) / s.bc2_sqrt + s.eps);
  *op = (p1 - u1) + uc;
  *om = mc;
  *ov = vc;
}

// Output pointers of a span (in place unless out_* are set).
struct AdamWOut {
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  explicit AdamWOut(const AdamWSpan& s)
      : master(s.out_master ? s.out_master : s.master),
        exp_avg(s.out_exp_avg ? s.out_exp_avg : s.exp_avg),
        exp_avg_sq(s.out_exp_avg_sq ? s.out_exp_avg_sq : s.exp_avg_sq) {}
};

inline void StoreWeight(void* weights, WeightDtype dt, size_t i, float p) {
  if (dt == WeightDtype::kBf16) static_cast<uint16_t*>(weights)[i] = FloatToBf16(p);
  if (dt == WeightDtype::kFp16) static_cast<uint16_t*>(weights)[i] = FloatToFp16(p);
}
inline float LoadGrad(const void* grad, GradDtype dt, size_t i) {
  switch (dt) {
    case GradDtype::kBf16:
      return Bf16ToFloat(static_cast<const uint16_t*>(grad)[i]);
    case GradDtype::kFp16:
      return Fp16ToFloat(static_cast<const uint16_t*>(grad)[i]);
    case GradDtype::kFp32:
      break;
  }
  return static_cast<const float*>(grad)[i];
}

#define OFFLOADD_DECLARE_KERNEL_PATH(ns)                                                    \
  namespace ns {                                                                            \
  double FusedAdamW(const AdamWSpan& span, const AdamWScalars& s);                          \
  double AccumulateGrad(float* acc, const float* acc_in, const void* grad, GradDtype dtype, \
                        size_t n, bool overwrite);                                          \
  double GradSquaredNorm(const void* grad, GradDtype dtype, size_t n);                      \
  double CorrectAdamW(const AdamWSpan& span, const AdamWScalars& s);                        \
  }
OFFLOADD_DECLARE_KERNEL_PATH(portable)
OFFLOADD_DECLARE_KERNEL_PATH(avx2)
OFFLOADD_DECLARE_KERNEL_PATH(avx512)
OFFLOADD_DECLARE_KERNEL_PATH(avx512bf16)
#undef OFFLOADD_DECLARE_KERNEL_PATH

}  // namespace offloadd::workers::internal
