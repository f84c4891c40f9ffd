// The compact-mode AdamW arithmetic of one element (workers/adamw_compact.inc and
// workers/adamw_kernel_impl.h's AdamWElement) as __host__ __device__ functions: the CUDA kernel
// (compact_adamw.cu) runs them on the GPU, and tests/trainer/pipeline/compact_adamw_math_test.cc
// runs the same functions on the CPU against workers::CompactAdamW, bit for bit.
//
// Bit for bit because every operation is an exactly rounded IEEE operation or integer arithmetic:
// on the device each one is the _rn intrinsic (so nvcc contracts no multiply-add the CPU kernel
// rounds in between, and the division and square root are IEEE's whatever the flags), on the host
// the plain operator. No LibTorch, no workers headers: nvcc compiles it alone.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define OFFLOADD_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define OFFLOADD_HD inline
#endif

namespace offloadd::trainer::compact {

// workers::internal::AdamWScalars, with the stochastic-rounding keys of the step (SrKey).
struct Scalars {
  float grad_scale;
  float decay;
  float lerp_coeff;
  float beta2;
  float one_minus_beta2;
  float neg_step_size;
  float bc2_sqrt;
  float eps;
  uint32_t key_m;
  uint32_t key_v;
  bool lerp_small;
  bool decay_on;
};

#if defined(__CUDA_ARCH__)
OFFLOADD_HD float Mul(float a, float b) { return __fmul_rn(a, b); }
OFFLOADD_HD float Add(float a, float b) { return __fadd_rn(a, b); }
OFFLOADD_HD float Sub(float a, float b) { return __fsub_rn(a, b); }
OFFLOADD_HD float Div(float a, float b) { return __fdiv_rn(a, b); }
OFFLOADD_HD float Sqrt(float a) { return __fsqrt_rn(a); }
OFFLOADD_HD float Fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
OFFLOADD_HD float FromBits(uint32_t u) { return __uint_as_float(u); }
OFFLOADD_HD uint32_t ToBits(float f) { return __float_as_uint(f); }
#else
OFFLOADD_HD float Mul(float a, float b) { return a * b; }
OFFLOADD_HD float Add(float a, float b) { return a + b; }
OFFLOADD_HD float Sub(float a, float b) { return a - b; }
OFFLOADD_HD float Div(float a, float b) { return a / b; }
OFFLOADD_HD float Sqrt(float a) { return std::sqrt(a); }
OFFLOADD_HD float Fma(float a, float b, float c) { return std::fma(a, b, c); }
OFFLOADD_HD float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
OFFLOADD_HD uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
#endif

OFFLOADD_HD float Bf16ToFloat(uint16_t b) { return FromBits(uint32_t{b} << 16); }
// Round to nearest even, NaN -> 0x7fc0 (c10::BFloat16's conversion).
OFFLOADD_HD uint16_t FloatToBf16(float f) {
  const uint32_t u = ToBits(f);
  if (f != f) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#if defined(__CUDACC__)
OFFLOADD_HD float Fp16ToFloat(uint16_t b) { return __half2float(__ushort_as_half(b)); }
OFFLOADD_HD uint16_t FloatToFp16(float f) { return __half_as_ushort(__float2half_rn(f)); }
#else
inline float Fp16ToFloat(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
inline uint16_t FloatToFp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
#endif

// workers::internal::Mix32 / SrBits / Bf16Stochastic.
OFFLOADD_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
OFFLOADD_HD uint16_t Bf16Stochastic(float x, uint32_t index, uint32_t key) {
  const uint32_t random16 = Mix32(index ^ key) & 0xffffu;
  const uint16_t r = static_cast<uint16_t>((ToBits(x) + random16) >> 16);
  return x != x ? uint16_t{0x7fc0} : r;
}

// Round to nearest even for |x| < 2^22 (workers::internal::RoundNearestEven).
OFFLOADD_HD float RoundNearestEven(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return Sub(Add(x, kMagic), kMagic);
}
OFFLOADD_HD float Min(float a, float b) { return b < a ? b : a; }  // std::min
OFFLOADD_HD float Max(float a, float b) { return a < b ? b : a; }  // std::max

// AdamWElement: reads p/m/v, returns the new ones.
OFFLOADD_HD void Element(float g_raw, float* p, float* m, float* v, const Scalars& s) {
  const float g = Mul(g_raw, s.grad_scale);
  float pp = *p;
  if (s.decay_on) pp = Mul(pp, s.decay);
  const float diff = Sub(g, *m);
  const float mm = s.lerp_small ? Fma(s.lerp_coeff, diff, *m) : Fma(s.lerp_coeff, diff, g);
  const float vv = Fma(Mul(s.one_minus_beta2, g), g, Mul(*v, s.beta2));
  const float denom = Add(Div(Sqrt(vv), s.bc2_sqrt), s.eps);
  pp = Add(pp, Div(Mul(s.neg_step_size, mm), denom));
  *p = pp;
  *m = mm;
  *v = vv;
}

// The int8 decodings (DecodeInt8M / DecodeInt8V) and encodings given the block's scale
// (EncodeInt8M / EncodeInt8V; the scale is the block's AbsMax, a reduction the caller does on the
// bit patterns: ToBits(x) & 0x7fffffff, the largest, back to float).
OFFLOADD_HD float DecodeInt8M(int8_t q, float scale) {
  return Mul(static_cast<float>(q), Div(scale, 127.0f));
}
OFFLOADD_HD float DecodeInt8V(uint8_t q, float scale) {
  const float s = Mul(static_cast<float>(q), Div(scale, 255.0f));
  return Mul(s, s);
}
OFFLOADD_HD int8_t EncodeInt8M(float m, float absmax) {
  const float inv = absmax > 0.0f ? Div(127.0f, absmax) : 0.0f;
  const float y = Mul(m, inv);
  const float x = y == y ? Min(Max(y, -127.0f), 127.0f) : 0.0f;
  return static_cast<int8_t>(static_cast<int32_t>(RoundNearestEven(x)));
}
OFFLOADD_HD uint8_t EncodeInt8V(float sqrt_v, float top) {
  const float inv = top > 0.0f ? Div(255.0f, top) : 0.0f;
  const float y = RoundNearestEven(Mul(sqrt_v, inv));
  float x = y == y ? Min(y, 255.0f) : 0.0f;
  x = sqrt_v > 0.0f ? Max(x, 1.0f) : x;
  return static_cast<uint8_t>(static_cast<int32_t>(x));
}
OFFLOADD_HD uint32_t AbsBits(float x) { return ToBits(x) & 0x7fffffffu; }

}  // namespace offloadd::trainer::compact
