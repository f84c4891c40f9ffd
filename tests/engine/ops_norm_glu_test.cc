// engine/ops' RMSNorm flavours (Llama, OLMo 2, Gemma (1 + w)), per-head q/k norm rows and GeGLU
// with tanh-GELU against LibTorch autograd of transformers' own formulas, in fp32 and bf16, on
// the ATen path (what runs on CPU and what the fused CUDA kernels are checked against).
//
// Forwards run the same ATen ops in the same order as transformers' modules, so they are equal
// to the bit. The RMSNorm backward is the closed form dx = rstd * (dn - n * mean(dn * n)), where
// autograd differentiates through pow, mean and rsqrt separately: the two differ by fp32
// rounding. Bounds, from the arithmetic (u = 2^-24, the fp32 unit roundoff):
//   - a sum of k terms in any order is off by at most k u times the sum of their magnitudes, so
//     mean(dn * n) (autograd's equivalent sum(dn * x) * rstd^3 / h alike) is within
//     h u mean|dn * n| of the exact value; rstd * |n| times that, plus a few roundings of the
//     terms rstd * |dn| and rstd * |n| * mean|dn * n|, bounds dx: 2 (h + 8) u rstd (|dn| + |n|
//     mean|dn * n|) covers both sides;
//   - dW sums rows: 2 (rows + 4) u sum_rows |dy * n|;
//   - a 16-bit result rounds that fp32 value once: where the two land on either side of a
//     rounding boundary they differ by one ulp, <= 2^-7 |ref| for bf16, and the residual's add
//     rounds again (one more ulp of dx); that happens in a small fraction of the elements
//     (asserted <= 1%), where a rounding step missing or added changes tens of percent.
// GeGLU's backward is the op sequence autograd runs (gelu_backward(da * u, g), da * gelu(g)):
// equal to the bit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>

#include "engine/model_config.h"
#include "engine/ops.h"

namespace offloadd::engine {
namespace {

using ops::RmsScale;

constexpr double kU = 0x1p-24;

double UlpOfOne(at::ScalarType t) { return t == at::kBFloat16 ? 0x1p-7 : 0x1p-23; }

// transformers' RMSNorm modules, verbatim in ATen ops (autograd records them).
at::Tensor HfRmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, RmsScale scale) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor n = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  switch (scale) {
    case RmsScale::kCastThenScale:  // LlamaRMSNorm, Qwen3RMSNorm: weight * hs.to(input_dtype)
      return w * n.to(x.scalar_type());
    case RmsScale::kScaleThenCast:  // Olmo2RMSNorm: (weight * hs).to(input_dtype)
      return (w * n).to(x.scalar_type());
    case RmsScale::kOneOffset:  // Gemma2/3RMSNorm: (out * (1.0 + weight.float())).type_as(x)
      return (n * (w.to(at::kFloat) + 1.0)).to(x.scalar_type());
  }
  return {};
}

// |got - ref| <= ulp(ref) (16-bit) + slack, elementwise.
void ExpectWithin(const std::string& what, const at::Tensor& got, const at::Tensor& ref,
                  const at::Tensor& slack) {
  ASSERT_EQ(got.sizes(), ref.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), ref.scalar_type()) << what;
  at::Tensor r = ref.to(at::kFloat);
  at::Tensor bound = slack;
  if (ref.scalar_type() != at::kFloat) bound = bound + UlpOfOne(ref.scalar_type()) * r.abs();
  at::Tensor err = (got.to(at::kFloat) - r).abs();
  EXPECT_EQ(err.gt(bound).sum().item<int64_t>(), 0)
      << what << ": worst excess " << (err - bound).max().item<double>() << ", max |d| "
      << err.max().item<double>();
  // A rounding step missing or added (e.g. Llama's bf16 dn = (dy * w) in an fp32 flavour) moves
  // results by under an ulp too, but in tens of percent of the elements; a summation order only
  // where an fp32 value sits within its error of a rounding boundary.
  if (ref.scalar_type() != at::kFloat) {
    EXPECT_LE(err.gt(0).to(at::kDouble).mean().item<double>(), 0.01) << what;
  }
}

