// Attention within documents without a [T, T] mask (engine/doc_attention.h): the tiled exact path
// against the masked reference (ops::Attention with ops::SegmentMask, transformers' eager
// attention) forward and backward in fp32, with grouped-query heads, sliding windows and
// soft-capping; the documents of a packed batch; and a decoder layer whose largest allocation
// grows linearly in T, not quadratically (no [T, T] tensor anywhere in forward or backward).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/blocks.h"
#include "engine/doc_attention.h"
#include "engine/ops.h"
#include "tests/engine/largest_allocation.h"

namespace offloadd::engine {
namespace {

at::Tensor Segments(const std::vector<std::vector<int64_t>>& runs_per_row) {
  std::vector<at::Tensor> rows;
  for (const auto& runs : runs_per_row) {
    std::vector<int64_t> ids;
    int64_t id = 10 * static_cast<int64_t>(rows.size());
    for (int64_t len : runs) ids.insert(ids.end(), len, id++);
    rows.push_back(at::tensor(ids, at::kLong));
  }
  return at::stack(rows);
}

TEST(DocumentsTest, RunsOfEqualIdsWithinRows) {
  const ops::Documents d = ops::DocumentsOf(Segments({{3, 5}, {8}}), at::kCPU);
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 3, 8, 16}));
  EXPECT_EQ(d.seq, 8);
  EXPECT_EQ(d.max_len, 8);
  EXPECT_EQ(d.cu_seqlens.scalar_type(), at::kInt);
  // A row that ends with the id the next row starts with still splits at the row boundary.
  const ops::Documents same = ops::DocumentsOf(at::zeros({2, 4}, at::kLong), at::kCPU);
  EXPECT_EQ(same.offsets, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(ops::RowDocuments(3, 5, at::kCPU).offsets, (std::vector<int64_t>{0, 5, 10, 15}));
}

TEST(DocumentsTest, RefusesDocumentsThatDoNotCoverTheBatch) {
  at::Tensor q = at::zeros({1, 2, 8, 4});
  const ops::Documents d = ops::RowDocuments(1, 6, at::kCPU);
  EXPECT_THROW(ops::DocumentAttention(q, q, q, 0.5, d, 0, 0.0, nullptr), c10::Error);
}

struct Variant {
  std::string name;
  int64_t kv_heads, window;
  double softcap;
};

class DocAttentionTest : public ::testing::TestWithParam<Variant> {};

// fp32, |q|, |k|, |v| ~ 1 and head size 8: both paths compute each score and softmax row the same
// way; they differ in the order of the sums over at most T = 600 keys (P V, dP, and d K / d V over
// queries, which the tiled path accumulates per tile in fp32). A sum of n terms in a different
// order differs by at most ~n * eps * sum|terms|; with these magnitudes that is ~1e-4 in the worst
// case and ~sqrt(n) * eps * sum|terms| ~ 1e-5 typically. 5e-5 sits between.
TEST_P(DocAttentionTest, TiledPathEqualsMaskedReference) {
  const Variant& v = GetParam();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t b = 2, h = 4, t = 600, d = 8;
  // Row 0: a document longer than one query tile (512 rows), then a short one; row 1: three.
  at::Tensor seg = Segments({{530, 70}, {100, 200, 300}});
  at::Tensor q = at::randn({b, h, t, d}, gen), k = at::randn({b, v.kv_heads, t, d}, gen);
  at::Tensor val = at::randn({b, v.kv_heads, t, d}, gen), dout = at::randn({b, h, t, d}, gen);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  const at::Tensor mask = ops::SegmentMask(seg, at::kFloat, v.window);
  std::vector<at::Tensor> aux_ref;
  at::Tensor ref = ops::Attention(q, k, val, scale, mask, &aux_ref, v.softcap);
  at::Tensor rdq, rdk, rdv;
  ops::AttentionBackward(dout, q, k, val, ref, aux_ref.data(), scale, mask, &rdq, &rdk, &rdv,
                         v.softcap);

  const ops::Documents docs = ops::DocumentsOf(seg, at::kCPU);
  std::vector<at::Tensor> aux;
  at::Tensor out = ops::DocumentAttention(q, k, val, scale, docs, v.window, v.softcap, &aux);
  EXPECT_TRUE(aux.empty()) << "the tiled path saves nothing besides q, k, v and out";
  at::Tensor dq, dk, dv;
  ops::DocumentAttentionBackward(dout, q, k, val, out, aux.data(), scale, docs, v.window, v.softcap,
                                 &dq, &dk, &dv);
  const double tol = 5e-5;
  EXPECT_LE((out - ref).abs().max().item<double>(), tol);
  EXPECT_LE((dq - rdq).abs().max().item<double>(), tol);
  EXPECT_LE((dk - rdk).abs().max().item<double>(), tol);
  EXPECT_LE((dv - rdv).abs().max().item<double>(), tol);
  EXPECT_EQ(dk.sizes(), k.sizes());
}

