// The fused RMSNorm (each RmsScale: Llama, OLMo 2, Gemma's 1 + w; long rows and per-head q/k
// rows) and SwiGLU/GeGLU CUDA kernels (engine/cuda/) against the ATen op sequences they replace
// (engine/ops.cc with the flavour forced to "aten"), on the same inputs. GPU cases skip without
// CUDA; the flavour checks run everywhere.
//
// Bounds, from the arithmetic: both sides round every intermediate the same way and differ only
// in the order of fp32 sums (sum of squares, the dot product mean(dn * n), dW over rows), by a few
// fp32 ulps of the sum of the terms' magnitudes (both trees are under ~100 additions deep, so
// 1e-5 of that sum covers them). A 16-bit result can then differ only where an fp32 value lands
// that close to a rounding boundary, so:
//   - in a small fraction of elements (asserted <= 1%; a missing or extra rounding step makes
//     tens of percent differ);
//   - by 2 ulps at most (one flipped rounding of n = x * rstd, scaled by w, moves y by one ulp of
//     n, which is up to two ulps of y where y sits lower in its binade): |d| <= 2 eps |ref|,
//     eps = 2^-7 (bf16) or 2^-10 (fp16), the ulp of 1;
//   - plus, for dx = rstd * (dn - n * dot), the dot product's fp32 difference times rstd * |n|:
//     where dn cancels against n * dot, that absolute change is many ulps of a small dx.
// fp32 results: 1e-5 relative to the tensor's largest magnitude plus the same dot-product term.
// The fp32-scale flavours (OLMo 2, Gemma) round once where Llama's rounds twice; the same
// argument holds with fewer boundaries to land near.
// SwiGLU and GeGLU have no sums: expected equal to the bit, asserted within the same bounds.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "engine/ops.h"

