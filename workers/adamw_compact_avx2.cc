// The compact-mode AdamW step (adamw_compact.h), avx2 flavour: AVX2 + FMA + F16C intrinsics, one
// fused pass per block of kInt8BlockSize as adamw_compact_avx512.inc does (decode, step and
// encode in registers; int8 states quantised from an L1 buffer once the block's maxima are known,
// with the step's own sqrt(v)). 16 elements at a time in two 8-lane halves (FusedAdamW's norm
// order); a span's last partial 16 goes through the same code on zero-padded copies. Every
// operation is the portable flavour's (adamw_compact.inc) in the same order, so the bits are the
// same. The conversions to int8 codes round as MXCSR says, nearest even, as every float operation
// here assumes.
#include <algorithm>
#include <cstring>

#include "workers/adamw_avx2_helpers.inc"
#include "workers/adamw_compact_impl.h"

namespace offloadd::workers::internal::avx2 {
namespace {

constexpr size_t kBlock = kInt8BlockSize;

inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline void Store8x16(uint16_t* p, __m128i h) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
}
inline __m128i Load8Bytes(const void* p) {
  return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
}

inline __m256i Mix32x8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

// Bf16Stochastic(x, SrBits(index, key)) on 8 lanes.
inline __m128i Bf16Stochastic8(__m256 x, __m256i index, __m256i key) {
  const __m256i bits =
      _mm256_and_si256(Mix32x8(_mm256_xor_si256(index, key)), _mm256_set1_epi32(0xffff));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_castps_si256(x), bits), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return PackU16(_mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan));
}

inline __m256i AbsBits(__m256 x) {
  return _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
}
inline float MaxAsFloat(__m256i most) {
  alignas(32) uint32_t lane[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lane), most);
  const uint32_t u = *std::max_element(lane, lane + 8);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// EncodeInt8M's codes for 8 lanes under inv = 127 / absmax (or 0): rne(clamp(m inv)), NaN -> 0.
// kFinite: the block's maximum and its inverse are finite, so |m inv| <= 127 (1 + 2^-23) rounds
// into [-127, 127] and is never NaN: the clamp and the NaN test change nothing and are skipped.
template <bool kFinite>
inline __m256i QuantiseM(__m256 m, __m256 inv) {
  const __m256 y = _mm256_mul_ps(m, inv);
  if constexpr (kFinite) return _mm256_cvtps_epi32(y);
  const __m256 ordered = _mm256_cmp_ps(y, y, _CMP_ORD_Q);
  const __m256 c = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  return _mm256_cvtps_epi32(_mm256_and_ps(c, ordered));
}

// EncodeInt8V's codes for 8 lanes of sqrt(v) under inv = 255 / max (or 0): min(rne(sv inv), 255),
// NaN -> 0, at least 1 where sv > 0.
// kFinite: as QuantiseM's, sv inv <= 255 (1 + 2^-23) rounds to at most 255 and is never NaN.
template <bool kFinite>
inline __m256i QuantiseV(__m256 sv, __m256 inv) {
  const __m256 y = _mm256_mul_ps(sv, inv);
  __m256i x;
  if constexpr (kFinite) {
    x = _mm256_cvtps_epi32(y);
  } else {
    const __m256 ordered = _mm256_cmp_ps(y, y, _CMP_ORD_Q);
    x = _mm256_cvtps_epi32(_mm256_and_ps(_mm256_min_ps(y, _mm256_set1_ps(255.0f)), ordered));
  }
  const __m256i positive = _mm256_castps_si256(_mm256_cmp_ps(sv, _mm256_setzero_ps(), _CMP_GT_OQ));
  return _mm256_max_epi32(x, _mm256_and_si256(positive, _mm256_set1_epi32(1)));
}

// 16 int32 codes (in [-128, 255]) as 16 bytes, signed or unsigned saturation.
template <bool kSigned>
inline __m128i PackBytes(__m256i a, __m256i b) {
  const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8);  // a0-7 | b0-7
  const __m256i bytes = kSigned ? _mm256_packs_epi16(w, w) : _mm256_packus_epi16(w, w);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(bytes, 0x08));
}