std::string Name(RmsScale s) {
  return s == RmsScale::kCastThenScale ? "cast-then-scale"
         : s == RmsScale::kScaleThenCast ? "scale-then-cast"
                                         : "one-offset";
}

// (dtype, scale, shape: rows [2, 5] of 64, or per-head rows [2, 3, 4] of head_dim 16)
class RmsNormVsAutograd
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, RmsScale, bool>> {};

TEST_P(RmsNormVsAutograd, ForwardEqualsAndBackwardWithinRounding) {
  const auto [dtype, scale, per_head] = GetParam();
  SCOPED_TRACE(Name(scale) + (per_head ? " per-head" : " rows") + " " +
               c10::toString(dtype));
  at::manual_seed(11);
  const auto opts = at::TensorOptions().dtype(dtype);
  const std::vector<int64_t> shape =
      per_head ? std::vector<int64_t>{2, 3, 4, 16} : std::vector<int64_t>{2, 5, 64};
  const int64_t h = shape.back();
  const int64_t rows = at::empty(shape).numel() / h;
  const double eps = 1e-6;
  at::Tensor x = (at::randn(shape) * 3).to(dtype);
  // Gemma's checkpoints store w around 0 (scale 1 + w); the others around 1.
  at::Tensor w = (scale == RmsScale::kOneOffset ? at::randn({h}) * 0.3
                                                : at::randn({h}) * 0.5 + 1).to(dtype);
  at::Tensor dy = at::randn(shape, opts), res = at::randn(shape, opts);

  at::Tensor xa = x.clone().set_requires_grad(true), wa = w.clone().set_requires_grad(true);
  at::Tensor y_ref = HfRmsNorm(xa, wa, eps, scale);
  y_ref.backward(dy);
  at::Tensor dx_ref = xa.grad(), dw_ref = wa.grad();

  at::Tensor rstd;
  at::Tensor y = ops::RmsNorm(x, w, eps, &rstd, scale);
  EXPECT_TRUE(at::equal(y, y_ref.detach())) << "forward";
  std::vector<int64_t> rstd_shape = shape;
  rstd_shape.back() = 1;
  EXPECT_EQ(rstd.sizes().vec(), rstd_shape);
  EXPECT_TRUE(at::equal(ops::RmsNormFromRstd(x, w, rstd, scale), y)) << "from rstd";

  at::Tensor dw, dw2;
  at::Tensor dx = ops::RmsNormBackward(dy, x, w, rstd, &dw, at::Tensor(), scale);
  at::Tensor dxr = ops::RmsNormBackward(dy, x, w, rstd, &dw2, res, scale);

  at::Tensor n = x.to(at::kFloat) * rstd;
  at::Tensor dn = scale == RmsScale::kCastThenScale
                      ? (dy * w).to(at::kFloat)
                      : dy.to(at::kFloat) *
                            (w.to(at::kFloat) + (scale == RmsScale::kOneOffset ? 1.0 : 0.0));
  at::Tensor dx_slack = 2 * (h + 8) * kU * rstd *
                        (dn.abs() + n.abs() * (dn * n).abs().mean(-1, /*keepdim=*/true));
  ExpectWithin("dx", dx, dx_ref, dx_slack);
  ExpectWithin("dx+residual", dxr, (dx_ref + res).to(dtype),
               dx_slack + UlpOfOne(dtype) * dx_ref.to(at::kFloat).abs());
  at::Tensor terms = scale == RmsScale::kCastThenScale
                         ? (dy * n.to(dtype)).to(at::kFloat)
                         : dy.to(at::kFloat) * n;
  at::Tensor dw_slack = 2 * (rows + 4) * kU * terms.abs().reshape({-1, h}).sum(0);
  ExpectWithin("dw", dw, dw_ref, dw_slack);
  EXPECT_TRUE(at::equal(dw2, dw)) << "the residual does not change dW";
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<at::ScalarType, RmsScale, bool>>& info) {
  const auto [dtype, scale, per_head] = info.param;
  std::string s = Name(scale);
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return std::string(dtype == at::kFloat ? "f32_" : "bf16_") + s +
         (per_head ? "_per_head" : "_rows");
}