namespace offloadd::engine {
namespace {

struct Flavour {
  explicit Flavour(const char* mode) { ops::SetFusedKernels(mode); }
  ~Flavour() { ops::SetFusedKernels("auto"); }
};

double UlpOfOne(at::ScalarType t) {
  return t == at::kBFloat16 ? 0x1p-7 : t == at::kHalf ? 0x1p-10 : 0x1p-23;
}

// |fused - ref| <= 2 ulp(ref) + slack elementwise (slack: fp32, broadcastable; may be undefined)
// and, for 16-bit results, at most 1% of the elements differ at all.
void ExpectClose(const char* what, const at::Tensor& fused, const at::Tensor& ref,
                 const at::Tensor& slack = at::Tensor()) {
  ASSERT_EQ(fused.sizes(), ref.sizes()) << what;
  ASSERT_EQ(fused.scalar_type(), ref.scalar_type()) << what;
  at::Tensor f = fused.to(at::kFloat), r = ref.to(at::kFloat);
  at::Tensor bound = 2 * UlpOfOne(ref.scalar_type()) * r.abs();
  if (ref.scalar_type() == at::kFloat) bound = bound + 1e-5 * r.abs().max();
  if (slack.defined()) bound = bound + slack;
  at::Tensor err = (f - r).abs();
  const int64_t over = err.gt(bound).sum().item<int64_t>();
  const double differ = err.gt(0).to(at::kDouble).mean().item<double>();
  EXPECT_EQ(over, 0) << what << ": " << over << " elements beyond the bound, worst excess "
                     << (err - bound).max().item<double>();
  // In fp32 every different summation order shows in the last bits; only 16-bit results say
  // whether the roundings match.
  if (ref.scalar_type() != at::kFloat) {
    EXPECT_LE(differ, 0.01) << what;
  }
  std::printf("  %-8s %-8s %.4f%% of elements differ, max |d| %.3g\n", what,
              c10::toString(ref.scalar_type()), 100 * differ, err.max().item<double>());
}

class FusedKernelsGpu : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t>> {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "needs CUDA";
  }
};

TEST_P(FusedKernelsGpu, RmsNormMatchesTheAtenOpSequence) {
  const auto [dtype, rows, h] = GetParam();
  for (const ops::RmsScale scale : {ops::RmsScale::kCastThenScale, ops::RmsScale::kScaleThenCast,
                                    ops::RmsScale::kOneOffset}) {
    SCOPED_TRACE("RmsScale " + std::to_string(static_cast<int>(scale)));
    std::printf(" RmsScale %d\n", static_cast<int>(scale));
    at::manual_seed(7);
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    at::Tensor x = at::randn({rows, h}, opts) * 3;
    at::Tensor w = scale == ops::RmsScale::kOneOffset ? at::randn({h}, opts) * 0.3
                                                      : at::randn({h}, opts) * 0.5 + 1;
    at::Tensor dy = at::randn({rows, h}, opts), res = at::randn({rows, h}, opts);
    at::Tensor y[2], rstd[2], yr[2], dx[2], dxr[2], dw[2], dwr[2];
    for (int f = 0; f < 2; ++f) {
      const Flavour flavour(f == 0 ? "fused" : "aten");
      y[f] = ops::RmsNorm(x, w, 1e-5, &rstd[f], scale);
    }
    for (int f = 0; f < 2; ++f) {  // both from the ATen rstd, so only the kernels differ
      const Flavour flavour(f == 0 ? "fused" : "aten");
      yr[f] = ops::RmsNormFromRstd(x, w, rstd[1], scale);
      dx[f] = ops::RmsNormBackward(dy, x, w, rstd[1], &dw[f], at::Tensor(), scale);
      dxr[f] = ops::RmsNormBackward(dy, x, w, rstd[1], &dwr[f], res, scale);
    }
    EXPECT_LE((rstd[0] - rstd[1]).abs().max().item<double>(),
              4e-6 * rstd[1].abs().max().item<double>());
    ExpectClose("y", y[0], y[1]);
    ExpectClose("y(rstd)", yr[0], yr[1]);  // no sum involved: expected equal to the bit
    // The dot product's share: rstd * |n| * 1e-5 * mean |dn * n| per row.
    at::Tensor n = x.to(at::kFloat) * rstd[1];
    at::Tensor dn = scale == ops::RmsScale::kCastThenScale
                        ? (dy * w).to(at::kFloat)
                        : dy.to(at::kFloat) * (w.to(at::kFloat) +
                                               (scale == ops::RmsScale::kOneOffset ? 1.0 : 0.0));
    at::Tensor slack = rstd[1] * n.abs() * 1e-5 * (dn * n).abs().mean(-1, /*keepdim=*/true);
    ExpectClose("dx", dx[0], dx[1], slack);
    // The sum rounds dx first: a flipped rounding of dx moves it by up to 2 ulps of dx too.
    ExpectClose("dx+res", dxr[0], dxr[1],
                slack + 2 * UlpOfOne(dtype) * dx[1].to(at::kFloat).abs());
    ExpectClose("dw", dw[0], dw[1]);
    ExpectClose("dw(res)", dwr[0], dw[0]);  // the residual does not change dW
  }
}

// A gated MLP's fused kernels against its ATen op sequence: forward, and the backward's dg, du
// and rebuilt product.
template <typename Forward, typename Backward>
void ExpectGluMatches(const FusedKernelsGpu::ParamType& param, uint64_t seed, Forward forward,
                      Backward backward) {
  const auto [dtype, rows, h] = param;
  at::manual_seed(seed);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  at::Tensor g = at::randn({rows, h}, opts) * 4, u = at::randn({rows, h}, opts);
  at::Tensor da = at::randn({rows, h}, opts);
  at::Tensor a[2], dg[2], du[2], a2[2];
  for (int f = 0; f < 2; ++f) {
    const Flavour flavour(f == 0 ? "fused" : "aten");
    a[f] = forward(g, u);
    backward(da, g, u, &dg[f], &du[f], &a2[f]);
  }
  ExpectClose("a", a[0], a[1]);
  ExpectClose("a(bwd)", a2[0], a[1]);
  ExpectClose("dg", dg[0], dg[1]);
  ExpectClose("du", du[0], du[1]);
}

TEST_P(FusedKernelsGpu, SwiGluMatchesTheAtenOpSequence) {
  ExpectGluMatches(GetParam(), 8, ops::SwiGlu, ops::SwiGluBackward);
}

TEST_P(FusedKernelsGpu, GeGluMatchesTheAtenOpSequence) {
  ExpectGluMatches(GetParam(), 9, ops::GeGluTanh, ops::GeGluTanhBackward);
}

// Per-head q/k norm (Qwen3, Gemma 3): x [B, T, H, head_dim] normalised over head_dim with one
// weight [head_dim], as the attention part calls it before the head transpose; rows of 128 and
// 256 run 16 or 32 threads per row, several rows per block.
TEST(FusedKernelsGpuQkNorm, PerHeadRowsMatchTheAtenOpSequence) {
  if (!at::hasCUDA()) GTEST_SKIP() << "needs CUDA";
  for (const int64_t d : {int64_t{128}, int64_t{256}}) {
    for (const ops::RmsScale scale : {ops::RmsScale::kCastThenScale, ops::RmsScale::kOneOffset}) {
      SCOPED_TRACE("head_dim " + std::to_string(d));
      at::manual_seed(10);
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
      at::Tensor x = at::randn({2, 300, 8, d}, opts) * 2, w = at::randn({d}, opts) * 0.3 + 1;
      at::Tensor dy = at::randn({2, 300, 8, d}, opts);
      at::Tensor y[2], rstd[2], dx[2], dw[2];
      for (int f = 0; f < 2; ++f) {
        const Flavour flavour(f == 0 ? "fused" : "aten");
        y[f] = ops::RmsNorm(x, w, 1e-6, &rstd[f], scale);
      }
      for (int f = 0; f < 2; ++f) {  // both from the ATen rstd
        const Flavour flavour(f == 0 ? "fused" : "aten");
        dx[f] = ops::RmsNormBackward(dy, x, w, rstd[1], &dw[f], at::Tensor(), scale);
      }
      EXPECT_EQ(rstd[0].sizes(), rstd[1].sizes());
      ExpectClose("qk y", y[0], y[1]);
      at::Tensor n = x.to(at::kFloat) * rstd[1];
      at::Tensor dn = scale == ops::RmsScale::kCastThenScale
                          ? (dy * w).to(at::kFloat)
                          : dy.to(at::kFloat) * (w.to(at::kFloat) + 1.0);
      ExpectClose("qk dx", dx[0], dx[1],
                  rstd[1] * n.abs() * 1e-5 * (dn * n).abs().mean(-1, /*keepdim=*/true));
      ExpectClose("qk dw", dw[0], dw[1]);
    }
  }
}

// (dtype, rows, hidden): the vectorised path (h % 8 == 0), several rows per backward block
// (rows > 8192), an odd hidden size (scalar path) and the largest hidden size (dW partials above
// 48 KiB of shared memory); short rows (q/k norm over head_dim) on 16 lanes (h = 40, 64, 128 in
// 16-bit: up to one pack per lane) and 32 lanes (256, 1024 in 16-bit, 128 in fp32).
INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedKernelsGpu,
    ::testing::Values(std::make_tuple(at::kBFloat16, int64_t{4096}, int64_t{4096}),
                      std::make_tuple(at::kBFloat16, int64_t{9000}, int64_t{512}),
                      std::make_tuple(at::kBFloat16, int64_t{33}, int64_t{37}),
                      std::make_tuple(at::kBFloat16, int64_t{64}, int64_t{12288}),
                      std::make_tuple(at::kBFloat16, int64_t{20000}, int64_t{128}),
                      std::make_tuple(at::kBFloat16, int64_t{3001}, int64_t{256}),
                      std::make_tuple(at::kBFloat16, int64_t{777}, int64_t{1024}),
                      std::make_tuple(at::kBFloat16, int64_t{9001}, int64_t{40}),
                      std::make_tuple(at::kHalf, int64_t{1024}, int64_t{4096}),
                      std::make_tuple(at::kHalf, int64_t{5}, int64_t{96}),
                      std::make_tuple(at::kHalf, int64_t{1003}, int64_t{64}),
                      std::make_tuple(at::kFloat, int64_t{1024}, int64_t{4096}),
                      std::make_tuple(at::kFloat, int64_t{5000}, int64_t{128}),
                      std::make_tuple(at::kFloat, int64_t{7}, int64_t{37})));

