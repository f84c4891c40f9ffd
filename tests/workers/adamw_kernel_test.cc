// The fused AdamW kernel with fp16 gradients (fp16 compute with dynamic loss scaling) on every
// code path this CPU supports, against a scalar reference written from torch.optim.AdamW's
// formula (bf16/fp32 gradients against PyTorch itself: tests/python/workers/test_adamw_kernel.py).
#include "workers/adamw_kernel.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace offloadd::workers {
namespace {

constexpr size_t kN = 1037;  // not a multiple of any vector width: exercises the tails

uint16_t ToHalf(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float FromHalf(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

struct State {
  std::vector<uint16_t> grad;
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<uint16_t> weights;
};

State MakeState(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  State s;
  for (size_t i = 0; i < kN; ++i) {
    // Loss-scaled gradients: anything from fp16 subnormals to tens of thousands.
    const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 24);
    s.grad.push_back(ToHalf(std::fmin(normal(rng) * mag, 60000.0f)));
    s.master.push_back(normal(rng) * 0.05f);
    s.exp_avg.push_back(normal(rng) * 1e-3f);
    s.exp_avg_sq.push_back(std::fabs(normal(rng)) * 1e-6f);
  }
  s.weights.assign(kN, 0);
  return s;
}

// torch.optim.AdamW (_single_tensor_adamw) on one element in fp32, with the scalars PyTorch
// derives in double and ATen's fused lerp / addcmul.
void ReferenceAdamW(State* s, const AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float w = static_cast<float>(1.0 - h.beta1);
  const float beta2 = static_cast<float>(h.beta2), omb2 = static_cast<float>(1.0 - h.beta2);
  const float nstep = static_cast<float>(-(h.lr / bc1)), bc2s = static_cast<float>(std::sqrt(bc2));
  const float eps = static_cast<float>(h.eps);
  for (size_t i = 0; i < kN; ++i) {
    const float g = FromHalf(s->grad[i]) * h.grad_scale;
    float p = s->master[i] * decay;
    const float m = std::fma(w, g - s->exp_avg[i], s->exp_avg[i]);  // |1 - beta1| < 0.5
    const float v = std::fma(omb2 * g, g, s->exp_avg_sq[i] * beta2);
    p = p + (nstep * m) / (std::sqrt(v) / bc2s + eps);
    s->master[i] = p;
    s->exp_avg[i] = m;
    s->exp_avg_sq[i] = v;
    s->weights[i] = ToHalf(p);
  }
}

AdamWSpan SpanOf(State* s) {
  AdamWSpan span;
  span.grad = s->grad.data();
  span.grad_dtype = GradDtype::kFp16;
  span.master = s->master.data();
  span.exp_avg = s->exp_avg.data();
  span.exp_avg_sq = s->exp_avg_sq.data();
  span.weights = s->weights.data();
  span.weight_dtype = WeightDtype::kFp16;
  span.n = kN;
  return span;
}

TEST(AdamWKernelFp16Test, MatchesTheScalarReferenceOnEveryPath) {
  // grad_scale = clip coefficient / loss scale, as the StepDriver folds them.
  const AdamWHyper h{.lr = 2e-3, .weight_decay = 0.1, .step = 3, .grad_scale = 0.37f / 65536.0f};
  const State init = MakeState(1);
  State want = init;
  ReferenceAdamW(&want, h);
  double want_sq = 0;
  for (uint16_t g : init.grad) want_sq += static_cast<double>(FromHalf(g)) * FromHalf(g);
  for (KernelPath path : SupportedPaths()) {
    SCOPED_TRACE(std::string(KernelPathName(path)));
    State got = init;
    const double sq = FusedAdamW(SpanOf(&got), h, path);
    EXPECT_NEAR(sq, want_sq, 1e-6 * want_sq);  // fp32 lanes, summed in double
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(got.master[i], want.master[i]) << "element " << i;
      ASSERT_EQ(got.exp_avg[i], want.exp_avg[i]) << "element " << i;
      ASSERT_EQ(got.exp_avg_sq[i], want.exp_avg_sq[i]) << "element " << i;
      ASSERT_EQ(got.weights[i], want.weights[i]) << "element " << i;
    }
  }
}

TEST(AdamWKernelFp16Test, NormsAndAccumulationReadFp16) {
  const State s = MakeState(2);
  std::vector<float> want(kN);
  double want_sq = 0;
  for (size_t i = 0; i < kN; ++i) {
    want[i] = 0.5f + FromHalf(s.grad[i]);
    want_sq += static_cast<double>(FromHalf(s.grad[i])) * FromHalf(s.grad[i]);
  }
  for (KernelPath path : SupportedPaths()) {
    SCOPED_TRACE(std::string(KernelPathName(path)));
    EXPECT_NEAR(GradSquaredNorm(s.grad.data(), GradDtype::kFp16, kN, path), want_sq,
                1e-6 * want_sq);
    std::vector<float> acc(kN, 0.5f);
    AccumulateGrad(acc.data(), s.grad.data(), GradDtype::kFp16, kN, /*overwrite=*/false, path);
    EXPECT_EQ(acc, want);
  }
}

// Overflow detection rests on this: one inf or NaN anywhere (vector body or tail) makes the
// squared norm non-finite on every path, for the norm-only pass and the fused update alike.
TEST(AdamWKernelFp16Test, InfAndNanPropagateIntoTheNorm) {
  for (uint16_t bad : {uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x7e00}}) {  // +inf -inf NaN
    for (size_t where : {size_t{0}, size_t{17}, kN - 1}) {
      State s = MakeState(3);
      s.grad[where] = bad;
      for (KernelPath path : SupportedPaths()) {
        SCOPED_TRACE(std::string(KernelPathName(path)) + " at " + std::to_string(where));
        EXPECT_FALSE(std::isfinite(GradSquaredNorm(s.grad.data(), GradDtype::kFp16, kN, path)));
        State t = s;
        EXPECT_FALSE(std::isfinite(FusedAdamW(SpanOf(&t), AdamWHyper{}, path)));
        std::vector<float> acc(kN);
        EXPECT_FALSE(std::isfinite(
            AccumulateGrad(acc.data(), s.grad.data(), GradDtype::kFp16, kN, true, path)));
      }
    }
  }
}

