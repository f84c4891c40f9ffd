#include "engine/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

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
  EXPECT_EQ(m->sliding, (std::vector<bool>{true, true}));
  auto m2 = Parse(R"({"model_type": "mistral", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "sliding_window": null})");
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->sliding_window, 0);
  EXPECT_TRUE(m2->sliding.empty());
  // Absent: MistralConfig's default window of 4096.
  auto m3 = Parse(R"({"model_type": "mistral", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8})");
  ASSERT_TRUE(m3.ok());
  EXPECT_EQ(m3->sliding_window, 4096);
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

// ---- the supported families (configs as their hub checkpoints write them, abridged) -------------

TEST(ModelConfigTest, LlamaWithAttentionAndMlpBiases) {
  auto c = Parse(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 10, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "attention_bias": true, "mlp_bias": true, "head_dim": null})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->qkv_bias && c->o_bias && c->mlp_bias);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_DOUBLE_EQ(c->attn_scale, 1.0 / std::sqrt(8.0));
  EXPECT_EQ(c->norm, NormKind::kRms);
  EXPECT_EQ(c->norm_placement, NormPlacement::kPre);
  EXPECT_EQ(c->mlp, MlpKind::kSwiGlu);
  EXPECT_EQ(c->names.q, "self_attn.q_proj");
  EXPECT_EQ(c->names.gate, "mlp.gate_proj");
  EXPECT_TRUE(c->names.q_norm.empty() && c->names.qkv.empty() && c->names.gate_up.empty());
  EXPECT_TRUE(c->sliding.empty());
  EXPECT_EQ(c->rope.rotary_dim, 8);
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
}

TEST(ModelConfigTest, Qwen25SlidingLayersFromMaxWindowLayersOrLayerTypes) {
  const std::string base = R"("model_type": "qwen2", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "sliding_window": 3)";
  auto c = Parse("{" + base + R"(, "use_sliding_window": true, "max_window_layers": 2})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sliding, (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(c->sliding_window, 3);
  EXPECT_TRUE(c->layer_slides(3) && !c->layer_slides(1) && !c->layer_slides(4));
  // transformers 5 writes layer_types; it wins over the alternation rule.
  c = Parse("{" + base + R"(, "use_sliding_window": true, "max_window_layers": 2, "layer_types":
    ["sliding_attention", "full_attention", "full_attention", "sliding_attention"]})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->sliding, (std::vector<bool>{true, false, false, true}));
  // Without use_sliding_window the window is None and sliding layer types attend to everything.
  c = Parse("{" + base + R"(, "layer_types": ["sliding_attention", "full_attention",
    "full_attention", "full_attention"]})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->sliding.empty());
  EXPECT_EQ(c->sliding_window, 0);
}

constexpr char kQwen3_8B[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

TEST(ModelConfigTest, Qwen3PerHeadQkNormAndIndependentHeadDim) {
  auto c = Parse(kQwen3_8B);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(c->names.q_norm, "self_attn.q_norm");
  EXPECT_EQ(c->names.k_norm, "self_attn.k_norm");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_dim(), 4096);
  EXPECT_EQ(c->kv_dim(), 1024);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_FALSE(c->qkv_bias || c->o_bias);
  EXPECT_TRUE(c->sliding.empty());
  EXPECT_EQ(DescribeParts(*c),
            "qwen3: RMSNorm pre-norm, GQA 32/8 head_dim 128, per-head q/k norm, SwiGLU, RoPE "
            "default θ=1e6, untied head");
  // Qwen3Config's head_dim default is 128, not hidden_size / num_attention_heads.
  auto d = Parse(R"({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 64,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 32})");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->head_dim, 128);
  EXPECT_EQ(d->num_kv_heads, 32);  // Qwen3Config: num_key_value_heads defaults to 32
}

constexpr char kGemma2_2B[] = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 107], "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304,
  "initializer_range": 0.02, "intermediate_size": 9216, "max_position_embeddings": 8192,
  "model_type": "gemma2", "num_attention_heads": 8, "num_hidden_layers": 26,
  "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000})";

