#include "engine/model_config.h"

#include <gtest/gtest.h>

#include <string>

namespace offloadd::engine {
namespace {

StatusOr<ModelConfig> Parse(const std::string& json) { return ParseModelConfig(json, "cfg.json"); }

void ExpectRejected(const std::string& json, const std::string& needle) {
  auto c = Parse(json);
  ASSERT_FALSE(c.ok()) << json;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("cfg.json"), std::string::npos) << c.status().ToString();
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().ToString();
}

constexpr char kLlama3[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
  "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
  "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 131072,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu"})";

TEST(ModelConfigTest, Llama31WithRopeScaling) {
  auto c = Parse(kLlama3);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kLlama);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->kv_dim(), 1024);
  EXPECT_EQ(c->rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c->norm_eps, 1e-5);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
}

TEST(ModelConfigTest, Transformers5RopeParametersAndHeadDim) {
  auto c = Parse(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}, "tie_word_embeddings": true})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->q_dim(), 64);
  EXPECT_EQ(c->num_kv_heads, 4);  // defaults to num_attention_heads
  EXPECT_DOUBLE_EQ(c->rope.theta, 1234.0);
  EXPECT_TRUE(c->tie_word_embeddings);
}

TEST(ModelConfigTest, Qwen2HasQkvBiasMistralHasWindow) {
  auto q = Parse(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "use_sliding_window": false, "sliding_window": 4096})");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_TRUE(q->qkv_bias);
  EXPECT_FALSE(q->o_bias);
  EXPECT_EQ(q->sliding_window, 0);
  auto m = Parse(R"({"model_type": "mistral", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "sliding_window": 4096})");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sliding_window, 4096);
  auto m2 = Parse(R"({"model_type": "mistral", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "sliding_window": null})");
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->sliding_window, 0);
  auto l = Parse(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "attention_bias": true})");
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->qkv_bias && l->o_bias);
}

TEST(ModelConfigTest, Gpt2) {
  auto c =
      Parse(R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 50257,
    "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_inner": null,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05, "attn_pdrop": 0.1})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->arch, Architecture::kGpt2);
  EXPECT_EQ(c->intermediate_size, 3072);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_TRUE(c->qkv_bias);
}

TEST(ModelConfigTest, RejectsUnsupportedByName) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4)";
  ExpectRejected("{" + base + R"(, "model_type": "gemma"})", "unsupported model type \"gemma\"");
  ExpectRejected(
      "{" + base +
          R"(, "model_type": "llama", "architectures": ["LlamaForSequenceClassification"]})",
      "LlamaForSequenceClassification");
  ExpectRejected(
      "{" + base +
          R"(, "model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
      "rope_scaling.rope_type");
  ExpectRejected(
      "{" + base +
          R"(, "model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 4.0}})",
      "dynamic");
  ExpectRejected("{" + base + R"(, "model_type": "llama", "hidden_act": "gelu"})", "hidden_act");
  ExpectRejected("{" + base + R"(, "model_type": "llama", "mlp_bias": true})", "mlp_bias");
  ExpectRejected("{" + base + R"(, "model_type": "llama", "partial_rotary_factor": 0.5})",
                 "partial_rotary_factor");
  ExpectRejected("{" + base + R"(, "model_type": "qwen2", "use_sliding_window": true})",
                 "use_sliding_window");
  ExpectRejected("{" + base + R"(, "model_type": "llama", "num_key_value_heads": 3})",
                 "num_key_value_heads");
  ExpectRejected("{" + base + R"(, "model_type": "llama", "hidden_size": "32"})", "hidden_size");
  ExpectRejected(R"({"model_type": "llama"})", "vocab_size");
  ExpectRejected(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 32, "n_layer": 1,
    "n_head": 4, "n_positions": 8, "scale_attn_by_inverse_layer_idx": true})",
                 "scale_attn_by_inverse_layer_idx");
  ExpectRejected(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 32, "n_layer": 1,
    "n_head": 4, "n_positions": 8, "activation_function": "relu"})",
                 "activation_function");
  ExpectRejected("[1, 2]", "not a JSON object");
  ExpectRejected("{", "not valid JSON");
}

}  // namespace
}  // namespace offloadd::engine