// Every flavour computes the same bits: the norm in its canonical lane order (NormLanes), the
// update element by element; so a job's result does not depend on the CPU it ran on. Lengths
// around the vector widths and chunk tails; fp32, bf16 and fp16 gradients.
TEST(AdamWKernelTest, EveryPathComputesThePortableBits) {
  const AdamWHyper h{.lr = 2e-3, .weight_decay = 0.1, .step = 5, .grad_scale = 0.61f};
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{15}, size_t{16}, size_t{17}, size_t{31},
                   size_t{33}, kN}) {
    for (GradDtype dt : {GradDtype::kFp32, GradDtype::kBf16, GradDtype::kFp16}) {
      std::mt19937 rng(static_cast<uint32_t>(n) * 3 + static_cast<uint32_t>(dt));
      std::normal_distribution<float> normal;
      std::vector<uint8_t> grad(n * GradBytes(dt));
      std::vector<float> master(n), m(n), v(n);
      for (size_t i = 0; i < n; ++i) {
        const float g = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
        if (dt == GradDtype::kFp32) reinterpret_cast<float*>(grad.data())[i] = g;
        if (dt == GradDtype::kFp16) reinterpret_cast<uint16_t*>(grad.data())[i] = ToHalf(g);
        if (dt == GradDtype::kBf16) {
          uint32_t u;
          std::memcpy(&u, &g, 4);
          reinterpret_cast<uint16_t*>(grad.data())[i] = static_cast<uint16_t>(u >> 16);
        }
        master[i] = normal(rng) * 0.05f;
        m[i] = normal(rng) * 1e-3f;
        v[i] = std::fabs(normal(rng)) * 1e-6f;
      }
      const auto run = [&](KernelPath path, std::vector<float>* out, std::vector<uint16_t>* w,
                           double norms[3]) {
        out->clear();
        std::vector<float> p = master, mm = m, vv = v, acc(n, 0.25f);
        w->assign(n, 0);
        AdamWSpan span;
        span.grad = grad.data();
        span.grad_dtype = dt;
        span.master = p.data();
        span.exp_avg = mm.data();
        span.exp_avg_sq = vv.data();
        span.weights = w->data();
        span.weight_dtype = dt == GradDtype::kFp16 ? WeightDtype::kFp16 : WeightDtype::kBf16;
        span.n = n;
        norms[0] = FusedAdamW(span, h, path);
        norms[1] = GradSquaredNorm(grad.data(), dt, n, path);
        norms[2] = AccumulateGrad(acc.data(), grad.data(), dt, n, false, path);
        for (const auto* a : {&p, &mm, &vv, &acc}) out->insert(out->end(), a->begin(), a->end());
      };
      std::vector<float> want;
      std::vector<uint16_t> want_w;
      double want_norms[3];
      run(KernelPath::kPortable, &want, &want_w, want_norms);
      EXPECT_EQ(want_norms[0], want_norms[1]);
      EXPECT_EQ(want_norms[0], want_norms[2]);
      for (KernelPath path : SupportedPaths()) {
        SCOPED_TRACE(std::string(KernelPathName(path)) + " n=" + std::to_string(n) + " dtype " +
                     std::to_string(static_cast<int>(dt)));
        std::vector<float> got;
        std::vector<uint16_t> got_w;
        double norms[3];
        run(path, &got, &got_w, norms);
        for (int k = 0; k < 3; ++k) EXPECT_EQ(norms[k], want_norms[k]) << "norm " << k;
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
        EXPECT_EQ(got_w, want_w);  // no denormal weights here: AVX512_BF16 rounds them the same
      }
    }
  }
}