struct Consts {
  __m256 scale, decay, coeff, beta2, omb2, nstep, bc2, eps;
  bool decay_on, lerp_small;
  __m256i key_m, key_v;
  Consts(const AdamWScalars& s, uint32_t km, uint32_t kv)
      : scale(_mm256_set1_ps(s.grad_scale)),
        decay(_mm256_set1_ps(s.decay)),
        coeff(_mm256_set1_ps(s.lerp_coeff)),
        beta2(_mm256_set1_ps(s.beta2)),
        omb2(_mm256_set1_ps(s.one_minus_beta2)),
        nstep(_mm256_set1_ps(s.neg_step_size)),
        bc2(_mm256_set1_ps(s.bc2_sqrt)),
        eps(_mm256_set1_ps(s.eps)),
        decay_on(s.decay_on),
        lerp_small(s.lerp_small),
        key_m(_mm256_set1_epi32(static_cast<int>(km))),
        key_v(_mm256_set1_epi32(static_cast<int>(kv))) {}
};

// Where one 16-element chunk's data is: the span's own arrays at element i, or zero-padded
// copies of a partial chunk at element 0.
struct Ptrs {
  const void* grad;
  GradDtype grad_dtype;
  void* master;
  uint16_t* comp;
  void* m;
  void* v;
  void* weights;
  WeightDtype weight_dtype;
};

// The state a block carries between its chunks and into the int8 quantisation.
struct BlockState {
  alignas(32) float mbuf[kBlock];   // int8: the new m
  alignas(32) float svbuf[kBlock];  // int8: the new sqrt(v)
  __m256i mmax = _mm256_setzero_si256(), svmax = _mm256_setzero_si256();
  __m256 mstep, vstep;
};

// The int8 codes of a block's new m and sqrt(v) (bs's buffers, whole chunks) under its inverse
// scales.
template <bool kFinite>
void QuantiseBlock(const BlockState& bs, size_t n, float minv, float vinv, int8_t* qm,
                   uint8_t* qv) {
  const __m256 mi = _mm256_set1_ps(minv), vi = _mm256_set1_ps(vinv);
  for (size_t k = 0; k < n; k += 16) {
    const __m128i cm = PackBytes<true>(QuantiseM<kFinite>(_mm256_load_ps(bs.mbuf + k), mi),
                                       QuantiseM<kFinite>(_mm256_load_ps(bs.mbuf + k + 8), mi));
    const __m128i cv = PackBytes<false>(QuantiseV<kFinite>(_mm256_load_ps(bs.svbuf + k), vi),
                                        QuantiseV<kFinite>(_mm256_load_ps(bs.svbuf + k + 8), vi));
    if (k + 16 <= n) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qm + k), cm);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qv + k), cv);
    } else {
      alignas(16) uint8_t tmp[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), cm);
      std::memcpy(qm + k, tmp, n - k);
      _mm_store_si128(reinterpret_cast<__m128i*>(tmp), cv);
      std::memcpy(qv + k, tmp, n - k);
    }
  }
}

