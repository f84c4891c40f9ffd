#pragma once
// Hugging Face config.json -> ModelConfig for the architectures the engine runs:
//   Llama family (model_type llama / mistral / qwen2): RMSNorm, RoPE, GQA, SwiGLU.
//   GPT-2 (model_type gpt2): LayerNorm, learned positions, fused Conv1D c_attn, gelu_new.
// Anything the engine would silently compute differently (other architectures, rope types,
// activations, sliding windows, partial rotary, MLP bias...) is rejected with its key and value
// named. No LibTorch here. Plain value type.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace offloadd::engine {

enum class Architecture { kLlama, kGpt2 };

struct RopeConfig {
  // "default", "linear" or "llama3".
  std::string type = "default";
  double theta = 10000.0;
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string model_type;  // as in config.json: llama, mistral, qwen2, gpt2
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double norm_eps = 1e-6;  // rms_norm_eps (Llama) or layer_norm_epsilon (GPT-2)
  double initializer_range = 0.02;  // std of the normal init (random-init models)
  bool tie_word_embeddings = false;
  bool qkv_bias = false;       // Qwen2 always; Llama with attention_bias
  bool o_bias = false;         // Llama with attention_bias
  int64_t sliding_window = 0;  // Mistral; 0 = none. Sequences longer than it are refused.
  RopeConfig rope;             // Llama family only
  std::string hidden_act;      // "silu" or "gelu_new"
  std::vector<int64_t> eos_token_ids;
  // The nonzero dropout probabilities Hugging Face's modeling code applies in training for this
  // architecture (GPT-2: embd_pdrop, attn_pdrop, resid_pdrop; Llama/Mistral/Qwen2:
  // attention_dropout), in config.json order. The engine applies no dropout, so a job on such a
  // model is refused unless it says `dropout: disable` (DropoutProblem).
  std::vector<std::pair<std::string, double>> dropout;
  int64_t bos_token_id = -1;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses config.json text; `origin` (a path) prefixes error messages.
StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view origin);
// Reads and parses `dir/config.json`.
StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// "resid_pdrop=0.1, attn_pdrop=0.1" for the model's dropout; empty when it has none.
std::string DescribeDropout(const ModelConfig& c);
// FAILED_PRECONDITION naming every dropout setting when the model trains with dropout in Hugging
// Face and the job has not said `dropout: disable`; OK otherwise.
Status DropoutProblem(const ModelConfig& c, bool dropout_disabled);

}  // namespace offloadd::engine