// The bf16 weight copy of denormal, tiny and ordinary masters, vectors mixing them included, is
// round-to-nearest-even with denormals kept on every path (AVX512_BF16's instruction alone would
// flush the denormals): the bits c10::BFloat16 and the device's cast of the fp32 masters give.
TEST(AdamWKernelTest, Bf16WeightCopyKeepsDenormalsOnEveryPath) {
  const auto rne = [](float f) {  // c10::detail::round_to_nearest_even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  };
  std::vector<float> master;
  for (uint32_t bits : {0x00000001u, 0x00008000u, 0x00018000u, 0x0007ffffu, 0x007fffffu,
                        0x80400000u, 0x807f8000u, 0x00800000u, 0x3f808000u, 0x3f818000u})
    master.push_back(std::bit_cast<float>(bits));
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> mantissa(0, 0x7fffff);
  for (int i = 0; i < 60; ++i) master.push_back(std::bit_cast<float>(mantissa(rng) | (i % 3 ? 0u : 0x80000000u)));
  for (int i = 0; i < 64; ++i) master.push_back(std::bit_cast<float>(0x3c000000u + mantissa(rng)));
  const size_t n = master.size();
  std::vector<uint16_t> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = rne(master[i]);
  // lr 0, no decay, zero gradients: the masters stay as they are, the copy is their rounding.
  const AdamWHyper h{.lr = 0.0, .weight_decay = 0.0, .step = 1};
  for (KernelPath path : SupportedPaths()) {
    SCOPED_TRACE(KernelPathName(path));
    std::vector<float> p = master, m(n, 0.0f), v(n, 0.0f), grad(n, 0.0f);
    std::vector<uint16_t> w(n, 0xffff);
    AdamWSpan span;
    span.grad = grad.data();
    span.grad_dtype = GradDtype::kFp32;
    span.master = p.data();
    span.exp_avg = m.data();
    span.exp_avg_sq = v.data();
    span.weights = w.data();
    span.weight_dtype = WeightDtype::kBf16;
    span.n = n;
    FusedAdamW(span, h, path);
    ASSERT_EQ(0, std::memcmp(p.data(), master.data(), n * 4));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(w[i], want[i]) << i << " bits " << std::bit_cast<uint32_t>(master[i]);
  }
}

// CorrectAdamW turns a speculative update (grad scale 1) into the update with clip coefficient c,
// against FusedAdamW with c from the same starting state; every path computes the same bits.
TEST(AdamWKernelTest, CorrectionReachesTheClippedUpdate) {
  constexpr size_t n = 1037;
  for (float c : {0.9f, 0.37f, 0.05f}) {
    const AdamWHyper spec{.lr = 2e-3, .weight_decay = 0.1, .step = 4, .grad_scale = 1.0f};
    AdamWHyper clipped = spec;
    clipped.grad_scale = c;
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    std::vector<float> grad(n), p0(n), m0(n), v0(n);
    for (size_t i = 0; i < n; ++i) {
      grad[i] = normal(rng) * 1e-2f;
      p0[i] = normal(rng) * 0.05f;
      m0[i] = normal(rng) * 1e-3f;
      v0[i] = std::fabs(normal(rng)) * 1e-5f;
    }
    const auto span_of = [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& v) {
      AdamWSpan s;
      s.grad = grad.data();
      s.grad_dtype = GradDtype::kFp32;
      s.master = p.data();
      s.exp_avg = m.data();
      s.exp_avg_sq = v.data();
      s.weight_dtype = WeightDtype::kNone;
      s.n = n;
      return s;
    };
    std::vector<float> wp = p0, wm = m0, wv = v0;
    FusedAdamW(span_of(wp, wm, wv), clipped, KernelPath::kPortable);
    std::vector<float> ref_p, ref_m, ref_v;
    for (KernelPath path : SupportedPaths()) {
      SCOPED_TRACE(std::string(KernelPathName(path)) + " c=" + std::to_string(c));
      std::vector<float> p = p0, m = m0, v = v0;
      FusedAdamW(span_of(p, m, v), spec, path);
      const std::vector<float> m1 = m, v1 = v;
      CorrectAdamW(span_of(p, m, v), clipped, path);
      // Each corrected quantity is a short sum of fp32 terms: within a few ulps (2^-23 relative)
      // of the largest operand: m_1 and m_c for exp_avg, v_1 and v_c for exp_avg_sq, and the
      // weight with both Adam steps (each at most ~3 lr) for the master weight.
      constexpr double kUlp = 1.0 / (1 << 23);
      const double lr = spec.lr;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(p[i] - wp[i]), 4 * kUlp * (std::fabs(wp[i]) + 6 * lr)) << i;
        // (the lerp rounds g - m_0 before scaling it by w = 1 - beta1 = 0.1)
        ASSERT_LE(std::fabs(m[i] - wm[i]),
                  2 * kUlp * (std::fabs(m1[i]) + std::fabs(wm[i]) + 0.1 * (std::fabs(grad[i]) + std::fabs(m0[i]))))
            << i;
        ASSERT_LE(std::fabs(v[i] - wv[i]), 2 * kUlp * (v1[i] + wv[i])) << i;
      }
      if (ref_p.empty()) {  // the fastest path first: every other one must give its bits
        ref_p = p, ref_m = m, ref_v = v;
      } else {
        EXPECT_EQ(p, ref_p);
        EXPECT_EQ(m, ref_m);
        EXPECT_EQ(v, ref_v);
      }
    }
  }
}

