#pragma once
// The family table's row type (engine/families.cc), shared with the files that parse parts of a
// family's config: engine/families_rope.cc.
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config_reader.h"
#include "engine/model_config.h"

namespace offloadd::engine::internal {

enum class Biases { kNone, kQkv, kAttentionBias };  // kAttentionBias: q, k, v and o
// kEveryLayer: one window for every layer (Mistral, Phi-3); kQwen: use_sliding_window and
// max_window_layers; kAlternating: layer_types, else every layer but each pattern-th slides.
enum class Sliding { kNone, kEveryLayer, kQwen, kAlternating };
// kPhi3: default or longrope ("su" and "yarn" mean longrope), partial_rotary_factor, the top-level
// original_max_position_embeddings; kPerLayerType: Gemma 3's full/sliding parameter pair.
enum class RopeKind { kSingle, kPhi3, kPerLayerType };

struct FamilyRule {
  std::string model_type = {};
  std::vector<std::string> architectures = {};
  std::string description = {};
  NormKind norm = NormKind::kRms;
  NormPlacement placement = NormPlacement::kPre;
  QkNorm qk_norm = QkNorm::kNone;
  MlpKind mlp = MlpKind::kSwiGlu;
  std::string act_key = "hidden_act";
  std::string act = "silu";  // the one activation value the parts implement
  Biases biases = Biases::kNone;
  bool attention_bias = false;  // kAttentionBias: the attention_bias key's default
  bool sinks = false;           // gpt-oss's attention sinks (self_attn.sinks)
  bool mlp_bias_key = false;
  bool fused = false;  // Phi-3's qkv_proj and gate_up_proj
  bool gemma = false;  // query_pre_attn_scalar, sqrt(hidden) embedding scale, logit softcaps
  double attn_softcap = 0, final_softcap = 0;  // when the keys are absent (null: none)
  // transformers' config class defaults.
  int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0;
  int64_t kv_heads = 0;  // 0: num_attention_heads
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_pos = 0;
  double eps = 1e-6;
  bool tie = false;
  Sliding sliding = Sliding::kNone;
  int64_t window = 0;   // sliding_window when the key is absent (0: none)
  int64_t pattern = 0;  // kAlternating without layer_types
  RopeKind rope = RopeKind::kSingle;
  double theta = 10000.0, local_theta = 0;
  // The RoPE parameters the config class fills in when config.json has none (JSON text; empty:
  // default RoPE).
  std::string default_rope = {};
  std::vector<std::string> dropout = {"attention_dropout"};
  std::string text_config_of = {};      // a multimodal wrapper: its text_config is this family
  std::optional<MoeDefaults> moe = {};  // a mixture of experts (engine/families_moe.cc)
};

// RoPE as transformers' config classes and ROPE_INIT_FUNCTIONS read it (engine/families_rope.cc).
Status ParseRope(const FamilyRule& f, const ConfigReader& r, ModelConfig* c);

}  // namespace offloadd::engine::internal
