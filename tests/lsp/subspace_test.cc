// LSP-Offload's check-and-update and the projector's saved form.
#include "lsp/subspace.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace offloadd::lsp {
namespace {

const at::Device kCpu(at::kCPU);

TEST(CheckAndUpdateTest, BelowTheThresholdKeepsTheProjectors) {
  // A random pair's compressor is unbiased only in expectation over draws: for one draw
  // P^T P ~ (m / s_m) I, so its relative bias on a typical gradient is far above 1. The identity
  // has none.
  at::manual_seed(0);
  const at::Tensor g = at::randn({64, 48});
  EXPECT_GT(ProjectorPair::Random(64, 48, 8, 2, 1, kCpu).RelativeBias(g), 1.0);
  const ProjectorPair id = ProjectorPair::Identity(64, 48, kCpu);
  CheckOptions opt;
  opt.threshold = 0.05;
  const CheckResult r = CheckAndUpdate(id, g, opt);
  EXPECT_EQ(r.bias, 0.0);
  EXPECT_FALSE(r.updated);
  EXPECT_EQ(r.learn.steps, 0);
  EXPECT_TRUE(r.next.p().values().equal(id.p().values()));
}

TEST(CheckAndUpdateTest, AboveTheThresholdLearnsABetterPair) {
  at::manual_seed(1);
  const at::Tensor g = at::randn({96, 3}).mm(at::randn({3, 64}));  // rank 3
  const ProjectorPair pq = ProjectorPair::Random(96, 64, 12, 3, 2, kCpu);
  CheckOptions opt;
  opt.threshold = 0.1;
  opt.learn.steps = 150;
  opt.learn.lr = 2e-2;
  opt.learn.seed = 3;
  const CheckResult r = CheckAndUpdate(pq, g, opt);
  EXPECT_GE(r.bias, 0.1);
  ASSERT_TRUE(r.updated);
  EXPECT_EQ(r.learn.steps, 150);
  EXPECT_LT(r.learn.bias_after, r.bias);
  EXPECT_NEAR(r.next.RelativeBias(g), r.learn.bias_after, 1e-12);
}

// Folding the learned change into the base keeps the effective weight base + P A Q^T.
TEST(SwitchSubspaceTest, TheEffectiveWeightIsKeptAndTheMomentsReprojected) {
  at::manual_seed(2);
  const ProjectorPair old = ProjectorPair::Random(40, 56, 10, 3, 4, kCpu);
  const ProjectorPair now = ProjectorPair::Random(40, 56, 10, 3, 5, kCpu);
  at::Tensor base = at::randn({40, 56}), a = 0.01 * at::randn({10, 10});
  at::Tensor m = at::randn({10, 10}), v = at::rand({10, 10});
  const at::Tensor effective = base + old.Decompress(a);
  at::Tensor m_want = m.clone(), v_want = v.clone();
  now.Reproject(old, &m_want, &v_want);
  ASSERT_TRUE(SwitchSubspace(old, now, base, a, m, v).ok());
  // One fp32 rounding of the sum: half an ulp of the largest element.
  EXPECT_LE((base + now.Decompress(a) - effective).abs().max().item<double>(),
            effective.abs().max().item<double>() * std::ldexp(1.0, -24));
  EXPECT_TRUE(a.eq(0).all().item<bool>());
  EXPECT_TRUE(m.equal(m_want));
  EXPECT_TRUE(v.equal(v_want));
}

TEST(SwitchSubspaceTest, MismatchedStateIsRefused) {
  const ProjectorPair old = ProjectorPair::Random(40, 56, 10, 3, 4, kCpu);
  at::Tensor base = at::zeros({40, 56}), a = at::zeros({10, 10}), m = at::zeros({10, 10}), v = at::zeros({9, 10});
  EXPECT_FALSE(SwitchSubspace(old, old, base, a, m, v).ok());
  at::Tensor bad_base = at::zeros({40, 55});
  v = at::zeros({10, 10});
  EXPECT_FALSE(SwitchSubspace(old, old, bad_base, a, m, v).ok());
  const ProjectorPair other = ProjectorPair::Random(41, 56, 10, 3, 4, kCpu);
  EXPECT_FALSE(SwitchSubspace(old, other, base, a, m, v).ok());
}

TEST(SavedProjectorTest, RoundTripIsExact) {
  const ProjectorPair pq = ProjectorPair::Random(70, 30, 16, 4, 6, kCpu);
  std::map<std::string, at::Tensor> saved;
  SaveProjectorPair(pq, "layers.0.q_proj.", &saved);
  EXPECT_EQ(saved.size(), 5u);
  auto back = LoadProjectorPair(saved, "layers.0.q_proj.", kCpu);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->p().index().equal(pq.p().index()));
  EXPECT_TRUE(back->p().values().equal(pq.p().values()));
  EXPECT_TRUE(back->q().index().equal(pq.q().index()));
  EXPECT_TRUE(back->q().values().equal(pq.q().values()));
  at::manual_seed(3);
  const at::Tensor g = at::randn({70, 30});
  EXPECT_TRUE(back->Compress(g).equal(pq.Compress(g)));
}

TEST(SavedProjectorTest, DamagedPartsAreNamed) {
  const ProjectorPair pq = ProjectorPair::Random(20, 12, 8, 2, 7, kCpu);
  std::map<std::string, at::Tensor> saved;
  SaveProjectorPair(pq, "w.", &saved);
  auto missing = saved;
  missing.erase("w.q_values");
  auto r = LoadProjectorPair(missing, "w.", kCpu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("w.q_values"), std::string::npos) << r.status().message();
  auto out_of_range = saved;
  out_of_range["w.p_index"] = out_of_range["w.p_index"].clone();
  out_of_range["w.p_index"][0][0] = 8;
  r = LoadProjectorPair(out_of_range, "w.", kCpu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("w.p"), std::string::npos) << r.status().message();
  auto wrong_shape = saved;
  wrong_shape["w.shape"] = at::tensor({21, 12, 8, 8}, at::kLong);
  EXPECT_FALSE(LoadProjectorPair(wrong_shape, "w.", kCpu).ok());
}

}  // namespace
}  // namespace offloadd::lsp