TEST(ModelConfigTest, Gemma2SandwichNormsSoftcapsAndAlternatingWindows) {
  auto c = Parse(kGemma2_2B);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->norm, NormKind::kRmsOneOffset);
  EXPECT_EQ(c->norm_placement, NormPlacement::kSandwich);
  EXPECT_EQ(c->mlp, MlpKind::kGeGluTanh);
  EXPECT_EQ(c->hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(c->qk_norm, QkNorm::kNone);
  EXPECT_DOUBLE_EQ(c->attn_logit_softcap, 50.0);
  EXPECT_DOUBLE_EQ(c->final_logit_softcap, 30.0);
  EXPECT_DOUBLE_EQ(c->attn_scale, 1.0 / 16.0);
  EXPECT_TRUE(c->scale_embeddings);
  EXPECT_TRUE(c->tie_word_embeddings);  // Gemma2Config's default
  ASSERT_EQ(c->sliding.size(), 26u);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(c->layer_slides(i), i % 2 == 0) << i;
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->names.input_norm, "input_layernorm");
  EXPECT_EQ(c->names.post_attn_norm, "post_attention_layernorm");
  EXPECT_EQ(c->names.pre_mlp_norm, "pre_feedforward_layernorm");
  EXPECT_EQ(c->names.post_mlp_norm, "post_feedforward_layernorm");
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{1, 107}));
  // Absent softcap keys take Gemma2Config's defaults; null turns them off.
  auto d = Parse(R"({"model_type": "gemma2", "num_hidden_layers": 2,
    "attn_logit_softcapping": null})");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->attn_logit_softcap, 0.0);
  EXPECT_DOUBLE_EQ(d->final_logit_softcap, 30.0);
  EXPECT_EQ(d->vocab_size, 256000);
}

constexpr char kGemma3_1B[] = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
  "sliding_window_pattern": 6, "vocab_size": 262144})";

TEST(ModelConfigTest, Gemma3TextLocalAndGlobalRope) {
  auto c = Parse(kGemma3_1B);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(c->attn_logit_softcap, 0.0);
  EXPECT_EQ(c->final_logit_softcap, 0.0);
  ASSERT_EQ(c->sliding.size(), 26u);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(c->layer_slides(i), (i + 1) % 6 != 0) << i;
  EXPECT_EQ(c->sliding_window, 512);
  EXPECT_TRUE(c->has_local_rope);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c->rope_local.theta, 1e4);
  EXPECT_EQ(c->rope.type, "default");
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_NE(DescribeParts(*c).find("MQA 4/1"), std::string::npos) << DescribeParts(*c);
  // transformers 5: rope_parameters per layer type, layer_types written out.
  auto d = Parse(R"({"model_type": "gemma3_text", "num_hidden_layers": 3, "layer_types":
    ["sliding_attention", "full_attention", "sliding_attention"], "rope_parameters": {
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->sliding, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(d->rope.type, "linear");
  EXPECT_DOUBLE_EQ(d->rope.factor, 8.0);
  EXPECT_EQ(d->rope_local.type, "default");
  EXPECT_DOUBLE_EQ(d->rope_local.theta, 1e4);
}

TEST(ModelConfigTest, Gemma3MultimodalCheckpointTrainsItsTextHalf) {
  // gemma-3-4b-it's config.json: a sparse text_config over Gemma3TextConfig's defaults.
  auto c = Parse(R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106],
    "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3", "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
    "final_logit_softcapping": 30.0,
    "model_type": "gemma3_text", "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0,
    "rope_type": "linear"}, "sliding_window": 1024}, "torch_dtype": "bfloat16",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
    "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
    "patch_size": 14, "vision_use_head": false}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model_type, "gemma3");
  EXPECT_EQ(c->architecture, "Gemma3ForConditionalGeneration");
  EXPECT_EQ(c->vocab_size, 262208);  // Gemma3TextConfig's default
  EXPECT_EQ(c->hidden_size, 2560);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->rope.type, "linear");
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope.theta, 1e6);
  EXPECT_EQ(c->rope_local.type, "default");
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->names.embed, "language_model.model.embed_tokens.weight");
  EXPECT_EQ(c->names.layer_prefix, "language_model.model.layers.");
  EXPECT_EQ(c->names.final_norm, "language_model.model.norm.weight");
  EXPECT_EQ(c->names.lm_head, "language_model.lm_head.weight");
  EXPECT_EQ(c->names.passthrough_prefixes,
            (std::vector<std::string>{"vision_tower.", "multi_modal_projector."}));
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_EQ(c->sliding_window, 1024);
  // The wrapper's forward does not soft-cap the logits (Gemma3ForCausalLM's does).
  EXPECT_EQ(c->final_logit_softcap, 0.0);
}

