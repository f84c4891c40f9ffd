// The compact optimizer modes (workers/adamw_compact.h): every flavour this CPU supports against
// the portable one bit for bit, the portable one against a float64 reference of the same
// quantised algorithm within the quantisation step, and the two findings that chose the formats
// (round-to-nearest bf16 states freeze v; an uncompensated bf16 master drops small updates).
#include "workers/adamw_compact.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "workers/adamw_kernel_impl.h"

namespace offloadd::workers {
namespace {

using internal::Bf16ToFloat;
using internal::FloatToBf16;

constexpr size_t kN = 1000;  // three whole int8 blocks and a partial one

std::vector<OptimizerMode> AllModes() {
  std::vector<OptimizerMode> out;
  for (StateDtype s : {StateDtype::kFp32, StateDtype::kBf16, StateDtype::kInt8}) {
    for (MasterDtype m : {MasterDtype::kFp32, MasterDtype::kBf16}) out.push_back({s, m});
  }
  return out;
}

// One tensor's optimizer state in a mode's formats.
struct Buffers {
  OptimizerMode mode;
  size_t n = 0;
  std::vector<float> master32, m32, v32, m_scale, v_scale;
  std::vector<uint16_t> hi, lo, m16, v16, weights;
  std::vector<int8_t> m8;
  std::vector<uint8_t> v8;

  // Encodes fp32 values (round to nearest; int8 with each block's scale).
  Buffers(OptimizerMode md, const std::vector<float>& p, const std::vector<float>& m,
          const std::vector<float>& v)
      : mode(md), n(p.size()) {
    weights.assign(n, 0);
    if (mode.master == MasterDtype::kFp32) {
      master32 = p;
    } else {
      for (float x : p) {
        hi.push_back(FloatToBf16(x));
        lo.push_back(FloatToBf16(x - Bf16ToFloat(hi.back())));
      }
    }
    switch (mode.state) {
      case StateDtype::kFp32:
        m32 = m;
        v32 = v;
        break;
      case StateDtype::kBf16:
        for (size_t i = 0; i < n; ++i) {
          m16.push_back(FloatToBf16(m[i]));
          v16.push_back(FloatToBf16(v[i]));
        }
        break;
      case StateDtype::kInt8:
        for (size_t b0 = 0; b0 < n; b0 += kInt8BlockSize) {
          const size_t e = std::min(n, b0 + kInt8BlockSize);
          float am = 0, av = 0;
          for (size_t i = b0; i < e; ++i) {
            am = std::max(am, std::fabs(m[i]));
            av = std::max(av, std::sqrt(v[i]));
          }
          m_scale.push_back(am);
          v_scale.push_back(av);
          for (size_t i = b0; i < e; ++i) {
            m8.push_back(static_cast<int8_t>(am > 0 ? std::nearbyint(m[i] / am * 127) : 0));
            v8.push_back(
                static_cast<uint8_t>(av > 0 ? std::nearbyint(std::sqrt(v[i]) / av * 255) : 0));
          }
        }
        break;
    }
  }

  CompactSpan Span(const void* grad, GradDtype gd) {
    CompactSpan s;
    s.grad = grad;
    s.grad_dtype = gd;
    s.master = mode.master == MasterDtype::kFp32 ? static_cast<void*>(master32.data()) : hi.data();
    s.master_comp = lo.data();
    switch (mode.state) {
      case StateDtype::kFp32:
        s.exp_avg = m32.data();
        s.exp_avg_sq = v32.data();
        break;
      case StateDtype::kBf16:
        s.exp_avg = m16.data();
        s.exp_avg_sq = v16.data();
        break;
      case StateDtype::kInt8:
        s.exp_avg = m8.data();
        s.exp_avg_sq = v8.data();
        break;
    }
    s.exp_avg_scale = m_scale.data();
    s.exp_avg_sq_scale = v_scale.data();
    s.weights = weights.data();
    s.weight_dtype = WeightDtype::kBf16;
    s.n = n;
    s.seed = 1234;
    return s;
  }