// Restores OFFLOADD_ADAMW_KERNEL (a test run may force a flavour through it).
class KernelEnv {
 public:
  KernelEnv() {
    if (const char* v = std::getenv(kKernelEnvVar)) saved_ = v;
  }
  ~KernelEnv() {
    if (saved_) {
      setenv(kKernelEnvVar, saved_->c_str(), 1);
    } else {
      unsetenv(kKernelEnvVar);
    }
  }

 private:
  std::optional<std::string> saved_;
};

TEST(KernelChoiceTest, AutoIsTheFastestUnlessTheEnvironmentForcesOne) {
  KernelEnv restore;
  unsetenv(kKernelEnvVar);
  auto c = ResolveKernelPath("auto");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->path, BestPath());
  EXPECT_EQ(c->reason, "fastest this CPU supports");
  setenv(kKernelEnvVar, "portable", 1);
  c = ResolveKernelPath("");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->path, KernelPath::kPortable);
  EXPECT_EQ(c->Describe(), "portable (OFFLOADD_ADAMW_KERNEL=portable)");
  // An explicit request wins over the environment.
  const KernelPath best = BestPath();
  c = ResolveKernelPath(KernelPathName(best));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->path, best);
  EXPECT_EQ(c->reason, "requested");
}

TEST(KernelChoiceTest, BadOrUnsupportedChoicesNameTheSettingAndTheMissingInstructions) {
  KernelEnv restore;
  setenv(kKernelEnvVar, "sse9", 1);
  auto c = ResolveKernelPath("auto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("OFFLOADD_ADAMW_KERNEL=sse9: unknown kernel path"),
            std::string::npos)
      << c.status().message();
  unsetenv(kKernelEnvVar);
  for (KernelPath p :
       {KernelPath::kAvx2, KernelPath::kAvx512, KernelPath::kAvx512Bf16, KernelPath::kPortable}) {
    SCOPED_TRACE(std::string(KernelPathName(p)));
    const std::string missing = MissingInstructionSets(p);
    EXPECT_EQ(missing.empty(), PathSupported(p));
    auto r = ResolveKernelPath(KernelPathName(p));
    EXPECT_EQ(r.ok(), PathSupported(p));
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
      EXPECT_NE(r.status().message().find("lacks: " + missing), std::string::npos)
          << r.status().message();
    }
  }
  EXPECT_TRUE(MissingInstructionSets(KernelPath::kPortable).empty());
}

}  // namespace
}  // namespace offloadd::workers
