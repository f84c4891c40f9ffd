// engine/rope.h: partial rotary and the backward as the transpose of the forward; the tables
// themselves are compared with transformers in tests/python/engine/test_rope.py.
#include "engine/rope.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace offloadd::engine::ops {
namespace {

// HF's rotate_half applied to the first r dimensions of x by hand.
at::Tensor Reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t r = cos.size(-1), half = r / 2;
  at::Tensor rot = x.narrow(-1, 0, r);
  at::Tensor rotated = at::cat({-rot.narrow(-1, half, half), rot.narrow(-1, 0, half)}, -1);
  at::Tensor y = x.clone();
  y.narrow(-1, 0, r).copy_(rot * cos.unsqueeze(1) + rotated * sin.unsqueeze(1));
  return y;
}

TEST(RopeTest, PartialRotaryRotatesTheFirstDimensionsOnly) {
  RopeConfig rope;
  rope.rotary_dim = 12;  // of head_dim 16 (Phi-4-mini's 0.75)
  const at::Tensor pos = at::arange(5, at::kLong).unsqueeze(0).repeat({2, 1});
  at::Tensor cos, sin;
  RopeTables(rope, 16, pos, at::kFloat, &cos, &sin);
  ASSERT_EQ(cos.sizes(), (c10::IntArrayRef{2, 5, 12}));
  EXPECT_EQ(RopeInvFreq(rope, 16, 5, c10::kCPU).size(0), 6);
  at::manual_seed(0);
  const at::Tensor x = at::randn({2, 3, 5, 16});
  const at::Tensor y = ApplyRope(x, cos, sin);
  EXPECT_TRUE(at::equal(y, Reference(x, cos, sin)));
  EXPECT_TRUE(at::equal(y.narrow(-1, 12, 4), x.narrow(-1, 12, 4)));
  // Full rotary is the same function with r = D.
  RopeConfig full;
  RopeTables(full, 16, pos, at::kFloat, &cos, &sin);
  EXPECT_TRUE(at::allclose(ApplyRope(x, cos, sin), Reference(x, cos, sin), 0, 1e-6));
}

// <ApplyRope(x), g> == <x, ApplyRopeBackward(g)> for a rotation; exact up to fp64 rounding.
TEST(RopeTest, BackwardIsTheTransposeWithAndWithoutPartialRotary) {
  for (int64_t rotary : {0, 8, 16}) {
    RopeConfig rope;
    rope.rotary_dim = rotary;
    rope.theta = 100.0;
    const at::Tensor pos = at::arange(7, at::kLong).unsqueeze(0);
    at::Tensor cos, sin;
    RopeTables(rope, 16, pos, at::kDouble, &cos, &sin);
    at::manual_seed(1);
    const at::Tensor x = at::randn({1, 2, 7, 16}, at::kDouble);
    const at::Tensor g = at::randn({1, 2, 7, 16}, at::kDouble);
    const double lhs = (ApplyRope(x, cos, sin) * g).sum().item<double>();
    const double rhs = (x * ApplyRopeBackward(g, cos, sin)).sum().item<double>();
    EXPECT_NEAR(lhs, rhs, 1e-12) << "rotary_dim " << rotary;
  }
}

// In bf16 the hand-written backward rounds exactly where autograd of transformers' op sequence
// (q * cos + rotate_half(q) * sin) does: dy * cos, dy * sin and their sum, each rounded once. The
// q/k bias gradients of Qwen2 and Llama's attention_bias are sums of this over every position
// (bench/engine/RESULTS.md, "qwen2's q/k biases"), so any extra rounding here would show there.
TEST(RopeTest, Bf16BackwardIsAutogradOfTheForwardBitForBit) {
  for (int64_t rotary : {0, 8}) {
    RopeConfig rope;
    rope.rotary_dim = rotary;
    const at::Tensor pos = at::arange(64, at::kLong).unsqueeze(0).repeat({2, 1});
    at::Tensor cos, sin;
    RopeTables(rope, 16, pos, at::kBFloat16, &cos, &sin);
    at::manual_seed(2);
    const at::Tensor x = at::randn({2, 4, 64, 16}).to(at::kBFloat16).set_requires_grad(true);
    const at::Tensor g = (at::randn({2, 4, 64, 16}) * 1e-3).to(at::kBFloat16);
    ApplyRope(x, cos, sin).backward(g);
    EXPECT_TRUE(at::equal(ApplyRopeBackward(g, cos, sin), x.grad())) << "rotary_dim " << rotary;
  }
}

TEST(RopeTest, AttentionScalingOfYarnAndLongrope) {
  RopeConfig yarn;
  yarn.type = "yarn";
  yarn.factor = 4.0;
  EXPECT_DOUBLE_EQ(RopeAttentionScaling(yarn), 0.1 * std::log(4.0) + 1.0);
  yarn.mscale = 0.707;
  yarn.mscale_all_dim = 1.0;
  EXPECT_DOUBLE_EQ(RopeAttentionScaling(yarn),
                   (0.1 * 0.707 * std::log(4.0) + 1.0) / (0.1 * std::log(4.0) + 1.0));
  yarn.attention_factor = 1.25;
  EXPECT_DOUBLE_EQ(RopeAttentionScaling(yarn), 1.25);
  RopeConfig longrope;
  longrope.type = "longrope";
  longrope.factor = 32.0;
  longrope.original_max_position_embeddings = 4096;
  EXPECT_DOUBLE_EQ(RopeAttentionScaling(longrope),
                   std::sqrt(1 + std::log(32.0) / std::log(4096.0)));
  EXPECT_DOUBLE_EQ(RopeAttentionScaling(RopeConfig{}), 1.0);
}

}  // namespace
}  // namespace offloadd::engine::ops
