// LSP-Offload's projectors against dense references: the d-sparse products,
// the compressor's bias, the seed's moment re-projection, the projector learning, and Adam in the
// subspace against dense AdamW on the reparameterised weight.
#include "lsp/projector.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "workers/adamw_kernel.h"

namespace offloadd::lsp {
namespace {

const at::Device kCpu(at::kCPU);

// fp32 products of O(100) terms: each sum rounds at most ~k ulps of its largest term.
void ExpectClose(const at::Tensor& got, const at::Tensor& want, double rtol, double atol, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double err = (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  EXPECT_LE(err, atol + rtol * scale) << what << ": max error " << err << " at scale " << scale;
}

TEST(SparseProjectorTest, RandomHasDistinctPositionsAndTheSeedsVariance) {
  const SparseProjector p = SparseProjector::Random(4096, 64, 16, 7, kCpu);
  ASSERT_EQ(p.index().sizes(), (at::IntArrayRef{4096, 16}));
  const at::Tensor sorted = std::get<0>(p.index().sort(1));
  EXPECT_FALSE(sorted.narrow(1, 1, 15).eq(sorted.narrow(1, 0, 15)).any().item<bool>());
  EXPECT_GE(p.index().min().item<int64_t>(), 0);
  EXPECT_LT(p.index().max().item<int64_t>(), 64);
  // Uniform positions: each column is picked by a row with probability d/cols = 1/4, so its count
  // over 4096 rows is 1024 with standard deviation sqrt(4096 * 1/4 * 3/4) = 27.7; 6 of them bound
  // all 64 columns (a false alarm has probability ~1e-7).
  const at::Tensor counts = at::bincount(p.index().reshape({-1}), {}, 64);
  EXPECT_LE((counts - 1024).abs().max().item<int64_t>(), 6 * 27.7) << counts;
  // d = cols: every column once per row.
  const at::Tensor full = std::get<0>(SparseProjector::Random(8, 5, 5, 3, kCpu).index().sort(1));
  EXPECT_TRUE(full.equal(at::arange(5, at::kLong).expand({8, 5})));
  // N(0, 1/d): 65,536 draws put the sample variance within 2% of 1/16 (its standard error is
  // sqrt(2/65536) = 0.55% relative).
  EXPECT_NEAR(p.values().var().item<double>(), 1.0 / 16, 0.02 / 16);
  // The same seed draws the same projector; another seed another one.
  const SparseProjector again = SparseProjector::Random(4096, 64, 16, 7, kCpu);
  EXPECT_TRUE(again.index().equal(p.index()) && again.values().equal(p.values()));
  EXPECT_FALSE(SparseProjector::Random(4096, 64, 16, 8, kCpu).index().equal(p.index()));
}

TEST(SparseProjectorTest, ProductsMatchTheDenseMatrix) {
  const SparseProjector p = SparseProjector::Random(96, 24, 4, 1, kCpu);
  const at::Tensor dense = p.Dense();
  EXPECT_EQ(dense.ne(0).sum(1).eq(4).all().item<bool>(), true);
  at::manual_seed(0);
  const at::Tensor x = at::randn({96, 13}), y = at::randn({24, 13});
  ExpectClose(p.ProjectRows(x), dense.t().mm(x), 1e-5, 1e-6, "P^T x");
  ExpectClose(p.ProjectColumns(x.t()), x.t().mm(dense), 1e-5, 1e-6, "x P");
  ExpectClose(p.Expand(y), dense.mm(y), 1e-5, 1e-6, "P y");
  ExpectClose(p.ExpandColumns(y.t()), y.t().mm(dense.t()), 1e-5, 1e-6, "z P^T");
  // bf16 inputs are read as their fp32 values.
  const at::Tensor xb = x.to(at::kBFloat16);
  ExpectClose(p.ProjectRows(xb), dense.t().mm(xb.to(at::kFloat)), 1e-5, 1e-6, "P^T x (bf16 x)");
}

TEST(ProjectorPairTest, CompressAndDecompressMatchDenseReference) {
  const ProjectorPair pq = ProjectorPair::Random(80, 48, 16, 4, 3, kCpu);
  EXPECT_EQ(pq.rank_rows(), 16);
  EXPECT_EQ(pq.rank_cols(), 16);
  const at::Tensor P = pq.p().Dense(), Q = pq.q().Dense();
  at::manual_seed(1);
  const at::Tensor g = at::randn({80, 48});
  const at::Tensor a = at::randn({16, 16});
  ExpectClose(pq.Compress(g), P.t().mm(g).mm(Q), 1e-5, 1e-6, "P^T G Q");
  ExpectClose(pq.Decompress(a), P.mm(a).mm(Q.t()), 1e-5, 1e-6, "P A Q^T");
  const at::Tensor c = P.mm(P.t()).mm(g).mm(Q).mm(Q.t());
  const double bias = (c - g).square().sum().item<double>() / g.square().sum().item<double>();
  EXPECT_NEAR(pq.RelativeBias(g), bias, 1e-5 * bias);
  EXPECT_EQ(pq.RelativeBias(at::zeros({80, 48})), 0.0);
}

TEST(ProjectorPairTest, RankAndNonzerosClampToTheShape) {
  const ProjectorPair pq = ProjectorPair::Random(8, 300, 512, 16, 0, kCpu);
  EXPECT_EQ(pq.rank_rows(), 8);
  EXPECT_EQ(pq.rank_cols(), 300);
  EXPECT_EQ(pq.p().nonzeros(), 8);
  EXPECT_EQ(pq.q().nonzeros(), 16);
  EXPECT_EQ(pq.Compress(at::ones({8, 300})).sizes(), (at::IntArrayRef{8, 300}));
}

TEST(ProjectorPairTest, IdentityIsLossless) {
  const ProjectorPair id = ProjectorPair::Identity(12, 20, kCpu);
  at::manual_seed(2);
  const at::Tensor g = at::randn({12, 20});
  EXPECT_TRUE(id.Compress(g).equal(g));
  EXPECT_TRUE(id.Decompress(g).equal(g));
  EXPECT_EQ(id.RelativeBias(g), 0.0);
}

TEST(ProjectorPairTest, FromPartsRefusesMalformedProjectors) {
  const at::Tensor idx = at::tensor({0, 1, 2, 2}, at::kLong).view({2, 2});
  const at::Tensor val = at::ones({2, 2});
  EXPECT_FALSE(SparseProjector::FromParts(4, idx, val).ok());                    // repeated position
  EXPECT_FALSE(SparseProjector::FromParts(2, idx.clamp_max(1), val).ok());       // repeats after clamp
  EXPECT_FALSE(SparseProjector::FromParts(2, at::tensor({0, 1, 0, 2}, at::kLong).view({2, 2}), val).ok());
  EXPECT_FALSE(SparseProjector::FromParts(4, idx.to(at::kInt), val).ok());       // dtype
  EXPECT_FALSE(SparseProjector::FromParts(4, at::tensor({0, 1, 2, 3}, at::kLong).view({2, 2}),
                                          at::full({2, 2}, NAN)).ok());
  auto ok = SparseProjector::FromParts(4, at::tensor({0, 1, 2, 3}, at::kLong).view({2, 2}), val);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->Dense().sum().item<float>(), 4.0f);
}

// The seed's formula, computed densely: M <- (P^T P_old) M (Q_old^T Q), V likewise with
// elementwise squares.
TEST(ProjectorPairTest, ReprojectionFollowsTheSeedsFormula) {
  const ProjectorPair old = ProjectorPair::Random(64, 40, 12, 3, 4, kCpu);
  const ProjectorPair now = ProjectorPair::Random(64, 40, 12, 3, 5, kCpu);
  at::manual_seed(3);
  at::Tensor m = at::randn({12, 12}), v = at::rand({12, 12});
  const at::Tensor P = now.p().Dense(), Po = old.p().Dense(), Q = now.q().Dense(), Qo = old.q().Dense();
  const at::Tensor rp = P.t().mm(Po), rq = Qo.t().mm(Q);
  const at::Tensor want_m = rp.mm(m).mm(rq), want_v = rp.square().mm(v).mm(rq.square());
  now.Reproject(old, &m, &v);
  ExpectClose(m, want_m, 1e-5, 1e-6, "exp_avg");
  ExpectClose(v, want_v, 1e-5, 1e-6, "exp_avg_sq");
  EXPECT_TRUE(v.ge(0).all().item<bool>());
  // The same projectors carry the moments through (P^T P) M (Q^T Q).
  at::Tensor m2 = at::eye(12), v2 = at::eye(12);
  old.Reproject(old, &m2, &v2);
  ExpectClose(m2, Po.t().mm(Po).mm(Qo.t().mm(Qo)), 1e-5, 1e-6, "same subspace");
}

// UpdateSubspace: on a gradient with low-rank structure the learned projectors have a lower bias
// than the freshly drawn ones, and the report says so.
TEST(ProjectorPairTest, LearningLowersTheBias) {
  at::manual_seed(4);
  const at::Tensor g = at::randn({128, 4}).mm(at::randn({4, 96})) + 0.05 * at::randn({128, 96});
  const ProjectorPair old = ProjectorPair::Random(128, 96, 16, 4, 10, kCpu);
  LearnOptions opt;
  opt.steps = 200;
  opt.lr = 2e-2;
  opt.seed = 11;
  LearnReport rep;
  const ProjectorPair learned = old.Learn(g, opt, &rep);
  EXPECT_EQ(rep.steps, 200);
  EXPECT_NEAR(rep.bias_before, old.RelativeBias(g), 1e-12);
  EXPECT_NEAR(rep.bias_after, learned.RelativeBias(g), 1e-12);
  EXPECT_LT(rep.bias_after, 0.5 * rep.bias_initial) << rep.bias_initial << " -> " << rep.bias_after;
  // Positions are kept; only values move.
  EXPECT_TRUE(learned.p().index().equal(ProjectorPair::Random(128, 96, 16, 4, 11, kCpu).p().index()));
  EXPECT_EQ(learned.rank_rows(), 16);
}

// The GEMM form (CUDA's; forced here) with the learning's G-sized GEMMs in bf16, as the trainer
// runs it on CUDA: it still learns, and the biases it reports are fp32 ones of what it returns.
TEST(ProjectorPairTest, LearningInBf16GemmsLowersTheBias) {
  ASSERT_EQ(setenv("OFFLOADD_LSP_DENSE", "1", 1), 0);
  at::manual_seed(4);
  const at::Tensor g = at::randn({128, 4}).mm(at::randn({4, 96})) + 0.05 * at::randn({128, 96});
  const ProjectorPair old = ProjectorPair::Random(128, 96, 16, 4, 10, kCpu);
  LearnOptions opt;
  opt.steps = 200;
  opt.lr = 2e-2;
  opt.seed = 11;
  LearnReport fp32, bf16;
  const ProjectorPair exact = old.Learn(g, opt, &fp32);
  opt.gemm_dtype = at::kBFloat16;
  const ProjectorPair fast = old.Learn(g, opt, &bf16);
  // Measured on the same (dense) path Learn reports from: the sparse path sums in another order,
  // and differed by 8e-8 relative on an AVX-512 machine.
  const double fast_bias = fast.RelativeBias(g);
  unsetenv("OFFLOADD_LSP_DENSE");
  EXPECT_EQ(bf16.bias_initial, fp32.bias_initial);  // both fp32, of the same fresh draw
  EXPECT_LT(fp32.bias_after, 0.5 * fp32.bias_initial) << fp32.bias_initial << " -> " << fp32.bias_after;
  EXPECT_LT(bf16.bias_after, 0.5 * bf16.bias_initial) << bf16.bias_initial << " -> " << bf16.bias_after;
  EXPECT_NEAR(bf16.bias_after, fast_bias, 1e-12);
  EXPECT_FALSE(fast.p().values().equal(exact.p().values()));  // the bf16 GEMMs did run
}

// Adam on the subspace coordinates A with the compressed gradient P^T G Q (the CPU workers'
// kernel) equals dense AdamW on W = W_base + P A Q^T when the projectors are the identity, and in
// general equals AdamW on A, the reparameterised model's own parameter.
TEST(SubspaceAdamTest, IdentityProjectorsEqualDenseAdamW) {
  const int64_t m = 24, n = 40;
  const ProjectorPair id = ProjectorPair::Identity(m, n, kCpu);
  at::manual_seed(5);
  const at::Tensor w0 = at::randn({m, n});
  at::Tensor a = at::zeros({m, n}), ma = at::zeros({m, n}), va = at::zeros({m, n});
  at::Tensor w = w0.clone(), mw = at::zeros({m, n}), vw = at::zeros({m, n});
  workers::AdamWHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0;  // decay acts on A in LSP mode (lsp/README.md): equal only without it
  for (uint64_t step = 1; step <= 5; ++step) {
    const at::Tensor g = at::randn({m, n});
    h.step = step;
    const at::Tensor ga = id.Compress(g).contiguous();
    workers::AdamWSpan sa{ga.data_ptr(), workers::GradDtype::kFp32, a.data_ptr<float>(), ma.data_ptr<float>(),
                          va.data_ptr<float>(), nullptr, workers::WeightDtype::kNone, static_cast<size_t>(m * n)};
    workers::FusedAdamW(sa, h, workers::KernelPath::kPortable);
    const at::Tensor gw = g.contiguous();
    workers::AdamWSpan sw{gw.data_ptr(), workers::GradDtype::kFp32, w.data_ptr<float>(), mw.data_ptr<float>(),
                          vw.data_ptr<float>(), nullptr, workers::WeightDtype::kNone, static_cast<size_t>(m * n)};
    workers::FusedAdamW(sw, h, workers::KernelPath::kPortable);
  }
  // Same increments; W rounds each step's sum at its own magnitude (5 half-ulps) and w0 + A once
  // more at the end: at most 6 half-ulps of the largest weight, 6 * 2^-24 relative.
  ExpectClose(w0 + id.Decompress(a), w, 6 * std::ldexp(1.0, -24), 0, "W_base + P A Q^T vs dense AdamW");
}

TEST(SparseProjectorTest, CudaMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device gpu(at::kCUDA);
  const ProjectorPair cpu = ProjectorPair::Random(256, 192, 32, 8, 9, kCpu);
  const ProjectorPair dev = ProjectorPair::Random(256, 192, 32, 8, 9, gpu);
  EXPECT_TRUE(dev.p().index().cpu().equal(cpu.p().index()));
  at::manual_seed(6);
  const at::Tensor g = at::randn({256, 192});
  // Summation order differs (atomics on the GPU): fp32 rounding of ~24 terms.
  ExpectClose(dev.Compress(g.to(gpu)).cpu(), cpu.Compress(g), 1e-5, 1e-6, "compress on CUDA");
  ExpectClose(dev.Decompress(at::ones({32, 32}).to(gpu)).cpu(), cpu.Decompress(at::ones({32, 32})), 1e-5, 1e-6,
              "decompress on CUDA");
}

}  // namespace
}  // namespace offloadd::lsp