  // The stored values, decoded exactly (in double).
  double P(size_t i) const {
    return mode.master == MasterDtype::kFp32 ? master32[i]
                                             : double{Bf16ToFloat(hi[i])} + Bf16ToFloat(lo[i]);
  }
  double M(size_t i) const {
    switch (mode.state) {
      case StateDtype::kFp32:
        return m32[i];
      case StateDtype::kBf16:
        return Bf16ToFloat(m16[i]);
      case StateDtype::kInt8:
        break;
    }
    return m8[i] * double{m_scale[i / kInt8BlockSize]} / 127;
  }
  double SqrtV(size_t i) const {
    switch (mode.state) {
      case StateDtype::kFp32:
        return std::sqrt(double{v32[i]});
      case StateDtype::kBf16:
        return std::sqrt(double{Bf16ToFloat(v16[i])});
      case StateDtype::kInt8:
        break;
    }
    return v8[i] * double{v_scale[i / kInt8BlockSize]} / 255;
  }

  bool operator==(const Buffers& o) const {
    return SameBits(master32, o.master32) && hi == o.hi && lo == o.lo && SameBits(m32, o.m32) &&
           SameBits(v32, o.v32) && m16 == o.m16 && v16 == o.v16 && m8 == o.m8 && v8 == o.v8 &&
           weights == o.weights && SameBits(m_scale, o.m_scale) && SameBits(v_scale, o.v_scale);
  }
  // Bitwise (a NaN equals itself); empty vectors have no data() to compare.
  static bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  }
};

struct Inputs {
  std::vector<float> p, m, v, grad32;
  std::vector<uint16_t> grad16;
};

Inputs MakeInputs(uint32_t seed, size_t n = kN) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Inputs in;
  for (size_t i = 0; i < n; ++i) {
    // Magnitudes spread over several octaves within each block, as real gradients are.
    const float mag = std::ldexp(1.0f, static_cast<int>(rng() % 8) - 12);
    in.p.push_back(normal(rng) * 0.05f);
    in.m.push_back(normal(rng) * mag * 0.3f);
    in.v.push_back(mag * mag * (0.5f + std::fabs(normal(rng))));
    const float g = normal(rng) * mag;
    in.grad16.push_back(FloatToBf16(g));
    in.grad32.push_back(g);
  }
  return in;
}

AdamWHyper Hyper(uint64_t step) {
  AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.01;
  h.step = step;
  h.grad_scale = 0.75f;
  return h;
}

TEST(AdamWCompactTest, NamesAndBytesPerParameter) {
  EXPECT_EQ(OptimizerMode{}.Describe(), "exact (fp32 master, fp32 states)");
  EXPECT_EQ((OptimizerMode{StateDtype::kInt8, MasterDtype::kBf16}.Describe()),
            "not exact: bf16 master, int8 states");
  EXPECT_DOUBLE_EQ(StateBytesPerParam({}), 12);
  EXPECT_DOUBLE_EQ(StateBytesPerParam({StateDtype::kBf16, MasterDtype::kFp32}), 8);
  EXPECT_DOUBLE_EQ(StateBytesPerParam({StateDtype::kInt8, MasterDtype::kBf16}), 6 + 8.0 / 256);
  EXPECT_DOUBLE_EQ(StepTrafficBytesPerParam({}, GradDtype::kBf16, WeightDtype::kBf16), 28);
  EXPECT_DOUBLE_EQ(StepTrafficBytesPerParam({StateDtype::kInt8, MasterDtype::kFp32},
                                            GradDtype::kBf16, WeightDtype::kBf16),
                   16 + 16.0 / 256);
  auto mode = ParseOptimizerMode("int8", "");
  ASSERT_TRUE(mode.ok());
  EXPECT_EQ(*mode, (OptimizerMode{StateDtype::kInt8, MasterDtype::kFp32}));
  auto bad = ParseOptimizerMode("int4", "fp32");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("optimizer.state_dtype: unknown value 'int4'"),
            std::string::npos);
  bad = ParseOptimizerMode("fp32", "fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("optimizer.master_dtype: unknown value 'fp16'"),
            std::string::npos);
}

