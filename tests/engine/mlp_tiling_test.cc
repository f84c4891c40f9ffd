// Sequence-tiled MLP (engine/parts.h MlpPart, ALST's tiled MLP): a decoder layer whose MLP runs in
// tiles gives the untiled layer's output and gradients (fp32, to rounding), saves nothing for the
// MLP, and its cost model still equals what it saves.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "engine/blocks.h"
#include "engine/parts.h"

namespace offloadd::engine {
namespace {

ModelConfig MlpConfig(const std::string& variant) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 32;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 512;
  c.norm_eps = 1e-6;
  c.rope.theta = 10000.0;
  if (variant == "bias") c.mlp_bias = true;
  if (variant == "gate_up") {  // Phi-3's fused projection, with a bias
    c.names.gate_up = "mlp.gate_up_proj";
    c.names.gate = c.names.up = "";
    c.mlp_bias = true;
  }
  if (variant == "geglu") c.mlp = MlpKind::kGeGluTanh;
  return c;
}

struct Result {
  at::Tensor y, dx;
  std::map<std::string, at::Tensor> grads;
  int64_t held = 0, estimated = 0;
};

Result RunLayer(const ModelConfig& c, int64_t t, SaveMode mode) {
  uint64_t seed = 1;
  ParamLoader load = [&](const std::string&,
                         const std::vector<int64_t>& shape) -> StatusOr<at::Tensor> {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed++);
    return (shape.size() == 1 ? 0.1 : 0.3) * at::randn(shape, gen);
  };
  auto layer = BuildDecoderLayer(c, 0, load);
  EXPECT_TRUE(layer.ok());
  MicroBatch mb;
  mb.input_ids = at::zeros({2, t}, at::kLong);
  mb.position_ids = at::arange(t, at::kLong).unsqueeze(0).expand({2, t}).contiguous();
  PrepareLayerInputs(c, at::kFloat, &mb);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  at::Tensor x = at::randn({2, t, c.hidden_size}, gen), dy = at::randn({2, t, c.hidden_size}, gen);
  Result r;
  SavedState saved;
  r.y = *(*layer)->Forward(mb, x, mode, &saved);
  r.held = saved.held_bytes();
  r.estimated = (*layer)->EstimateCost(2, t, at::kFloat).saved_bytes_keep;
  GradCallback on_grad = [&](const std::string& name, const at::Tensor& g) { r.grads[name] = g; };
  r.dx = *(*layer)->Backward(mb, dy, &saved, on_grad);
  return r;
}

class MlpTilingTest : public ::testing::TestWithParam<std::string> {
 protected:
  void TearDown() override { parts::SetMlpTileBytes(0); }
};

// fp32: each tile's products are the untiled ones; only the weight gradients' sums over tokens
// (split per tile, summed in fp32) and nothing else change order. 300 tokens of O(1) terms:
// ~sqrt(300) * eps * sum|terms|, below 1e-5 relative to the largest entry.
TEST_P(MlpTilingTest, TiledLayerEqualsUntiled) {
  const ModelConfig c = MlpConfig(GetParam());
  const int64_t t = 150;  // 2 x 150 = 300 rows
  const Result plain = RunLayer(c, t, SaveMode::kKeep);
  // Tiles of 64 rows: gate and up of 64 rows are 64 * 2 * 48 * 4 bytes.
  parts::SetMlpTileBytes(64 * 2 * c.intermediate_size * 4);
  for (SaveMode mode : {SaveMode::kKeep, SaveMode::kRecompute}) {
    const Result tiled = RunLayer(c, t, mode);
    auto close = [](const at::Tensor& a, const at::Tensor& b) {
      return (a - b).abs().max().item<double>() <=
             1e-5 * std::max(1.0, b.abs().max().item<double>());
    };
    EXPECT_TRUE(close(tiled.y, plain.y));
    EXPECT_TRUE(close(tiled.dx, plain.dx));
    ASSERT_EQ(tiled.grads.size(), plain.grads.size());
    for (const auto& [name, g] : plain.grads) {
      ASSERT_TRUE(tiled.grads.count(name)) << name;
      EXPECT_TRUE(close(tiled.grads.at(name), g)) << name;
      EXPECT_EQ(tiled.grads.at(name).scalar_type(), g.scalar_type()) << name;
    }
    if (mode == SaveMode::kKeep) {
      // The MLP saved nothing: [2 * 150, 2 * ffn] fp32 fewer bytes, as the cost model says.
      EXPECT_EQ(plain.held - tiled.held, int64_t{300} * 2 * c.intermediate_size * 4);
      EXPECT_EQ(tiled.held, tiled.estimated);
      EXPECT_EQ(plain.held, plain.estimated);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, MlpTilingTest,
                         ::testing::Values("swiglu", "bias", "gate_up", "geglu"));

TEST(MlpTilingRowsTest, TilesOnlyBeyondTheTileBytes) {
  ModelConfig c = MlpConfig("swiglu");
  c.intermediate_size = 14336;  // Llama-3-8B
  parts::ParamList pl;
  const parts::MlpPart mlp(c, "", &pl);
  // 1 GiB of gate and up per tile in bf16: 1 GiB / (2 * 14336 * 2 B) = 18724 tokens.
  EXPECT_EQ(mlp.TileRows(2), 18724);
  EXPECT_FALSE(mlp.Tiled(16 * 1024, 2));  // the 8B benchmarks' batch 16 x 1024
  EXPECT_TRUE(mlp.Tiled(32768, 2));
  EXPECT_EQ(mlp.SavedBytes(32768, 2), 0);
}

}  // namespace
}  // namespace offloadd::engine