TEST(ModelConfigTest, Phi3FusedNamesLongRopeAndPartialRotary) {
  std::string short_f, long_f;
  for (int i = 0; i < 48; ++i) {
    short_f += (i ? ", " : "") + std::to_string(1.0 + i / 100.0);
    long_f += (i ? ", " : "") + std::to_string(1.0 + i);
  }
  // Phi-3-mini-128k-instruct: longrope ("su" in older files), top-level original length.
  auto c = Parse(R"({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
    "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "hidden_act": "silu",
    "hidden_size": 3072, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "rope_scaling": {"type": "su", "short_factor": [)" + short_f + R"(], "long_factor": [)" +
                 long_f + R"(]}, "sliding_window": 262144, "vocab_size": 32064})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->names.qkv, "self_attn.qkv_proj");
  EXPECT_EQ(c->names.gate_up, "mlp.gate_up_proj");
  EXPECT_TRUE(c->names.q.empty() && c->names.gate.empty() && c->names.up.empty());
  EXPECT_EQ(c->names.down, "mlp.down_proj");
  EXPECT_EQ(c->rope.type, "longrope");
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->rope.factor, 32.0);  // max_position_embeddings / original
  ASSERT_EQ(c->rope.short_factor.size(), 48u);
  EXPECT_DOUBLE_EQ(c->rope.long_factor[47], 48.0);
  EXPECT_EQ(c->sliding_window, 262144);
  EXPECT_EQ(c->sliding.size(), 32u);
  EXPECT_DOUBLE_EQ(c->norm_eps, 1e-5);
  // Phi-4-mini: partial_rotary_factor 0.75 of head_dim 128.
  auto m = Parse(R"({"model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 24,
    "num_key_value_heads": 8, "num_hidden_layers": 2, "partial_rotary_factor": 0.75,
    "tie_word_embeddings": true, "vocab_size": 200064, "resid_pdrop": 0.1})");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->head_dim, 128);
  EXPECT_EQ(m->rope.rotary_dim, 96);
  EXPECT_TRUE(m->sliding.empty());  // Phi3Config's sliding_window default is None
  EXPECT_EQ(DescribeDropout(*m), "resid_pdrop=0.1");
}

TEST(ModelConfigTest, Olmo2PostNormAndWholeProjectionQkNorm) {
  auto c = Parse(R"({"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2",
    "vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
    "rms_norm_eps": 1e-06, "rope_theta": 500000, "eos_token_id": 100257, "pad_token_id": 100277})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->norm_placement, NormPlacement::kPost);
  EXPECT_EQ(c->qk_norm, QkNorm::kWhole);
  EXPECT_TRUE(c->names.input_norm.empty());
  EXPECT_EQ(c->names.post_attn_norm, "post_attention_layernorm");
  EXPECT_EQ(c->names.post_mlp_norm, "post_feedforward_layernorm");
  EXPECT_TRUE(c->names.pre_mlp_norm.empty());
  EXPECT_EQ(c->names.q_norm, "self_attn.q_norm");
}

TEST(ModelConfigTest, RopeTypesAsTransformersStandardisesThem) {
  const std::string base = R"("model_type": "llama", "vocab_size": 10, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "max_position_embeddings": 4096)";
  auto yarn = Parse("{" + base + R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 1024, "beta_fast": null}})");
  ASSERT_TRUE(yarn.ok()) << yarn.status().ToString();
  EXPECT_EQ(yarn->rope.type, "yarn");
  EXPECT_DOUBLE_EQ(yarn->rope.factor, 4.0);
  EXPECT_EQ(yarn->rope.original_max_position_embeddings, 1024);
  EXPECT_DOUBLE_EQ(yarn->rope.beta_fast, 32.0);
  EXPECT_TRUE(yarn->rope.truncate);
  // factor null: max_position_embeddings / original_max_position_embeddings.
  auto implicit = Parse("{" + base + R"(, "rope_parameters": {"rope_type": "yarn",
    "factor": null, "original_max_position_embeddings": 1024, "truncate": false}})");
  ASSERT_TRUE(implicit.ok()) << implicit.status().ToString();
  EXPECT_DOUBLE_EQ(implicit->rope.factor, 4.0);
  EXPECT_FALSE(implicit->rope.truncate);
  // dynamic rescales from max_position_embeddings.
  auto dyn = Parse("{" + base + R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
  ASSERT_TRUE(dyn.ok()) << dyn.status().ToString();
  EXPECT_EQ(dyn->rope.type, "dynamic");
  EXPECT_EQ(dyn->rope.original_max_position_embeddings, 4096);
  EXPECT_TRUE(SequenceLengthProblem(*dyn, 4096).ok());
  Status too_long = SequenceLengthProblem(*dyn, 4097);
  EXPECT_EQ(too_long.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.message().find("\"dynamic\""), std::string::npos) << too_long.message();
  // A top-level original_max_position_embeddings wins over the parameters' one.
  auto l3 = Parse("{" + base + R"(, "original_max_position_embeddings": 2048, "rope_scaling":
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(l3.ok()) << l3.status().ToString();
  EXPECT_EQ(l3->rope.original_max_position_embeddings, 2048);
  // rope_scaling wins over rope_parameters (`rope_scaling or rope_parameters`).
  auto both = Parse("{" + base + R"(, "rope_parameters": {"rope_type": "default",
    "rope_theta": 5.0}, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "rope_theta": 7.0})");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->rope.type, "linear");
  EXPECT_DOUBLE_EQ(both->rope.theta, 7.0);
}