TEST(AdamWCompactTest, SpansMissingWhatTheModeNeedsAreRefused) {
  const Inputs in = MakeInputs(1);
  Buffers b({StateDtype::kInt8, MasterDtype::kBf16}, in.p, in.m, in.v);
  CompactSpan s = b.Span(in.grad16.data(), GradDtype::kBf16);
  s.first_index = 100;
  auto r = CompactAdamW(s, b.mode, Hyper(1), KernelPath::kPortable);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(
      r.status().message().find("int8 states start at a block boundary (256), not at element 100"),
      std::string::npos)
      << r.status().ToString();
  s = b.Span(in.grad16.data(), GradDtype::kBf16);
  s.master_comp = nullptr;
  r = CompactAdamW(s, b.mode, Hyper(1), KernelPath::kPortable);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no master compensation buffer"), std::string::npos);
  s = b.Span(in.grad16.data(), GradDtype::kBf16);
  s.exp_avg_sq_scale = nullptr;
  EXPECT_FALSE(CompactAdamW(s, b.mode, Hyper(1), KernelPath::kPortable).ok());
}

// fp32 master and states through the compact path are exact AdamW: FusedAdamW's bits.
TEST(AdamWCompactTest, ExactModeIsFusedAdamW) {
  const Inputs in = MakeInputs(2);
  Buffers b({}, in.p, in.m, in.v);
  ASSERT_TRUE(CompactAdamW(b.Span(in.grad16.data(), GradDtype::kBf16), b.mode, Hyper(3),
                           KernelPath::kPortable)
                  .ok());
  std::vector<float> p = in.p, m = in.m, v = in.v;
  std::vector<uint16_t> w(kN);
  AdamWSpan e{in.grad16.data(), GradDtype::kBf16, p.data(),           m.data(),
              v.data(),         w.data(),         WeightDtype::kBf16, kN};
  FusedAdamW(e, Hyper(3), KernelPath::kPortable);
  EXPECT_EQ(b.master32, p);
  EXPECT_EQ(b.m32, m);
  EXPECT_EQ(b.v32, v);
  EXPECT_EQ(b.weights, w);
}

// Every flavour gives the portable flavour's bits in every mode, over several steps (the int8
// scales and the stochastic rounding included), with bf16 and fp32 gradients.
TEST(AdamWCompactTest, EveryFlavourMatchesPortableBitForBit) {
  const Inputs in = MakeInputs(3);
  for (const OptimizerMode mode : AllModes()) {
    for (const GradDtype gd : {GradDtype::kBf16, GradDtype::kFp32}) {
      const void* grad =
          gd == GradDtype::kBf16 ? static_cast<const void*>(in.grad16.data()) : in.grad32.data();
      Buffers want(mode, in.p, in.m, in.v);
      std::vector<double> want_norm;
      for (uint64_t step = 1; step <= 3; ++step) {
        auto r = CompactAdamW(want.Span(grad, gd), mode, Hyper(step), KernelPath::kPortable);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        want_norm.push_back(*r);
      }
      for (const KernelPath path : SupportedPaths()) {
        if (path == KernelPath::kPortable) continue;
        Buffers got(mode, in.p, in.m, in.v);
        for (uint64_t step = 1; step <= 3; ++step) {
          auto r = CompactAdamW(got.Span(grad, gd), mode, Hyper(step), path);
          ASSERT_TRUE(r.ok()) << r.status().ToString();
          EXPECT_EQ(*r, want_norm[step - 1]) << mode.Describe() << " " << KernelPathName(path);
        }
        EXPECT_TRUE(got == want) << mode.Describe() << " on " << KernelPathName(path)
                                 << " differs from portable (grad dtype " << static_cast<int>(gd)
                                 << ")";
      }
    }
  }
}

