// What the static GPU estimate used to leave out (job/working_set.h):
// packed batches' attention within documents and LSP's working set, priced at the job's shape.
#include "job/working_set.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(PackedAttentionTest, VarlenFlashIsLinearInTokens) {
  // Llama-3-8B (32 query / 8 key-value heads, head size 128), bf16, batch 8 x 1024 tokens:
  // 2^13 tokens x 128 x (32 x 10 + 2 x 8 x 2) bytes = 352 MiB, where the mask path's
  // [8, 32, 1024, 1024] scores at 20 bytes each were 5 GiB.
  EXPECT_EQ(DocumentAttentionBytes(8, 1024, 32, 8, 128, 2, true), int64_t{8192} * 128 * 352);
  // Linear in the tokens: one 32K row costs what four 8K rows do.
  EXPECT_EQ(DocumentAttentionBytes(1, 32768, 32, 8, 128, 2, true),
            DocumentAttentionBytes(4, 8192, 32, 8, 128, 2, true));
}

TEST(PackedAttentionTest, TiledPathHoldsOneTile) {
  // fp32 on the CPU, 32 heads at 1024 keys: 512-row tiles (64 MiB of scores per tile).
  const int64_t tile = int64_t{512} * 32 * 1024 * 4;
  EXPECT_EQ(tile, int64_t{64} << 20);
  EXPECT_EQ(DocumentAttentionBytes(8, 1024, 32, 8, 128, 4, false),
            5 * tile + 2 * 1024 * 32 * 128 * 4 + 2 * int64_t{8192} * 8 * 128 * 4);
  // Past 4K keys the tile's rows shrink and its scores stay at 64 MiB: the rest grows with T.
  const int64_t at_32k = DocumentAttentionBytes(1, 32768, 32, 8, 128, 4, false);
  EXPECT_LT(at_32k, 2 * kGiB);
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
// the explicit attention's 5 GiB (the mask path, since replaced) and LSP's 15+ GiB did not fit a
// 24 GiB budget; with attention within documents the packed rows add ~0.6 GiB at batch 8.
TEST(LspWorkingSetTest, SevenBPackedBatchEightFitsWithDocumentAttention) {
  const int64_t lsp = PriceLspWorkingSet(Llama7bLayers(32), 2).Total(4);
  auto need = [&](int b) { return lsp + DocumentAttentionBytes(b, 1024, 32, 32, 128, 2, true); };
  EXPECT_LT(need(8) - lsp, kGiB);
  EXPECT_GT(lsp, 15 * kGiB);
  // The packed rows no longer set the largest batch: all 8 fit in LSP's set plus 1 GiB.
  EXPECT_EQ(LargestFittingBatch(8, [&](int b) { return need(b) <= lsp + kGiB; }), 8);
}

TEST(LargestFittingLengthTest, BisectsMultiplesOfEight) {
  auto under = [](int64_t limit) { return [limit](int64_t len) { return len <= limit; }; };
  EXPECT_EQ(LargestFittingLength(131072, under(40000)), 40000);
  EXPECT_EQ(LargestFittingLength(131072, under(40003)), 40000);
  EXPECT_EQ(LargestFittingLength(131072, under(1 << 20)), 131072);
  EXPECT_EQ(LargestFittingLength(131072, under(7)), 0);
  EXPECT_EQ(LargestFittingLength(4, under(100)), 0);
  int calls = 0;
  LargestFittingLength(131072, [&](int64_t len) { return ++calls, len <= 5000; });
  EXPECT_LE(calls, 15);  // log2(16384) + 1
}

}  // namespace
}  // namespace offloadd::trainer
