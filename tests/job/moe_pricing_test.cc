// The planner's mixture-of-experts figures against hand counts from the configs (the tiny ones
// are what transformers' Qwen3MoeConfig / GptOssConfig write; their num_parameters() agree:
// tests/python/trainer/test_moe_plan.py).
#include "job/moe_pricing.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

engine::ModelConfig Parse(const char* json) {
  auto c = engine::ParseModelConfig(json, "config.json");
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : engine::ModelConfig();
}

// Three layers, the middle one dense (mlp_only_layers), tied head.
constexpr char kTinyQwen3Moe[] =
    R"({"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
  "vocab_size": 128, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 16, "num_hidden_layers": 3, "intermediate_size": 96, "moe_intermediate_size": 32,
  "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [1], "decoder_sparse_step": 1,
  "norm_topk_prob": true, "tie_word_embeddings": true, "max_position_embeddings": 128})";

constexpr char kTinyGptOss[] = R"({"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"],
  "vocab_size": 128, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
  "num_experts_per_tok": 2, "tie_word_embeddings": false})";

TEST(MoePricingTest, TinyQwen3MoeFromItsConfig) {
  const engine::ModelConfig c = Parse(kTinyQwen3Moe);
  // Attention: q 64x64, k and v 64x32, o 64x64 = 12288; q/k norms 2 x 16; two norms 2 x 64.
  const int64_t attn = 12288 + 32 + 128;
  const int64_t expert = 3 * 64 * 32;                        // gate, up, down: 6144
  const int64_t sparse = attn + 8 * 64 + 8 * expert;         // router [8, 64] + 8 experts: 62112
  const int64_t dense = attn + 3 * 64 * 96;                  // the MLP of layer 1: 30880
  const int64_t total = 128 * 64 + 2 * sparse + dense + 64;  // tied head; final norm
  ASSERT_EQ(total, 163360);                                  // transformers' num_parameters()
  const engine::ParamCounts n = engine::CountParams(c);
  EXPECT_EQ(n.layers, (std::vector<int64_t>{sparse, dense, sparse}));
  EXPECT_EQ(n.total, total);
  EXPECT_EQ(n.sparse_layers, 2);
  // A token computes with 2 of 8 experts in each of the two sparse layers.
  EXPECT_EQ(n.active, total - 2 * 6 * expert);

  // Micro-batch 2 x 16 tokens, streamed fp32 masters (2 uploads of 4 B), 14 B of arena each.
  const MoeStepFigures m = PriceMoeStep(c, 2, 16, 2, 4, 14);
  EXPECT_EQ(m.total_params, total);
  EXPECT_EQ(m.active_params, 89632);
  EXPECT_EQ(m.expert_params, expert);
  EXPECT_EQ(m.tokens, 32);
  EXPECT_EQ(m.routed_experts, 8);  // min(8, 32 x 2)
  EXPECT_DOUBLE_EQ(m.expert_rows, 64.0 / 8);
  EXPECT_DOUBLE_EQ(m.expert_upload_bytes, 2.0 * 4 * 2 * 8 * expert);
  EXPECT_DOUBLE_EQ(m.routed_upload_bytes, m.expert_upload_bytes);
  EXPECT_DOUBLE_EQ(m.router_flops, 2 * (2.0 * 32 * 64 * 8));
  EXPECT_DOUBLE_EQ(m.expert_flops, 2 * (2.0 * 32 * 2 * 3 * 64 * 32));
  EXPECT_DOUBLE_EQ(m.expert_host_bytes, 14.0 * 2 * 8 * expert);
  const std::string text = DescribeMoe(m);
  EXPECT_NE(text.find("2 sparse layers of 8 experts, top-2: 163360 parameters, 89632 active"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("min(8, 32 x 2) = 8 receive tokens"), std::string::npos) << text;
}

// Fewer assignments than experts: the routed bound is below E (the upload still moves all E).
TEST(MoePricingTest, FewTokensReachFewerExpertsThanTheLayerHolds) {
  const engine::ModelConfig c = Parse(kTinyQwen3Moe);
  const MoeStepFigures m = PriceMoeStep(c, 1, 2, 1, 2, 14);  // resident: one upload of 2 B
  EXPECT_EQ(m.routed_experts, 4);                            // 2 tokens x top-2
  EXPECT_DOUBLE_EQ(m.expert_rows, 1.0);
  EXPECT_DOUBLE_EQ(m.expert_upload_bytes, 1.0 * 2 * 2 * 8 * 6144);
  EXPECT_DOUBLE_EQ(m.routed_upload_bytes, m.expert_upload_bytes / 2);
}

TEST(MoePricingTest, TinyGptOssCountsSinksAndBiases) {
  const engine::ModelConfig c = Parse(kTinyGptOss);
  // Attention with biases (q 64+64, k and v 2048+32 each, o 4096+64), 4 sinks, two norms.
  const int64_t attn = 4096 + 64 + 2 * (2048 + 32) + 4096 + 64 + 4 + 128;
  const int64_t expert = 3 * 64 * 32 + 2 * 32 + 64;       // and the gate_up and down biases: 6272
  const int64_t sparse = attn + 4 * 64 + 4 + 4 * expert;  // router with its bias
  const int64_t total = 2 * 128 * 64 + 2 * sparse + 64;   // untied head
  ASSERT_EQ(total, 92368);                                // transformers' num_parameters()
  const engine::ParamCounts n = engine::CountParams(c);
  EXPECT_EQ(n.total, total);
  EXPECT_EQ(n.expert, expert);
  EXPECT_EQ(n.router, 4 * 64 + 4);
  EXPECT_EQ(n.active, total - 2 * 2 * expert);  // top-2 of 4 in both layers
  const MoeStepFigures m = PriceMoeStep(c, 4, 64, 4, 4, 18);
  EXPECT_EQ(m.active_params, 67280);
  EXPECT_EQ(m.routed_experts, 4);
  EXPECT_DOUBLE_EQ(m.expert_rows, 256.0 * 2 / 4);
  EXPECT_DOUBLE_EQ(m.expert_upload_bytes, 4.0 * 4 * 2 * 4 * expert);
  EXPECT_DOUBLE_EQ(m.router_flops, 2 * (2.0 * 256 * 64 * 4));
  EXPECT_DOUBLE_EQ(m.expert_flops, 2 * (2.0 * 256 * 2 * 3 * 64 * 32));
  EXPECT_DOUBLE_EQ(m.expert_host_bytes, 18.0 * 2 * 4 * expert);
}

// Qwen3-30B-A3B's config: 30.5 B parameters, 3.35 B active (the model card's "30.5B, 3.3B
// activated").
TEST(MoePricingTest, Qwen3MoeThirtyBillionShape) {
  const engine::ModelConfig c = Parse(R"({"model_type": "qwen3_moe", "vocab_size": 151936,
    "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_hidden_layers": 48, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "norm_topk_prob": true, "tie_word_embeddings": false})");
  const MoeStepFigures m = PriceMoeStep(c, 8, 1024, 2, 4, 14);
  EXPECT_EQ(m.total_params, 30532122624);
  EXPECT_EQ(m.active_params, 3353032704);
  EXPECT_EQ(m.sparse_layers, 48);
  EXPECT_EQ(m.routed_experts, 128);
  EXPECT_DOUBLE_EQ(m.expert_rows, 8192.0 * 8 / 128);
  // 48 x 128 experts of 3 x 2048 x 768, uploaded twice as fp32.
  EXPECT_DOUBLE_EQ(m.expert_upload_bytes, 2.0 * 4 * 48 * 128 * 4718592);
}

TEST(MoePricingTest, DenseModelHasNoMoeFigures) {
  const engine::ModelConfig c = Parse(R"({"model_type": "llama", "vocab_size": 32000,
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
    "num_attention_heads": 32, "num_key_value_heads": 4})");
  const MoeStepFigures m = PriceMoeStep(c, 8, 1024, 2, 4, 14);
  EXPECT_FALSE(m.moe());
  EXPECT_EQ(m.total_params, 0);
  EXPECT_EQ(DescribeMoe(m), "");
  const engine::ParamCounts n = engine::CountParams(c);
  EXPECT_EQ(n.active, n.total);
  EXPECT_EQ(n.total, 1100048384);
  EXPECT_EQ(n.layers, std::vector<int64_t>(22, n.layer));
  EXPECT_EQ(n.sparse_layer, 0);
}

}  // namespace
}  // namespace offloadd::trainer