// The vector flavours' edges against portable, bit for bit: spans ending anywhere in a 16-lane
// chunk or a block (AVX2 pads its last partial chunk, AVX-512 masks it), fp16 and fp32 gradients,
// fp16 and absent weight copies, stochastic-rounding indices wrapping at 2^32, and values at the
// ends of the formats: all-zero blocks (scale 0), denormal states and a block whose maximum is
// denormal (127 / absmax is infinite), -0.0, and gradients large enough to saturate the int8
// codes.
TEST(AdamWCompactTest, EveryFlavourMatchesPortableAtTailsAndEdgeValues) {
  for (const size_t n : {size_t{1}, size_t{7}, size_t{9}, size_t{16}, size_t{17}, size_t{255},
                         size_t{257}, size_t{520}}) {
    Inputs in = MakeInputs(static_cast<uint32_t>(20 + n), n);
    for (size_t i = 0; i < n; ++i) {
      if (i % 5 == 1) in.m[i] = -0.0f;
      if (i % 7 == 2) in.v[i] = 1e-41f, in.m[i] = 1e-42f;  // denormal
      if (i % 11 == 3) in.grad32[i] = 3e4f, in.grad16[i] = FloatToBf16(3e4f);
    }
    if (n > 256) {  // an all-zero second block but for its gradients
      for (size_t i = 256; i < n; ++i) in.m[i] = 0, in.v[i] = 0;
    }
    for (size_t i = 512; i < n; ++i) {  // a block whose new m is all denormal: 127 / absmax = inf
      in.grad32[i] = 1e-40f * static_cast<float>(i % 3 + 1);
      in.grad16[i] = FloatToBf16(in.grad32[i]);
    }
    std::vector<uint16_t> grad_fp16;
    for (const float g : in.grad32) grad_fp16.push_back(internal::FloatToFp16(g));
    for (const OptimizerMode mode : AllModes()) {
      for (const GradDtype gd : {GradDtype::kFp16, GradDtype::kFp32}) {
        for (const WeightDtype wd : {WeightDtype::kFp16, WeightDtype::kNone}) {
          const void* grad = gd == GradDtype::kFp16 ? static_cast<const void*>(grad_fp16.data())
                                                    : in.grad32.data();
          const auto step = [&](Buffers& b, uint64_t k, KernelPath path) {
            CompactSpan s = b.Span(grad, gd);
            s.weight_dtype = wd;
            if (wd == WeightDtype::kNone) s.weights = nullptr;
            s.first_index = (uint64_t{1} << 32) - 256;  // block-aligned, wraps in the block
            auto r = CompactAdamW(s, mode, Hyper(k), path);
            EXPECT_TRUE(r.ok()) << r.status().ToString();
            return r.ok() ? *r : -1.0;
          };
          Buffers want(mode, in.p, in.m, in.v);
          const double norm1 = step(want, 1, KernelPath::kPortable);
          const double norm2 = step(want, 2, KernelPath::kPortable);
          for (const KernelPath path : SupportedPaths()) {
            Buffers got(mode, in.p, in.m, in.v);
            EXPECT_EQ(step(got, 1, path), norm1);
            EXPECT_EQ(step(got, 2, path), norm2);
            EXPECT_TRUE(got == want) << mode.Describe() << " on " << KernelPathName(path) << ", n "
                                     << n << ", grad dtype " << static_cast<int>(gd)
                                     << ", weight dtype " << static_cast<int>(wd);
          }
        }
      }
    }
  }
}

