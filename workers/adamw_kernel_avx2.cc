// AVX2 + FMA + F16C path (compiled with -mavx2 -mfma -mf16c; only called when
// cpuid says so). bf16 rounding is done in integer arithmetic, exactly as
// c10::BFloat16 does it.
#include "workers/adamw_avx2_helpers.inc"

namespace offloadd::workers::internal::avx2 {
namespace {

// The two 8-lane halves of the canonical 16 norm lanes (NormLanes), for the
// scalar tail to go on.
inline NormLanes Lanes(__m256 lo, __m256 hi) {
  NormLanes l;
  _mm256_store_ps(l.lane, lo);
  _mm256_store_ps(l.lane + 8, hi);
  return l;
}

// The canonical norm order (NormLanes) for every AVX2 kernel: step8(i)
// processes elements [i, i + 8) and returns their raw gradients; tail(i)
// processes element i alone and returns its raw gradient. 16 elements per
// iteration in two 8-lane halves, then the scalar tail.
template <typename Step8, typename Tail>
double CanonicalLoop(size_t n, Step8 step8, Tail tail) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = step8(i), b = step8(i + 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  NormLanes sq = Lanes(lo, hi);
  for (; i < n; ++i) sq.Add(i, tail(i));
  return sq.Sum();
}

}  // namespace

double FusedAdamW(const AdamWSpan &span, const AdamWScalars &s) {
  const __m256 scale = _mm256_set1_ps(s.grad_scale), decay = _mm256_set1_ps(s.decay);
  const __m256 coeff = _mm256_set1_ps(s.lerp_coeff), beta2 = _mm256_set1_ps(s.beta2);
  const __m256 omb2 = _mm256_set1_ps(s.one_minus_beta2), nstep = _mm256_set1_ps(s.neg_step_size);
  const __m256 bc2 = _mm256_set1_ps(s.bc2_sqrt), eps = _mm256_set1_ps(s.eps);
  const AdamWOut out(span);
  // Eight elements at i; returns their raw gradients for the norm.
  const auto step8 = [&](size_t i) {
    const __m256 graw = LoadGrad8(span.grad, span.grad_dtype, i);
    const __m256 g = _mm256_mul_ps(graw, scale);
    __m256 p = _mm256_loadu_ps(span.master + i);
    const __m256 m = _mm256_loadu_ps(span.exp_avg + i);
    const __m256 v = _mm256_loadu_ps(span.exp_avg_sq + i);
    if (s.decay_on) p = _mm256_mul_ps(p, decay);
    const __m256 diff = _mm256_sub_ps(g, m);
    const __m256 mm = _mm256_fmadd_ps(coeff, diff, s.lerp_small ? m : g);
    const __m256 vv = _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(v, beta2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2), eps);
    p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(nstep, mm), denom));
    _mm256_storeu_ps(out.master + i, p);
    _mm256_storeu_ps(out.exp_avg + i, mm);
    _mm256_storeu_ps(out.exp_avg_sq + i, vv);
    StoreWeights8(span.weights, span.weight_dtype, i, p);
    return graw;
  };
  return CanonicalLoop(span.n, step8, [&](size_t i) {
    const float g = LoadGrad(span.grad, span.grad_dtype, i);
    AdamWElement(g, span.master[i], span.exp_avg[i], span.exp_avg_sq[i], &out.master[i],
                 &out.exp_avg[i], &out.exp_avg_sq[i], s);
    StoreWeight(span.weights, span.weight_dtype, i, out.master[i]);
    return g;
  });
}

double AccumulateGrad(float *acc, const float *acc_in, const void *grad, GradDtype dtype, size_t n,
                      bool overwrite) {
  const auto step8 = [&](size_t i) {
    const __m256 g = LoadGrad8(grad, dtype, i);
    _mm256_storeu_ps(acc + i, overwrite ? g : _mm256_add_ps(_mm256_loadu_ps(acc_in + i), g));
    return g;
  };
  return CanonicalLoop(n, step8, [&](size_t i) {
    const float g = LoadGrad(grad, dtype, i);
    acc[i] = overwrite ? g : acc_in[i] + g;
    return g;
  });
}

double GradSquaredNorm(const void *grad, GradDtype dtype, size_t n) {
  return CanonicalLoop(
      n, [&](size_t i) { return LoadGrad8(grad, dtype, i); },
      [&](size_t i) { return LoadGrad(grad, dtype, i); });
}

// CorrectElement's operations, 8 lanes at a time; the tail (n % 16) goes
// through CorrectElement.
double CorrectAdamW(const AdamWSpan &span, const AdamWScalars &s) {
  const __m256 scale = _mm256_set1_ps(s.grad_scale), omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 omb2 = _mm256_set1_ps(s.one_minus_beta2), nstep = _mm256_set1_ps(s.neg_step_size);
  const __m256 bc2 = _mm256_set1_ps(s.bc2_sqrt), eps = _mm256_set1_ps(s.eps);
  const __m256 zero = _mm256_setzero_ps();
  const AdamWOut out(span);
  const auto step8 = [&](size_t i) {
    const __m256 g = LoadGrad8(span.grad, span.grad_dtype, i);
    const __m256 p1 = _mm256_loadu_ps(span.master + i);
    const __m256 m1 = _mm256_loadu_ps(span.exp_avg + i);
    const __m256 v1 = _mm256_loadu_ps(span.exp_avg_sq + i);
    const __m256 gc = _mm256_mul_ps(g, scale);
    const __m256 mc = _mm256_fmadd_ps(omb1, _mm256_sub_ps(gc, g), m1);
    const __m256 dv = _mm256_sub_ps(_mm256_mul_ps(gc, gc), _mm256_mul_ps(g, g));
    const __m256 vc = _mm256_max_ps(_mm256_fmadd_ps(omb2, dv, v1), zero);  // NaN -> 0
    const __m256 u1 = _mm256_div_ps(_mm256_mul_ps(nstep, m1),
                                    _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v1), bc2), eps));
    const __m256 uc = _mm256_div_ps(_mm256_mul_ps(nstep, mc),
                                    _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vc), bc2), eps));
    const __m256 p = _mm256_add_ps(_mm256_sub_ps(p1, u1), uc);
    _mm256_storeu_ps(out.master + i, p);
    _mm256_storeu_ps(out.exp_avg + i, mc);
    _mm256_storeu_ps(out.exp_avg_sq + i, vc);
    StoreWeights8(span.weights, span.weight_dtype, i, p);
    return g;
  };
  return CanonicalLoop(span.n, step8, [&](size_t i) {
    const float g = LoadGrad(span.grad, span.grad_dtype, i);
    CorrectElement(g, span.master[i], span.exp_avg[i], span.exp_avg_sq[i], &out.master[i],
                   &out.exp_avg[i], &out.exp_avg_sq[i], s);
    StoreWeight(span.weights, span.weight_dtype, i, out.master[i]);
    return g;
  });
}

}  // namespace offloadd::workers::internal::avx2