// ---- flavour selection (every device) -------------------------------------------------------------

TEST(FusedKernels, ABadModeIsRefusedByName) {
  try {
    ops::SetFusedKernels("fast");
    FAIL() << "accepted 'fast'";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be auto, fused or aten, got 'fast'"),
              std::string::npos)
        << e.what();
  }
}

TEST(FusedKernels, ForcedFusedOnCpuTensorsIsAnErrorNotAFallback) {
  const Flavour flavour("fused");
  at::Tensor x = at::randn({2, 8}), w = at::ones({8}), rstd;
  try {
    ops::RmsNorm(x, w, 1e-5, &rstd);
    FAIL() << "fused RMSNorm ran on CPU tensors";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused kernels forced: RMSNorm needs"), std::string::npos)
        << e.what();
  }
}

TEST(FusedKernels, ForcedFusedGeGluOnCpuTensorsIsAnError) {
  const Flavour flavour("fused");
  at::Tensor g = at::randn({2, 8}), u = at::randn({2, 8});
  try {
    ops::GeGluTanh(g, u);
    FAIL() << "fused GeGLU ran on CPU tensors";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused kernels forced: GeGLU needs"), std::string::npos)
        << e.what();
  }
}

TEST(FusedKernels, AutoOnCpuRunsTheAtenSequence) {
  const Flavour flavour("auto");
  at::manual_seed(3);
  at::Tensor g = at::randn({3, 5}), u = at::randn({3, 5}), da = at::randn({3, 5});
  at::Tensor dg, du, a;
  ops::SwiGluBackward(da, g, u, &dg, &du, &a);
  EXPECT_TRUE(at::equal(a, at::silu(g) * u));
  EXPECT_TRUE(at::equal(dg, at::silu_backward(da * u, g)));
  EXPECT_TRUE(at::equal(du, da * at::silu(g)));
}

}  // namespace
}  // namespace offloadd::engine