// A NaN or inf in a block's state (a diverged run, or arbitrary bytes in the arena: the worker
// protocol fuzzer's find) has no int8 code; converting it was undefined behaviour (UBSan: float
// cast overflow). The block decodes non-finite afterwards, as an fp32 state would stay, and the
// other blocks are untouched; every flavour gives the same bits.
TEST(AdamWCompactTest, NonFiniteStatesStayNonFiniteWithoutUndefinedConversions) {
  const OptimizerMode int8{StateDtype::kInt8, MasterDtype::kFp32};
  const Inputs in = MakeInputs(7);
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Buffers start(int8, in.p, in.m, in.v);
    start.m_scale[0] = bad;  // the first block's m and v decode non-finite
    start.v_scale[0] = bad;
    Buffers want = start;
    ASSERT_TRUE(CompactAdamW(want.Span(in.grad32.data(), GradDtype::kFp32), int8, Hyper(1),
                             KernelPath::kPortable)
                    .ok());
    EXPECT_FALSE(std::isfinite(want.M(3))) << bad;
    EXPECT_FALSE(std::isfinite(want.SqrtV(5))) << bad;
    EXPECT_TRUE(std::isfinite(want.M(kInt8BlockSize + 1)));
    EXPECT_TRUE(std::isfinite(want.SqrtV(kInt8BlockSize + 1)));
    for (const KernelPath path : SupportedPaths()) {
      Buffers got = start;
      ASSERT_TRUE(
          CompactAdamW(got.Span(in.grad32.data(), GradDtype::kFp32), int8, Hyper(1), path).ok());
      // Bit for bit, but for the sign of the NaN the 16-bit weight copy holds: avx512bf16's
      // vcvtneps2bf16 keeps it, the portable conversion (torch's) writes 0x7fc0.
      auto bf16_nan = [](uint16_t w) { return (w & 0x7f80) == 0x7f80 && (w & 0x7f) != 0; };
      Buffers w = want;
      for (size_t i = 0; i < kN; ++i) {
        if (!bf16_nan(w.weights[i])) continue;
        got.weights[i] = bf16_nan(got.weights[i]) ? 1 : 0;
        w.weights[i] = 1;
      }
      EXPECT_TRUE(got == w) << KernelPathName(path) << " with " << bad;
    }
  }
}