INSTANTIATE_TEST_SUITE_P(Variants, DocAttentionTest,
                         ::testing::Values(Variant{"Mha", 4, 0, 0.0}, Variant{"Gqa", 2, 0, 0.0},
                                           Variant{"Window", 2, 37, 0.0},
                                           Variant{"SoftcapWindow", 1, 64, 1.5}),
                         [](const auto& p) { return p.param.name; });

ModelConfig LayerConfig() {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 32;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 4096;
  c.norm_eps = 1e-6;
  c.rope.theta = 10000.0;
  return c;
}

// Forward (keeping activations) and backward of one decoder layer on a packed row of T tokens in
// three documents; returns the largest allocation.
int64_t LayerLargestAllocation(int64_t t) {
  const ModelConfig c = LayerConfig();
  uint64_t seed = 1;
  ParamLoader load = [&](const std::string&,
                         const std::vector<int64_t>& shape) -> StatusOr<at::Tensor> {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed++);
    return 0.1 * at::randn(shape, gen);
  };
  auto layer = BuildDecoderLayer(c, 0, load);
  EXPECT_TRUE(layer.ok());
  MicroBatch mb;
  mb.input_ids = at::zeros({1, t}, at::kLong);
  mb.segment_ids = Segments({{t / 2, t / 4, t - t / 2 - t / 4}});
  mb.position_ids = at::arange(t, at::kLong).unsqueeze(0);
  mb.docs = ops::DocumentsOf(mb.segment_ids, at::kCPU);
  PrepareLayerInputs(c, at::kFloat, &mb);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  at::Tensor x = at::randn({1, t, c.hidden_size}, gen);
  at::Tensor dy = at::randn({1, t, c.hidden_size}, gen);

  auto probe = std::make_shared<LargestAllocation>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
    SavedState saved;
    auto y = (*layer)->Forward(mb, x, SaveMode::kKeep, &saved);
    EXPECT_TRUE(y.ok());
    GradCallback on_grad = [](const std::string&, const at::Tensor&) {};
    auto dx = (*layer)->Backward(mb, dy, &saved, on_grad);
    EXPECT_TRUE(dx.ok());
  }
  return probe->largest;
}

// A [T, T] tensor per head (the old mask path's scores, probabilities and mask) makes the largest
// allocation quadruple when T doubles; the document path's tiles and [T, width] activations
// double it. 2.1 leaves room for allocations that do not scale with T.
TEST(DocAttentionMemoryTest, LayerLargestAllocationIsLinearInT) {
  const int64_t at_1k = LayerLargestAllocation(1024);
  const int64_t at_2k = LayerLargestAllocation(2048);
  ASSERT_GT(at_1k, 0) << "no allocation reported: the probe is not installed";
  EXPECT_LE(static_cast<double>(at_2k), 2.1 * static_cast<double>(at_1k))
      << "largest allocation " << at_1k << " bytes at T=1024, " << at_2k << " at T=2048";
  // And no [heads, T, T] fp32 tensor at T = 2048 (64 MiB here).
  EXPECT_LT(at_2k, int64_t{4} * 2048 * 2048 * 4);
}

}  // namespace
}  // namespace offloadd::engine