TEST(ModelConfigTest, SupportedFamiliesComeFromTheTable) {
  std::vector<std::string> types;
  for (const FamilyInfo& f : SupportedFamilies()) {
    types.push_back(f.model_type);
    EXPECT_FALSE(f.architectures.empty()) << f.model_type;
    EXPECT_FALSE(f.description.empty()) << f.model_type;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"llama", "mistral", "qwen2", "qwen3", "gemma2",
                                             "gemma3_text", "gemma3", "phi3", "olmo2", "gpt2",
                                             "qwen3_moe", "olmoe", "mixtral", "gpt_oss"}));
  EXPECT_EQ(SupportedModelTypes(),
            "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, gemma3, phi3, olmo2, gpt2, "
            "qwen3_moe, olmoe, mixtral, gpt_oss");
}

TEST(ModelConfigTest, ParameterCountsFromTheParts) {
  auto c = Parse(kGemma2_2B);
  ASSERT_TRUE(c.ok());
  const ParamCounts n = CountParams(*c);
  EXPECT_EQ(n.total, 2614341888);  // transformers' num_parameters() for gemma-2-2b
  EXPECT_EQ(n.lm_head, 0);
  EXPECT_EQ(n.final_norm, 2304);
}

TEST(ModelConfigTest, RejectsUnsupportedByName) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)";
  auto llama = [&](const std::string& extra) {
    return "{" + base + R"(, "model_type": "llama", )" + extra + "}";
  };
  ExpectRejected("{" + base + R"(, "model_type": "gemma"})",
                 "model_type: unsupported model type \"gemma\" (supported: llama, mistral");
  ExpectRejected(llama(R"("architectures": ["LlamaForSequenceClassification"])"),
                 "LlamaForSequenceClassification");
  ExpectRejected(llama(R"("architectures": ["MistralForCausalLM"])"),
                 "architectures: unsupported architecture \"MistralForCausalLM\" for "
                 "model_type llama");
  ExpectRejected(llama(R"("rope_scaling": {"rope_type": "mrope", "factor": 4.0})"),
                 "rope_scaling.rope_type: \"mrope\" is not supported");
  ExpectRejected(llama(R"("rope_parameters": {"type": "su", "factor": 4.0})"),
                 "rope_parameters.type: \"su\" is not supported");
  ExpectRejected(llama(R"("rope_scaling": {"rope_type": "yarn"})"), "rope_scaling.factor");
  ExpectRejected(llama(R"("rope_scaling": {"rope_type": "linear", "factor": -2})"),
                 "rope_scaling.factor: must be a finite number > 0, got -2");
  ExpectRejected(llama(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8})"),
                 "high_freq_factor");
  ExpectRejected(llama(R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1.0],
    "long_factor": [1.0, 2.0, 3.0, 4.0]})"),
                 "rope_scaling.short_factor: expected a list of 4 numbers");
  ExpectRejected(llama(R"("hidden_act": "gelu")"), "hidden_act: \"gelu\" is not supported");
  ExpectRejected(llama(R"("partial_rotary_factor": 0.5)"),
                 "partial_rotary_factor: 0.5 is not supported");
  ExpectRejected(llama(R"("rope_parameters": {"rope_type": "default",
                               "partial_rotary_factor": 0.5})"),
                 "rope_parameters.partial_rotary_factor: 0.5 is not supported");
  ExpectRejected(R"({"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 3})",
                 "num_key_value_heads: must divide num_attention_heads (4)");
  // Qwen2Config's num_key_value_heads default (32) does not divide 4 heads either.
  ExpectRejected(R"({"model_type": "qwen2", "num_attention_heads": 4})", "num_key_value_heads");
  ExpectRejected(llama(R"("head_dim": 7)"), "head_dim: must be even");
  ExpectRejected(llama(R"("hidden_size": "32")"), "hidden_size");
  ExpectRejected(llama(R"("is_causal": false)"), "is_causal: false is not supported");
  ExpectRejected(llama(R"("quantization_config": {"quant_method": "bitsandbytes"})"),
                 "quantization_config: quantized checkpoints are not supported");
  ExpectRejected(llama(R"("layer_types": ["sliding_attention", "full_attention"])"),
                 "layer_types: [\"sliding_attention\",\"full_attention\"] is not supported: "
                 "LlamaForCausalLM has no sliding-window layers");
  ExpectRejected("{" + base + R"(, "model_type": "mistral", "sliding_window": 8, "layer_types":
    ["sliding_attention", "full_attention"]})",
                 "MistralForCausalLM applies sliding_window to every layer");
  ExpectRejected("{" + base + R"(, "model_type": "qwen2", "layer_types": ["full_attention"]})",
                 "layer_types: expected a list of num_hidden_layers (2)");
  ExpectRejected("{" + base + R"(, "model_type": "qwen2", "layer_types": ["full_attention",
    "chunked_attention"]})",
                 "layer_types[1]: unsupported layer type \"chunked_attention\"");
  ExpectRejected("{" + base + R"(, "model_type": "gemma2", "hidden_activation": "gelu"})",
                 "hidden_activation: \"gelu\" is not supported: gemma2's GeGLU part needs "
                 "gelu_pytorch_tanh");
  ExpectRejected("{" + base + R"(, "model_type": "gemma2", "sliding_window": null})",
                 "sliding_window: null, but layer types include sliding_attention");
  ExpectRejected("{" + base + R"(, "model_type": "gemma3_text",
    "use_bidirectional_attention": true})",
                 "use_bidirectional_attention: true is not supported");
  ExpectRejected("{" + base + R"(, "model_type": "gemma3_text", "rope_parameters":
    {"rope_type": "default", "rope_theta": 10000.0}})",
                 "expected only full_attention and sliding_attention entries");
  ExpectRejected("{" + base + R"(, "model_type": "gemma3_text", "rope_parameters":
    {"full_attention": {"rope_type": "yarn", "factor": 2.0, "truncate": false}}})",
                 "rope_parameters.full_attention.truncate: false is not supported");
  ExpectRejected("{" + base + R"(, "model_type": "gemma3_text", "rope_scaling":
    {"rope_type": "linear", "factor": 2.0}, "rope_parameters": {"full_attention":
    {"rope_type": "default"}}})",
                 "rope_scaling: given together with rope_parameters.full_attention");
  ExpectRejected("{" + base + R"(, "model_type": "phi3", "partial_rotary_factor": 0.1})",
                 "partial_rotary_factor: gives 0 rotary dimensions");
  ExpectRejected("{" + base + R"(, "model_type": "phi3", "partial_rotary_factor": 0.4})",
                 "gives 3 rotary dimensions of head_dim 8; need an even number");
  ExpectRejected("{" + base + R"(, "model_type": "phi3", "rope_scaling":
    {"rope_type": "linear", "factor": 2.0}})",
                 "rope_scaling.rope_type: \"linear\" is not supported: phi3 takes default or "
                 "longrope");
  ExpectRejected(R"({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]})",
                 "text_config: required object is missing");
  ExpectRejected(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma2"}})",
                 "text_config.model_type: expected \"gemma3_text\", got \"gemma2\"");
  ExpectRejected(R"({"model_type": "gemma3", "text_config": {"hidden_activation": "relu"}})",
                 "text_config.hidden_activation: \"relu\" is not supported");
  ExpectRejected(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 32, "n_layer": 1,
    "n_head": 4, "n_positions": 8, "scale_attn_by_inverse_layer_idx": true})",
                 "scale_attn_by_inverse_layer_idx: true is not supported");
  ExpectRejected(R"({"model_type": "gpt2", "vocab_size": 10, "n_embd": 32, "n_layer": 1,
    "n_head": 4, "n_positions": 8, "activation_function": "relu"})",
                 "activation_function: \"relu\" is not supported");
  ExpectRejected("[1, 2]", "not a JSON object");
  ExpectRejected("{", "not valid JSON");
}

TEST(ModelConfigTest, TransformersDefaultsFillAbsentDimensions) {
  // LlamaConfig() is Llama-2-7B's shape; the overflow check still bounds what is given.
  auto c = Parse(R"({"model_type": "llama"})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_layers, 32);
  EXPECT_EQ(CountParams(*c).total, 6738415616);
  ExpectRejected(R"({"model_type": "llama", "vocab_size": 16777216, "hidden_size": 16777216,
    "num_hidden_layers": 16777216, "intermediate_size": 16777216})",
                 "parameters, beyond the 2^50");
}

}  // namespace
}  // namespace offloadd::engine