// One step against the same algorithm in float64 from the same stored state. Bounds, from the
// arithmetic: fp32's AdamW differs from float64's by a few roundings of 2^-24 (2^-21 of the
// master and of the update, 2^-21 of each state); then each format's own rounding: bf16 states
// (stochastic) less than one bf16 ulp, 2^-7 of the value; int8 half a quantisation step (the
// block's scale / 127 for m, / 255 for sqrt(v)), a whole one where sqrt(v) is below one step
// (v > 0 keeps q >= 1); the bf16 master + compensation about 2^-17 of the master. fp32's roundings
// are relative to the terms, which may cancel.
TEST(AdamWCompactTest, MatchesAFloat64ReferenceWithinTheQuantisationStep) {
  const Inputs in = MakeInputs(4);
  const AdamWHyper h = Hyper(5);
  for (const OptimizerMode mode : AllModes()) {
    Buffers b(mode, in.p, in.m, in.v);
    std::vector<double> p0(kN), m0(kN), v0(kN);
    for (size_t i = 0; i < kN; ++i) {
      p0[i] = b.P(i);
      m0[i] = b.M(i);
      v0[i] = b.SqrtV(i) * b.SqrtV(i);
    }
    ASSERT_TRUE(
        CompactAdamW(b.Span(in.grad16.data(), GradDtype::kBf16), mode, h, KernelPath::kPortable)
            .ok());
    const double bc1 = 1 - std::pow(h.beta1, 5.0), bc2 = 1 - std::pow(h.beta2, 5.0);
    std::vector<double> p(kN), m(kN), sv(kN), u(kN), g(kN);
    for (size_t i = 0; i < kN; ++i) {
      g[i] = double{Bf16ToFloat(in.grad16[i])} * h.grad_scale;
      m[i] = h.beta1 * m0[i] + (1 - h.beta1) * g[i];
      const double v = h.beta2 * v0[i] + (1 - h.beta2) * g[i] * g[i];
      sv[i] = std::sqrt(v);
      u[i] = h.lr / bc1 * m[i] / (sv[i] / std::sqrt(bc2) + h.eps);
      p[i] = p0[i] * (1 - h.lr * h.weight_decay) - u[i];
    }
    const auto block_max = [&](const std::vector<double>& x, size_t i) {
      const size_t b0 = i / kInt8BlockSize * kInt8BlockSize;
      double most = 0;
      for (size_t j = b0; j < std::min(kN, b0 + kInt8BlockSize); ++j)
        most = std::max(most, std::fabs(x[j]));
      return most;
    };
    constexpr double kFp32 = 0x1p-21;
    for (size_t i = 0; i < kN; ++i) {
      // The roundings are relative to the terms, which may cancel: p0 and u, m0 and g.
      const double p_tol = kFp32 * (std::fabs(p0[i]) + std::fabs(u[i])) +
                           (mode.master == MasterDtype::kBf16 ? 0x1p-17 * std::fabs(p[i]) : 0);
      ASSERT_LE(std::fabs(b.P(i) - p[i]), p_tol) << mode.Describe() << " master " << i;
      double m_tol = kFp32 * (std::fabs(m0[i]) + std::fabs(g[i])), sv_tol = kFp32 * sv[i];
      if (mode.state == StateDtype::kBf16) {
        m_tol += 0x1p-7 * std::fabs(m[i]);
        sv_tol += 0x1p-8 * sv[i];  // v within 2^-7: sqrt(v) within 2^-8
      } else if (mode.state == StateDtype::kInt8) {
        const double m_step = block_max(m, i) / 127, sv_step = block_max(sv, i) / 255;
        m_tol += 0.5 * m_step + kFp32 * block_max(m, i);
        sv_tol += (sv[i] < sv_step ? 1.0 : 0.5) * sv_step + kFp32 * block_max(sv, i);
      }
      ASSERT_LE(std::fabs(b.M(i) - m[i]), m_tol) << mode.Describe() << " exp_avg " << i;
      ASSERT_LE(std::fabs(b.SqrtV(i) - sv[i]), sv_tol)
          << mode.Describe() << " sqrt(exp_avg_sq) " << i;
      if (mode.state == StateDtype::kInt8 && sv[i] > 0) {
        ASSERT_GT(b.SqrtV(i), 0) << "a nonzero v decodes to zero at " << i;
      }
    }
  }
}

// Finding: bf16 states rounded to nearest never decay, since beta2's 0.1% per step is below half
// a bf16 ulp (2^-9); stochastic rounding decays them as fp32 does, on average. Zero gradients:
// v_k = beta2^k v_0 exactly in fp32. Bound: each element's rounding noise has standard deviation
// below one ulp (2^-8 of 0.75); the mean of 4096 independent elements is within about 1e-3 of it
// even summed over 300 steps; 1% is ten times that.
TEST(AdamWCompactTest, StochasticRoundingLetsBf16StatesDecay) {
  constexpr size_t n = 4096;
  const std::vector<float> p(n, 0.5f), m(n, 0.0f), v(n, 1.0f);
  Buffers b({StateDtype::kBf16, MasterDtype::kFp32}, p, m, v);
  const std::vector<uint16_t> zero(n, 0);
  AdamWHyper h;
  h.weight_decay = 0;
  constexpr int kSteps = 300;
  for (int k = 1; k <= kSteps; ++k) {
    h.step = k;
    ASSERT_TRUE(CompactAdamW(b.Span(zero.data(), GradDtype::kBf16), b.mode, h, BestPath()).ok());
  }
  double mean = 0;
  for (size_t i = 0; i < n; ++i) mean += b.SqrtV(i) * b.SqrtV(i) / n;
  const double want = std::pow(0.999, kSteps);  // 0.741
  EXPECT_NEAR(mean, want, 0.01 * want);
  // Round to nearest would have kept 1.0: 0.999 rounds back to it.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(0.999f)), 1.0f);
}

