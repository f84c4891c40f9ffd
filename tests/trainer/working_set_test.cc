// What the static GPU estimate used to leave out (trainer/working_set.h):
// packed batches' explicit attention and LSP's working set, priced at the job's shape.
#include "trainer/working_set.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(PackedAttentionTest, TwentyBytesPerScoreInBf16) {
  // Llama-2-7B, batch 8 x 1024 tokens, 32 heads, bf16: 2^28 scores; the softmax backward's
  // statement holds p, dp, dp and p in fp32, the fp32 result, its bf16 cast and the scaled copy.
  EXPECT_EQ(PackedAttentionBytes(8, 1024, 32, 2), int64_t{8} * 32 * 1024 * 1024 * 20);
  EXPECT_EQ(PackedAttentionBytes(8, 1024, 32, 2), 5 * kGiB);
  // fp32 compute (the CPU device): 4 x 4 + 12 bytes per score.
  EXPECT_EQ(PackedAttentionBytes(1, 16, 2, 4), 16 * 16 * 2 * 28);
  // Quadratic in the length, linear in the batch.
  EXPECT_EQ(PackedAttentionBytes(4, 2048, 32, 2), 2 * PackedAttentionBytes(8, 1024, 32, 2));
}

TEST(PackedAttentionTest, TheMaskIsHeldPerMicroBatch) {
  EXPECT_EQ(PackedMaskBytes(8, 1024, 2), int64_t{8} * 1024 * 1024 * 5);
}

// The seven matrices of one Llama-2-7B layer at LSP's defaults (s = 512, d = 16).
std::vector<LspMatrixShape> Llama7bLayers(int layers) {
  std::vector<LspMatrixShape> out;
  for (int l = 0; l < layers; ++l) {
    const int b = l + 1;
    for (int i = 0; i < 4; ++i) out.push_back({b, 4096, 4096, 512, 512, 16});  // q, k, v, o
    out.push_back({b, 11008, 4096, 512, 512, 16});                             // gate
    out.push_back({b, 11008, 4096, 512, 512, 16});                             // up
    out.push_back({b, 4096, 11008, 512, 512, 16});                             // down
  }
  return out;
}

TEST(LspWorkingSetTest, PricesTheSevenBWeightsOfALlama7bShape) {
  const LspWorkingSet w = PriceLspWorkingSet(Llama7bLayers(32), 2);
  const int64_t layer = 4 * 4096 * 4096 + 3 * 11008 * 4096;  // 202 M weights
  // W_base in bf16 (12.9 GB) and the sparse projectors (16 x 12 B per row and column).
  const int64_t projectors = 32 * (4 * (4096 + 4096) + 3 * (11008 + 4096)) * 16 * 12;
  EXPECT_EQ(w.resident, 32 * layer * 2 + projectors);
  EXPECT_EQ(w.block_effective, layer * 2);
  // Building the largest matrix: dense P (11008 x 512) twice (P and P A), Q, A, and the output.
  EXPECT_EQ(w.materialize, (11008 * 512 * 2 + 4096 * 512 + 512 * 512) * 2 + 11008 * 4096 * 2);
  // The check: one block's fp32 gradients and the largest one's bf16 + fp32 learning copies.
  EXPECT_EQ(w.check, layer * 4 + int64_t{11008} * 4096 * 6);
  EXPECT_EQ(w.Total(4),
            w.resident + 4 * w.block_effective + std::max({w.materialize, w.compress, w.check}));
  EXPECT_GT(w.Total(4), 14 * kGiB);  // what a 24 GiB budget must hold beside the step
  EXPECT_NE(w.Describe(4).find("4 blocks' effective weights"), std::string::npos);
}

TEST(LspWorkingSetTest, NoMatricesNothingHeld) {
  const LspWorkingSet w = PriceLspWorkingSet({}, 2);
  EXPECT_EQ(w.Total(4), 0);
}

TEST(LargestFittingBatchTest, BisectsAMonotoneFit) {
  int calls = 0;
  auto under = [&](int limit) {
    return [&calls, limit](int b) {
      ++calls;
      return b <= limit;
    };
  };
  EXPECT_EQ(LargestFittingBatch(64, under(5)), 5);
  EXPECT_LE(calls, 8);  // log2(64) + the check of 1
  EXPECT_EQ(LargestFittingBatch(7, under(100)), 7);
  EXPECT_EQ(LargestFittingBatch(8, under(0)), 0);
  EXPECT_EQ(LargestFittingBatch(0, under(3)), 0);
  EXPECT_EQ(LargestFittingBatch(1, under(1)), 1);
}

// A 7B LSP job's out-of-memory error in numbers: at Llama-2-7B, batch 8 of packed 1024-token rows,
// the explicit attention's 5 GiB and LSP's 15+ GiB do not fit a 24 GiB budget beside the
// streamed weights and the step's own working set, while batch 2 leaves room.
TEST(LspWorkingSetTest, SevenBPackedBatchEightDoesNotFitTwentyFourGiB) {
  const int64_t lsp = PriceLspWorkingSet(Llama7bLayers(32), 2).Total(4);
  auto need = [&](int b) {
    return lsp + PackedAttentionBytes(b, 1024, 32, 2) + PackedMaskBytes(b, 1024, 2);
  };
  EXPECT_GT(need(8), 20 * kGiB);
  EXPECT_LT(need(2), 18 * kGiB);
  EXPECT_EQ(LargestFittingBatch(8, [&](int b) { return need(b) <= 20 * kGiB; }), 7);
}

}  // namespace
}  // namespace offloadd::trainer