INSTANTIATE_TEST_SUITE_P(
    Flavours, RmsNormVsAutograd,
    ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16),
                       ::testing::Values(RmsScale::kCastThenScale, RmsScale::kScaleThenCast,
                                         RmsScale::kOneOffset),
                       ::testing::Bool()),
    ParamName);

TEST(RmsNormFlavours, RoundDifferentlyInBf16AndTheBoolFormsPickLlamaOrGemma) {
  at::manual_seed(12);
  at::Tensor x = (at::randn({64, 96}) * 3).to(at::kBFloat16);
  at::Tensor w = (at::randn({96}) * 0.5 + 1).to(at::kBFloat16), rstd;
  at::Tensor llama = ops::RmsNorm(x, w, 1e-6, &rstd, RmsScale::kCastThenScale);
  at::Tensor olmo = ops::RmsNorm(x, w, 1e-6, &rstd, RmsScale::kScaleThenCast);
  // One rounding instead of two: the flavours must not be interchangeable in bf16.
  EXPECT_FALSE(at::equal(llama, olmo));
  EXPECT_TRUE(at::equal(ops::RmsNorm(x, w, 1e-6, &rstd, false), llama));
  EXPECT_TRUE(at::equal(ops::RmsNorm(x, w, 1e-6, &rstd, true),
                        ops::RmsNorm(x, w, 1e-6, &rstd, RmsScale::kOneOffset)));
  at::Tensor dy = at::randn({64, 96}).to(at::kBFloat16), dw1, dw2;
  EXPECT_TRUE(at::equal(ops::RmsNormBackward(dy, x, w, rstd, &dw1, at::Tensor(), true),
                        ops::RmsNormBackward(dy, x, w, rstd, &dw2, at::Tensor(),
                                             RmsScale::kOneOffset)));
  EXPECT_TRUE(at::equal(ops::RmsNormFromRstd(x, w, rstd, true),
                        ops::RmsNormFromRstd(x, w, rstd, RmsScale::kOneOffset)));
}

TEST(RmsNormFlavours, AWeightOfAnotherLengthIsRefused) {
  at::Tensor x = at::randn({2, 3, 4, 16}), w = at::ones({64}), rstd;
  try {
    ops::RmsNorm(x, w, 1e-6, &rstd);
    FAIL() << "a [64] weight normalised rows of 16";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RMSNorm: weight of shape [64] for rows of 16"),
              std::string::npos)
        << e.what();
  }
}

TEST(RmsNormFlavours, EachFamilysFlavour) {
  ModelConfig c;
  c.model_type = "llama";
  EXPECT_EQ(ops::RmsScaleFor(c), RmsScale::kCastThenScale);
  c.model_type = "qwen3";
  EXPECT_EQ(ops::RmsScaleFor(c), RmsScale::kCastThenScale);
  c.model_type = "olmo2";
  EXPECT_EQ(ops::RmsScaleFor(c), RmsScale::kScaleThenCast);
  c.model_type = "gemma3_text";
  c.norm = NormKind::kRmsOneOffset;
  EXPECT_EQ(ops::RmsScaleFor(c), RmsScale::kOneOffset);
}

// ---- GeGLU --------------------------------------------------------------------------------------

