// The tiled MLP's rows and the LM head's chunk chosen from the GPU budget (trainer/tile_plan.h).
#include "job/tile_plan.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// Llama-3-8B's MLP and vocabulary in bf16 at one 32K-token row.
TileShape Llama8B(int64_t tokens) {
  TileShape s;
  s.tokens = tokens;
  s.ffn = 14336;
  s.vocab = 128256;
  s.elem = 2;
  return s;
}

TEST(TilePlanTest, DefaultsWhenTheyFit) {
  const TileChoice d = DefaultTiles(Llama8B(32768));
  // 1 GiB of gate and up per tile: 18724 rows of 2 x 14336 bf16; three such at the backward's peak.
  EXPECT_EQ(d.mlp_rows, (int64_t{1} << 30) / (2 * 14336 * 2));
  EXPECT_EQ(d.mlp_bytes, 3 * d.mlp_rows * 2 * 14336 * 2);
  // 128 MiB of fp32 logits: 261 tokens; 16 B per logit at bf16.
  EXPECT_EQ(d.head_tokens, (128 * kMiB) / (128256 * 4));
  EXPECT_EQ(d.head_bytes, d.head_tokens * 128256 * 16);
  EXPECT_FALSE(d.from_budget);
  const TileChoice same = ChooseTiles(Llama8B(32768), d.bytes());
  EXPECT_EQ(same.mlp_rows, d.mlp_rows);
  EXPECT_EQ(same.head_tokens, d.head_tokens);
  EXPECT_FALSE(same.from_budget);
}

TEST(TilePlanTest, AShortRowIsNotTiledAndItsHeadChunkIsTheRow) {
  const TileChoice d = DefaultTiles(Llama8B(100));
  EXPECT_EQ(d.mlp_rows, 0);
  EXPECT_EQ(d.mlp_bytes, 0);
  EXPECT_EQ(d.head_tokens, 100);
  EXPECT_NE(d.Describe().find("MLP untiled, LM head in chunks of 100 tokens"), std::string::npos)
      << d.Describe();
}

// A small budget: the room left for the tiles sets both, each within it.
TEST(TilePlanTest, ASmallRoomShrinksBothToFit) {
  const TileShape s = Llama8B(131072);
  const int64_t room = 256 * kMiB;
  const TileChoice t = ChooseTiles(s, room);
  EXPECT_TRUE(t.from_budget);
  EXPECT_LT(t.mlp_rows, DefaultTiles(s).mlp_rows);
  EXPECT_LT(t.head_tokens, DefaultTiles(s).head_tokens);
  EXPECT_LE(t.bytes(), room);
  EXPECT_LE(t.mlp_bytes, room);
  EXPECT_LE(t.head_bytes, room);
  // The largest that fit: one more row or token would not.
  EXPECT_GT(3 * (t.mlp_rows + 1) * 2 * 14336 * 2, room);
  EXPECT_GT((t.head_tokens + 1) * 128256 * 16, room);
  EXPECT_EQ(t.mlp_rows, room / 3 / (2 * 14336 * 2));
  EXPECT_NE(t.Describe().find("smaller than the defaults to fit the GPU budget"),
            std::string::npos);
}

// Only what does not fit shrinks.
TEST(TilePlanTest, OnlyTheMlpShrinksWhenTheHeadFits) {
  const TileShape s = Llama8B(131072);
  const TileChoice d = DefaultTiles(s);
  const TileChoice t = ChooseTiles(s, 2 * d.head_bytes);
  EXPECT_EQ(t.head_tokens, d.head_tokens);
  EXPECT_LT(t.mlp_rows, d.mlp_rows);
  EXPECT_LE(t.bytes(), 2 * d.head_bytes);
}

// Below the minima the GEMMs stop running at their rate: those are taken, and they do not fit
// (the caller refuses with the numbers).
TEST(TilePlanTest, TheMinimaWhenNothingFits) {
  const TileChoice t = ChooseTiles(Llama8B(131072), kMiB);
  EXPECT_EQ(t.mlp_rows, kMinMlpTileRows);
  EXPECT_EQ(t.head_tokens, kMinHeadChunkTokens);
  EXPECT_GT(t.bytes(), kMiB);
}

}  // namespace
}  // namespace offloadd::trainer
