// The fused RMSNorm/SwiGLU CUDA kernels (engine/cuda/) against the ATen op sequences they replace
// (engine/ops.cc with the flavour forced to "aten"), on the same inputs. GPU cases skip without
// CUDA; the flavour checks run everywhere.
//
// Bounds, from the arithmetic: both sides round every intermediate the same way and differ only
// in the order of fp32 sums (sum of squares, the dot product mean(dn * n), dW over rows). For
// h <= 12288 those differ by a few fp32 ulps, far below half an ulp of bf16 (2^-9) or fp16
// (2^-12), so a 16-bit result can differ only where an fp32 value lands within those few ulps of
// a rounding boundary: by at most 1 ulp, in a small fraction of elements (asserted <= 1%, which a
// missing or extra rounding step would exceed by far). fp32 results: relative 1e-5 of the
// tensor's largest magnitude. SwiGLU has no sums: expected equal to the bit, asserted <= 1 ulp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/ops.h"

namespace offloadd::engine {
namespace {

struct Flavour {
  explicit Flavour(const char* mode) { ops::SetFusedKernels(mode); }
  ~Flavour() { ops::SetFusedKernels("auto"); }
};

// Signed values mapped to integers ordered like the values, so |a - b| counts ulps.
at::Tensor Ordered(const at::Tensor& t) {
  at::Tensor bits = t.scalar_type() == at::kFloat ? t.contiguous().view(at::kInt).to(at::kLong)
                                                  : t.contiguous().view(at::kShort).to(at::kLong);
  const int64_t sign = t.scalar_type() == at::kFloat ? (int64_t{1} << 31) : (int64_t{1} << 15);
  return at::where(bits < 0, -(bits + sign), bits);
}

struct Diff {
  int64_t max_ulps;
  double mismatch_fraction;
};

Diff Compare(const at::Tensor& fused, const at::Tensor& ref) {
  EXPECT_EQ(fused.sizes(), ref.sizes());
  EXPECT_EQ(fused.scalar_type(), ref.scalar_type());
  at::Tensor d = (Ordered(fused.cpu()) - Ordered(ref.cpu())).abs();
  return {d.max().item<int64_t>(), d.gt(0).to(at::kDouble).mean().item<double>()};
}

void ExpectClose(const char* what, const at::Tensor& fused, const at::Tensor& ref) {
  if (ref.scalar_type() == at::kFloat) {
    const double scale = ref.abs().max().item<double>();
    EXPECT_LE((fused - ref).abs().max().item<double>(), 1e-5 * scale + 1e-30) << what;
    return;
  }
  const Diff d = Compare(fused, ref);
  EXPECT_LE(d.max_ulps, 1) << what;
  EXPECT_LE(d.mismatch_fraction, 0.01) << what;
  std::printf("  %-10s %s: max %lld ulp, %.4f%% of elements differ\n", what,
              c10::toString(ref.scalar_type()), static_cast<long long>(d.max_ulps),
              100 * d.mismatch_fraction);
}

class FusedKernelsGpu : public ::testing::TestWithParam<std::tuple<at::ScalarType, int64_t, int64_t>> {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "needs CUDA";
  }
};

TEST_P(FusedKernelsGpu, RmsNormMatchesTheAtenOpSequence) {
  const auto [dtype, rows, h] = GetParam();
  at::manual_seed(7);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  at::Tensor x = at::randn({rows, h}, opts) * 3, w = at::randn({h}, opts) * 0.5 + 1;
  at::Tensor dy = at::randn({rows, h}, opts), res = at::randn({rows, h}, opts);
  at::Tensor y[2], rstd[2], yr[2], dx[2], dxr[2], dw[2], dwr[2];
  for (int f = 0; f < 2; ++f) {
    const Flavour flavour(f == 0 ? "fused" : "aten");
    y[f] = ops::RmsNorm(x, w, 1e-5, &rstd[f]);
  }
  for (int f = 0; f < 2; ++f) {  // both from the ATen rstd, so only the kernels differ
    const Flavour flavour(f == 0 ? "fused" : "aten");
    yr[f] = ops::RmsNormFromRstd(x, w, rstd[1]);
    dx[f] = ops::RmsNormBackward(dy, x, w, rstd[1], &dw[f]);
    dxr[f] = ops::RmsNormBackward(dy, x, w, rstd[1], &dwr[f], res);
  }
  EXPECT_LE((rstd[0] - rstd[1]).abs().max().item<double>(),
            4e-6 * rstd[1].abs().max().item<double>());
  ExpectClose("y", y[0], y[1]);
  ExpectClose("y(rstd)", yr[0], yr[1]);  // no sum involved: expected equal to the bit
  ExpectClose("dx", dx[0], dx[1]);
  ExpectClose("dx+res", dxr[0], dxr[1]);
  ExpectClose("dw", dw[0], dw[1]);
  ExpectClose("dw(res)", dwr[0], dw[0]);  // the residual does not change dW
}

TEST_P(FusedKernelsGpu, SwiGluMatchesTheAtenOpSequence) {
  const auto [dtype, rows, h] = GetParam();
  at::manual_seed(8);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  at::Tensor g = at::randn({rows, h}, opts) * 4, u = at::randn({rows, h}, opts);
  at::Tensor da = at::randn({rows, h}, opts);
  at::Tensor a[2], dg[2], du[2], a2[2];
  for (int f = 0; f < 2; ++f) {
    const Flavour flavour(f == 0 ? "fused" : "aten");
    a[f] = ops::SwiGlu(g, u);
    ops::SwiGluBackward(da, g, u, &dg[f], &du[f], &a2[f]);
  }
  ExpectClose("a", a[0], a[1]);
  ExpectClose("a(bwd)", a2[0], a[1]);
  ExpectClose("dg", dg[0], dg[1]);
  ExpectClose("du", du[0], du[1]);
}

// (dtype, rows, hidden): the vectorised path (h % 8 == 0), several rows per backward block
// (rows > 8192), an odd hidden size (scalar path) and the largest hidden size (dW partials above
// 48 KiB of shared memory).
INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedKernelsGpu,
    ::testing::Values(std::make_tuple(at::kBFloat16, int64_t{4096}, int64_t{4096}),
                      std::make_tuple(at::kBFloat16, int64_t{9000}, int64_t{512}),
                      std::make_tuple(at::kBFloat16, int64_t{33}, int64_t{37}),
                      std::make_tuple(at::kBFloat16, int64_t{64}, int64_t{12288}),
                      std::make_tuple(at::kHalf, int64_t{1024}, int64_t{4096}),
                      std::make_tuple(at::kHalf, int64_t{5}, int64_t{96}),
                      std::make_tuple(at::kFloat, int64_t{1024}, int64_t{4096}),
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
