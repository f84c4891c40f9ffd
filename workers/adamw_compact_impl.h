#pragma once
// Internal to the compact-mode kernel (adamw_compact.h): the rounding helpers every flavour uses
// and the per-flavour entry points (one TU per instruction set, adamw_compact_<flavour>.cc).

#include <cstdint>
#include <cstring>

#include "workers/adamw_compact.h"
#include "workers/adamw_kernel_impl.h"

namespace offloadd::workers::internal {

// Round to nearest even for |x| < 2^22 with two exactly rounded additions (vectorises on every
// flavour; the result is an integer-valued float).
inline float RoundNearestEven(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (x + kMagic) - kMagic;
}

// A 32-bit integer hash (Chris Wellons' lowbias32): full avalanche, cheap, vectorisable.
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The stochastic-rounding key of one state (stream 0: m, 1: v) of one step of one tensor.
inline uint32_t SrKey(uint64_t seed, uint64_t step, uint32_t stream) {
  uint32_t k = Mix32(static_cast<uint32_t>(seed >> 32) ^ 0x9e3779b9u);
  k = Mix32(k ^ static_cast<uint32_t>(seed));
  k = Mix32(k ^ static_cast<uint32_t>(step >> 32));
  return Mix32(k ^ (static_cast<uint32_t>(step) * 2u + stream));
}

// 16 random bits for element `index` (the low 32 bits of its index in the tensor).
inline uint32_t SrBits(uint32_t index, uint32_t key) { return Mix32(index ^ key) & 0xffffu; }

// x rounded to bf16 up or down with probability in proportion to its distance from each (adding
// 16 random bits below the kept ones, then truncating): unbiased. NaN -> 0x7fc0.
inline uint16_t Bf16Stochastic(float x, uint32_t random16) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint16_t r = static_cast<uint16_t>((u + random16) >> 16);
  return x != x ? uint16_t{0x7fc0} : r;
}

#define OFFLOADD_DECLARE_COMPACT_PATH(ns)                                                 \
  namespace ns {                                                                          \
  double CompactAdamW(const CompactSpan& span, OptimizerMode mode, const AdamWScalars& s, \
                      uint64_t step);                                                     \
  }
OFFLOADD_DECLARE_COMPACT_PATH(portable)
OFFLOADD_DECLARE_COMPACT_PATH(avx2)
OFFLOADD_DECLARE_COMPACT_PATH(avx512)
OFFLOADD_DECLARE_COMPACT_PATH(avx512bf16)
#undef OFFLOADD_DECLARE_COMPACT_PATH

}  // namespace offloadd::workers::internal