class GeGluVsAutograd : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(GeGluVsAutograd, ForwardAndBackwardEqualAutogradOfGeluTanhTimesUp) {
  const at::ScalarType dtype = GetParam();
  at::manual_seed(13);
  const auto opts = at::TensorOptions().dtype(dtype);
  at::Tensor g = (at::randn({3, 7, 40}) * 3).to(dtype), u = at::randn({3, 7, 40}, opts);
  at::Tensor da = at::randn({3, 7, 40}, opts);
  // transformers' GELUTanh: nn.functional.gelu(gate, approximate="tanh") * up.
  at::Tensor ga = g.clone().set_requires_grad(true), ua = u.clone().set_requires_grad(true);
  at::Tensor a_ref = at::gelu(ga, "tanh") * ua;
  a_ref.backward(da);

  at::Tensor a = ops::GeGluTanh(g, u);
  EXPECT_TRUE(at::equal(a, a_ref.detach()));
  at::Tensor dg, du, a2;
  ops::GeGluTanhBackward(da, g, u, &dg, &du, &a2);
  EXPECT_TRUE(at::equal(dg, ga.grad()));
  EXPECT_TRUE(at::equal(du, ua.grad()));
  EXPECT_TRUE(at::equal(a2, a));
  ops::GeGluTanhBackward(da, g, u, &dg, &du);  // without the product
  EXPECT_TRUE(at::equal(du, ua.grad()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GeGluVsAutograd, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& param_info) {
                           return std::string(param_info.param == at::kFloat ? "f32" : "bf16");
                         });

TEST(GeGlu, IsTheTanhApproximationNotErf) {
  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) in double, against the fp32 op: within a
  // few fp32 ulps, while erf-GELU differs by up to ~1e-3 near |x| = 2.
  at::Tensor g = at::linspace(-4, 4, 81, at::kDouble), u = at::ones({81}, at::kDouble);
  at::Tensor want =
      0.5 * g * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g.pow(3))));
  at::Tensor got = ops::GeGluTanh(g.to(at::kFloat), u.to(at::kFloat)).to(at::kDouble);
  EXPECT_LE((got - want).abs().max().item<double>(), 1e-6);
  at::Tensor erf = 0.5 * g * (1 + at::erf(g / std::sqrt(2.0)));
  EXPECT_GE((erf - want).abs().max().item<double>(), 1e-4);
}

// ---- which flavour runs -------------------------------------------------------------------------

TEST(FusedKernelFor, NamesWhyTheAtenSequenceRuns) {
  const c10::Device cpu(c10::kCPU);
  ops::SetFusedKernels("auto");
  for (auto op : {ops::FusedOp::kRmsNorm, ops::FusedOp::kRmsNormBackward, ops::FusedOp::kSwiGlu,
                  ops::FusedOp::kGeGluTanh}) {
    const std::string why = ops::FusedKernelFor(op, at::kBFloat16, cpu, 128);
    EXPECT_TRUE(why == "needs the CUDA build" || why == "needs CUDA tensors") << why;
  }
  ops::SetFusedKernels("aten");
  EXPECT_EQ(ops::FusedKernelFor(ops::FusedOp::kGeGluTanh, at::kBFloat16, c10::Device(c10::kCUDA),
                                128),
            "OFFLOADD_FUSED_KERNELS=aten");
  ops::SetFusedKernels("auto");
#if OFFLOADD_WITH_CUDA
  const c10::Device gpu(c10::kCUDA);
  EXPECT_EQ(ops::FusedKernelFor(ops::FusedOp::kRmsNorm, at::kBFloat16, gpu, 128), "");
  EXPECT_EQ(ops::FusedKernelFor(ops::FusedOp::kRmsNorm, at::kDouble, gpu, 128),
            "needs fp32, bf16 or fp16");
  EXPECT_NE(ops::FusedKernelFor(ops::FusedOp::kRmsNormBackward, at::kBFloat16, gpu, 1 << 20)
                .find("supports a last dimension up to"),
            std::string::npos);
#endif
}

}  // namespace
}  // namespace offloadd::engine