// Eight elements at ptrs' element i (block element j, tensor index `index`); `valid` masks the
// lanes that exist out of the int8 maxima. Returns the raw gradients.
template <MasterDtype kMaster, StateDtype kState>
inline __m256 Step8(const Ptrs& P, size_t i, size_t j, uint32_t index, __m256i valid,
                    const Consts& c, BlockState* bs) {
  const __m256 graw = LoadGrad8(P.grad, P.grad_dtype, i);
  const __m256 g = _mm256_mul_ps(graw, c.scale);
  __m256 p;
  if constexpr (kMaster == MasterDtype::kFp32) {
    p = _mm256_loadu_ps(static_cast<const float*>(P.master) + i);
  } else {
    p = _mm256_add_ps(LoadBf16x8(static_cast<const uint16_t*>(P.master) + i),
                      LoadBf16x8(P.comp + i));
  }
  __m256 m, v;
  if constexpr (kState == StateDtype::kFp32) {
    m = _mm256_loadu_ps(static_cast<const float*>(P.m) + i);
    v = _mm256_loadu_ps(static_cast<const float*>(P.v) + i);
  } else if constexpr (kState == StateDtype::kBf16) {
    m = LoadBf16x8(static_cast<const uint16_t*>(P.m) + i);
    v = LoadBf16x8(static_cast<const uint16_t*>(P.v) + i);
  } else {
    const __m256i qm = _mm256_cvtepi8_epi32(Load8Bytes(static_cast<const int8_t*>(P.m) + i));
    const __m256i qv = _mm256_cvtepu8_epi32(Load8Bytes(static_cast<const uint8_t*>(P.v) + i));
    m = _mm256_mul_ps(_mm256_cvtepi32_ps(qm), bs->mstep);
    const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(qv), bs->vstep);
    v = _mm256_mul_ps(s, s);
  }
  // FusedAdamW's operations.
  if (c.decay_on) p = _mm256_mul_ps(p, c.decay);
  const __m256 diff = _mm256_sub_ps(g, m);
  const __m256 mm = _mm256_fmadd_ps(c.coeff, diff, c.lerp_small ? m : g);
  const __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(c.omb2, g), g, _mm256_mul_ps(v, c.beta2));
  const __m256 sv = _mm256_sqrt_ps(vv);
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(sv, c.bc2), c.eps);
  p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(c.nstep, mm), denom));
  if constexpr (kMaster == MasterDtype::kFp32) {
    _mm256_storeu_ps(static_cast<float*>(P.master) + i, p);
    StoreWeights8(P.weights, P.weight_dtype, i, p);
  } else {  // hi = rne(p); lo = rne(p - hi); hi is the bf16 weight copy's bits
    const __m256i hi = Bf16Bits32(p);
    const __m128i hi16 = PackU16(hi);
    Store8x16(static_cast<uint16_t*>(P.master) + i, hi16);
    Store8x16(P.comp + i, ToBf16(_mm256_sub_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)))));
    if (P.weight_dtype == WeightDtype::kBf16) {
      Store8x16(static_cast<uint16_t*>(P.weights) + i, hi16);
    } else {
      StoreWeights8(P.weights, P.weight_dtype, i, p);
    }
  }
  if constexpr (kState == StateDtype::kFp32) {
    _mm256_storeu_ps(static_cast<float*>(P.m) + i, mm);
    _mm256_storeu_ps(static_cast<float*>(P.v) + i, vv);
  } else if constexpr (kState == StateDtype::kBf16) {
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(index)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    Store8x16(static_cast<uint16_t*>(P.m) + i, Bf16Stochastic8(mm, idx, c.key_m));
    Store8x16(static_cast<uint16_t*>(P.v) + i, Bf16Stochastic8(vv, idx, c.key_v));
  } else {
    _mm256_store_ps(bs->mbuf + j, mm);
    _mm256_store_ps(bs->svbuf + j, sv);
    bs->mmax = _mm256_max_epu32(bs->mmax, _mm256_and_si256(AbsBits(mm), valid));
    bs->svmax = _mm256_max_epu32(bs->svmax, _mm256_and_si256(AbsBits(sv), valid));
  }
  return graw;
}

// A span's last elements [i, i + count), count < 16, through Step8 on zero-padded copies (zero
// gradients add nothing to the norm lanes; the missing lanes are masked out of the int8 maxima).
template <MasterDtype kMaster, StateDtype kState>
void PartialChunk(const CompactSpan& sp, size_t i, size_t j, size_t count, const Consts& c,
                  BlockState* bs, __m256* lo, __m256* hi) {
  alignas(32) uint8_t grad[64] = {}, master[64] = {}, m[64] = {}, v[64] = {};
  alignas(32) uint16_t comp[16] = {}, weights[16] = {};
  const size_t gb = GradBytes(sp.grad_dtype);
  const size_t pb = kMaster == MasterDtype::kFp32 ? 4 : 2;
  const size_t sb = kState == StateDtype::kFp32 ? 4 : kState == StateDtype::kBf16 ? 2 : 1;
  std::memcpy(grad, static_cast<const uint8_t*>(sp.grad) + i * gb, count * gb);
  std::memcpy(master, static_cast<uint8_t*>(sp.master) + i * pb, count * pb);
  if (kMaster == MasterDtype::kBf16) std::memcpy(comp, sp.master_comp + i, count * 2);
  std::memcpy(m, static_cast<uint8_t*>(sp.exp_avg) + i * sb, count * sb);
  std::memcpy(v, static_cast<uint8_t*>(sp.exp_avg_sq) + i * sb, count * sb);
  const Ptrs P{grad, sp.grad_dtype, master, comp, m, v, weights, sp.weight_dtype};
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const uint32_t index = static_cast<uint32_t>(sp.first_index + i);
  for (size_t h = 0; h < 2; ++h) {
    const int left = static_cast<int>(count) - static_cast<int>(8 * h);
    const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), iota);
    const __m256 g = Step8<kMaster, kState>(P, 8 * h, j + 8 * h, index + 8 * h, valid, c, bs);
    __m256* acc = h == 0 ? lo : hi;
    *acc = _mm256_fmadd_ps(g, g, *acc);
  }
  std::memcpy(static_cast<uint8_t*>(sp.master) + i * pb, master, count * pb);
  if (kMaster == MasterDtype::kBf16) std::memcpy(sp.master_comp + i, comp, count * 2);
  if (kState != StateDtype::kInt8) {
    std::memcpy(static_cast<uint8_t*>(sp.exp_avg) + i * sb, m, count * sb);
    std::memcpy(static_cast<uint8_t*>(sp.exp_avg_sq) + i * sb, v, count * sb);
  }
  if (sp.weight_dtype != WeightDtype::kNone) {
    std::memcpy(static_cast<uint16_t*>(sp.weights) + i, weights, count * 2);
  }
}