// Finding: a bf16 master alone drops every update below half its ulp (1e-4 against 2^-9 at 1.0:
// 200 steps would leave it at 1.0, 0.02 from the fp32 master). With the compensation buffer only
// the compensation's own rounding is lost, at most half its ulp per step: 2^-18 below 1 (the
// compensation is below 2^-9 there), so 200 steps stay within 200 x 2^-18 = 7.6e-4 of fp32.
TEST(AdamWCompactTest, CompensatedBf16MasterKeepsUpdatesBelowHalfAnUlp) {
  constexpr size_t n = 512;
  const std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
  Buffers exact({}, p, m, v), kahan({StateDtype::kFp32, MasterDtype::kBf16}, p, m, v);
  std::vector<uint16_t> grad(n, FloatToBf16(1e-3f));
  AdamWHyper h;
  h.lr = 1e-4;
  h.weight_decay = 0;
  for (int k = 1; k <= 200; ++k) {
    h.step = k;
    ASSERT_TRUE(
        CompactAdamW(exact.Span(grad.data(), GradDtype::kBf16), exact.mode, h, BestPath()).ok());
    ASSERT_TRUE(
        CompactAdamW(kahan.Span(grad.data(), GradDtype::kBf16), kahan.mode, h, BestPath()).ok());
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_LT(exact.P(i), 0.985) << "200 steps of about 1e-4 each";
    ASSERT_NEAR(kahan.P(i), exact.P(i), 200 * 0x1p-18);
    ASSERT_EQ(kahan.weights[i], kahan.hi[i]) << "the bf16 master is the weight copy";
  }
}

// EncodeBf16Master / DecodeBf16Master (what the trainer initialises, checkpoints and exports a
// bf16 master with) are the kernel's own arithmetic: a step with lr 0 decodes the master, leaves
// the value alone and encodes it again, on every flavour, to the helpers' bits. Decoding is exact
// (the compensation is below half the master's ulp); encoding an arbitrary fp32 value keeps
// about 17 of its bits, so fp32 values do not always give back the pair they came from.
TEST(AdamWCompactTest, TheBf16MasterHelpersAreTheKernelsArithmetic) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-20, 10);
  std::vector<float> p(kN), zero(kN, 0.0f);
  for (float& x : p) x = std::ldexp(mant(rng), exp(rng));
  std::vector<uint16_t> hi(kN), lo(kN);
  EncodeBf16Master(p.data(), kN, hi.data(), lo.data());
  const OptimizerMode mode = {StateDtype::kFp32, MasterDtype::kBf16};
  const Buffers test_encoding(mode, p, zero, zero);
  ASSERT_EQ(hi, test_encoding.hi);
  ASSERT_EQ(lo, test_encoding.lo);
  std::vector<float> decoded(kN);
  DecodeBf16Master(hi.data(), lo.data(), kN, decoded.data());
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(decoded[i], static_cast<float>(static_cast<double>(Bf16ToFloat(hi[i])) +
                                             static_cast<double>(Bf16ToFloat(lo[i]))))
        << "the sum is exact in fp32: " << i;
    ASSERT_LE(std::fabs(decoded[i] - p[i]), std::ldexp(std::fabs(p[i]), -16)) << i;
  }
  std::vector<uint16_t> again_hi(kN), again_lo(kN);
  EncodeBf16Master(decoded.data(), kN, again_hi.data(), again_lo.data());
  std::vector<uint16_t> grad(kN, FloatToBf16(1e-3f));
  AdamWHyper h;
  h.lr = 0;
  h.weight_decay = 0;
  h.step = 1;
  for (const KernelPath path : SupportedPaths()) {
    Buffers b(mode, p, zero, zero);
    ASSERT_TRUE(CompactAdamW(b.Span(grad.data(), GradDtype::kBf16), mode, h, path).ok());
    EXPECT_EQ(b.hi, again_hi) << KernelPathName(path);
    EXPECT_EQ(b.lo, again_lo) << KernelPathName(path);
  }
}

}  // namespace
}  // namespace offloadd::workers