// One block [b0, b0 + n), n <= kBlock: returns its gradients' sum of squares (NormLanes' order).
template <MasterDtype kMaster, StateDtype kState>
double Block(const CompactSpan& sp, const Consts& c, size_t b0, size_t n) {
  BlockState bs;
  float m_step = 0, v_step = 0;
  if constexpr (kState == StateDtype::kInt8) {
    m_step = sp.exp_avg_scale[b0 / kBlock] / 127.0f;
    v_step = sp.exp_avg_sq_scale[b0 / kBlock] / 255.0f;
  }
  bs.mstep = _mm256_set1_ps(m_step);
  bs.vstep = _mm256_set1_ps(v_step);
  const Ptrs P{sp.grad,    sp.grad_dtype, sp.master,  sp.master_comp,
               sp.exp_avg, sp.exp_avg_sq, sp.weights, sp.weight_dtype};
  const __m256i all = _mm256_set1_epi32(-1);
  const uint32_t index0 = static_cast<uint32_t>(sp.first_index + b0);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  size_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256 a = Step8<kMaster, kState>(P, b0 + j, j, index0 + j, all, c, &bs);
    const __m256 b = Step8<kMaster, kState>(P, b0 + j + 8, j + 8, index0 + j + 8, all, c, &bs);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  if (j < n) PartialChunk<kMaster, kState>(sp, b0 + j, j, n - j, c, &bs, &lo, &hi);
  if constexpr (kState == StateDtype::kInt8) {
    const float absmax = MaxAsFloat(bs.mmax), top = MaxAsFloat(bs.svmax);
    const float minv = absmax > 0.0f ? 127.0f / absmax : 0.0f;
    const float vinv = top > 0.0f ? 255.0f / top : 0.0f;
    int8_t* qm = static_cast<int8_t*>(sp.exp_avg) + b0;
    uint8_t* qv = static_cast<uint8_t*>(sp.exp_avg_sq) + b0;
    if (std::isfinite(absmax) && std::isfinite(top) && std::isfinite(minv) && std::isfinite(vinv)) {
      QuantiseBlock<true>(bs, n, minv, vinv, qm, qv);
    } else {
      QuantiseBlock<false>(bs, n, minv, vinv, qm, qv);
    }
    sp.exp_avg_scale[b0 / kBlock] = absmax;
    sp.exp_avg_sq_scale[b0 / kBlock] = top;
  }
  NormLanes l;
  _mm256_store_ps(l.lane, lo);
  _mm256_store_ps(l.lane + 8, hi);
  return l.Sum();
}

template <MasterDtype kMaster, StateDtype kState>
double Run(const CompactSpan& sp, const Consts& c) {
  double sq = 0;
  for (size_t b0 = 0; b0 < sp.n; b0 += kBlock) {
    sq += Block<kMaster, kState>(sp, c, b0, std::min(kBlock, sp.n - b0));
  }
  return sq;
}

template <MasterDtype kMaster>
double RunState(const CompactSpan& sp, StateDtype state, const Consts& c) {
  switch (state) {
    case StateDtype::kBf16:
      return Run<kMaster, StateDtype::kBf16>(sp, c);
    case StateDtype::kInt8:
      return Run<kMaster, StateDtype::kInt8>(sp, c);
    case StateDtype::kFp32:
      break;
  }
  return Run<kMaster, StateDtype::kFp32>(sp, c);
}

}  // namespace

double CompactAdamW(const CompactSpan& sp, OptimizerMode mode, const AdamWScalars& s,
                    uint64_t step) {
  const Consts c(s, SrKey(sp.seed, step, 0), SrKey(sp.seed, step, 1));
  return mode.master == MasterDtype::kFp32 ? RunState<MasterDtype::kFp32>(sp, mode.state, c)
                                           : RunState<MasterDtype::kBf16>(sp, mode.state, c);
}

}  // namespace offloadd::workers::internal::avx2
