// The family table: each supported model_type's config.json -> ModelConfig parts, as data (one
// FamilyRule row per family) plus the few rules transformers' config classes apply (sliding layer
// types, RoPE parameter standardisation). Defaults are those of transformers' config classes, since
// real config.json files rely on them (Gemma 3's text_config lists a handful of keys).
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/config_reader.h"
#include "engine/families_internal.h"
#include "engine/model_config.h"

namespace offloadd::engine {
namespace {

using internal::Biases;
using internal::FamilyRule;
using internal::ParseRope;
using internal::RopeKind;
using internal::Sliding;

using json = nlohmann::json;

// Llama and the families that keep its parts (RMSNorm pre-norm, SwiGLU, RoPE) and change their
// biases, sliding windows or q/k norm.
std::vector<FamilyRule> LlamaRules() {
  return {
      {.model_type = "llama",
       .architectures = {"LlamaForCausalLM"},
       .description = "Llama 2 / 3.x: RMSNorm pre-norm, GQA, SwiGLU, RoPE; attention_bias and "
                      "mlp_bias",
       .biases = Biases::kAttentionBias,
       .mlp_bias_key = true,
       .vocab = 32000,
       .hidden = 4096,
       .intermediate = 11008,
       .layers = 32,
       .heads = 32,
       .max_pos = 2048},
      {.model_type = "mistral",
       .architectures = {"MistralForCausalLM"},
       .description = "Mistral: Llama's parts with a sliding window on every layer",
       .vocab = 32000,
       .hidden = 4096,
       .intermediate = 14336,
       .layers = 32,
       .heads = 32,
       .kv_heads = 8,
       .max_pos = 131072,
       .sliding = Sliding::kEveryLayer,
       .window = 4096},
      {.model_type = "qwen2",
       .architectures = {"Qwen2ForCausalLM"},
       .description = "Qwen2 / 2.5: q/k/v biases; sliding windows above max_window_layers",
       .biases = Biases::kQkv,
       .vocab = 151936,
       .hidden = 4096,
       .intermediate = 22016,
       .layers = 32,
       .heads = 32,
       .kv_heads = 32,
       .max_pos = 32768,
       .sliding = Sliding::kQwen,
       .window = 4096},
      {.model_type = "qwen3",
       .architectures = {"Qwen3ForCausalLM"},
       .description = "Qwen3: per-head q/k RMSNorm, head_dim independent of the width",
       .qk_norm = QkNorm::kPerHead,
       .biases = Biases::kAttentionBias,
       .vocab = 151936,
       .hidden = 4096,
       .intermediate = 22016,
       .layers = 32,
       .heads = 32,
       .kv_heads = 32,
       .head_dim = 128,
       .max_pos = 32768,
       .sliding = Sliding::kQwen,
       .window = 4096},
  };
}

// Gemma 2 and 3: RMSNorm (1 + w) sandwich norms, GeGLU, alternating sliding layers; Gemma 3's
// multimodal checkpoint is a wrapper around its text_config.
std::vector<FamilyRule> GemmaRules() {
  return {
      {.model_type = "gemma2",
       .architectures = {"Gemma2ForCausalLM"},
       .description =
           "Gemma 2: RMSNorm (1 + w) sandwich norms, GeGLU (tanh), query_pre_attn_scalar, "
           "attention and final logit soft-capping, alternating sliding layers",
       .norm = NormKind::kRmsOneOffset,
       .placement = NormPlacement::kSandwich,
       .mlp = MlpKind::kGeGluTanh,
       .act_key = "hidden_activation",
       .act = "gelu_pytorch_tanh",
       .biases = Biases::kAttentionBias,
       .gemma = true,
       .attn_softcap = 50.0,
       .final_softcap = 30.0,
       .vocab = 256000,
       .hidden = 2304,
       .intermediate = 9216,
       .layers = 26,
       .heads = 8,
       .kv_heads = 4,
       .head_dim = 256,
       .max_pos = 8192,
       .tie = true,
       .sliding = Sliding::kAlternating,
       .window = 4096,
       .pattern = 2},
      {.model_type = "gemma3_text",
       .architectures = {"Gemma3ForCausalLM"},
       .description = "Gemma 3 (text): Gemma 2's parts plus per-head q/k norm, 5 local layers per "
                      "global one, local RoPE base 10k",
       .norm = NormKind::kRmsOneOffset,
       .placement = NormPlacement::kSandwich,
       .qk_norm = QkNorm::kPerHead,
       .mlp = MlpKind::kGeGluTanh,
       .act_key = "hidden_activation",
       .act = "gelu_pytorch_tanh",
       .biases = Biases::kAttentionBias,
       .gemma = true,
       .vocab = 262208,
       .hidden = 2304,
       .intermediate = 9216,
       .layers = 26,
       .heads = 8,
       .kv_heads = 4,
       .head_dim = 256,
       .max_pos = 131072,
       .tie = true,
       .sliding = Sliding::kAlternating,
       .window = 4096,
       .pattern = 6,
       .rope = RopeKind::kPerLayerType,
       .theta = 1e6,
       .local_theta = 1e4},
      {.model_type = "gemma3",
       .architectures = {"Gemma3ForConditionalGeneration"},
       .description = "Gemma 3 (multimodal checkpoint): its text_config as gemma3_text; the vision "
                      "tower and projector pass through to the export",
       .tie = true,
       .text_config_of = "gemma3_text"},
  };
}

// Dense decoders that depart further from Llama: fused projections (Phi-3), post-norm (OLMo 2),
// LayerNorm and learned positions (GPT-2).
std::vector<FamilyRule> OtherDenseRules() {
  return {
      {.model_type = "phi3",
       .architectures = {"Phi3ForCausalLM"},
       .description = "Phi-3 / 3.5 / 4-mini: fused qkv_proj and gate_up_proj, partial rotary, "
                      "longrope",
       .fused = true,
       .vocab = 32064,
       .hidden = 3072,
       .intermediate = 8192,
       .layers = 32,
       .heads = 32,
       .max_pos = 4096,
       .eps = 1e-5,
       .sliding = Sliding::kEveryLayer,
       .rope = RopeKind::kPhi3,
       .dropout = {"resid_pdrop", "attention_dropout"}},
      {.model_type = "olmo2",
       .architectures = {"Olmo2ForCausalLM"},
       .description = "OLMo 2: post-norm (after attention and MLP), q/k RMSNorm over the whole "
                      "projection",
       .placement = NormPlacement::kPost,
       .qk_norm = QkNorm::kWhole,
       .biases = Biases::kAttentionBias,
       .vocab = 50304,
       .hidden = 4096,
       .intermediate = 11008,
       .layers = 32,
       .heads = 32,
       .max_pos = 2048,
       .eps = 1e-5},
      {.model_type = "gpt2",
       .architectures = {"GPT2LMHeadModel"},
       .description = "GPT-2: LayerNorm pre-norm, learned positions, Conv1D projections, GELU MLP",
       .norm = NormKind::kLayer,
       .mlp = MlpKind::kGeluMlp,
       .act_key = "activation_function",
       .act = "gelu_new",
       .vocab = 50257,
       .hidden = 768,
       .layers = 12,
       .heads = 12,
       .max_pos = 1024,
       .eps = 1e-5,
       .tie = true,
       .dropout = {"embd_pdrop", "attn_pdrop", "resid_pdrop"}},
  };
}

// Mixtures of experts (engine/families_moe.cc reads their router and expert keys).
std::vector<FamilyRule> MoeRules() {
  return {
      {.model_type = "qwen3_moe",
       .architectures = {"Qwen3MoeForCausalLM"},
       .description = "Qwen3-MoE: Qwen3's attention, softmax top-k router (norm_topk_prob), SwiGLU "
                      "experts, decoder_sparse_step and mlp_only_layers",
       .qk_norm = QkNorm::kPerHead,
       .biases = Biases::kAttentionBias,
       .vocab = 151936,
       .hidden = 2048,
       .intermediate = 6144,
       .layers = 24,
       .heads = 32,
       .kv_heads = 4,
       .max_pos = 32768,
       .moe = MoeDefaults{.family = MoeFamily::kQwen3,
                          .experts = 128,
                          .top_k = 8,
                          .intermediate = 768,
                          .aux_coef = 0.001}},
      {.model_type = "olmoe",
       .architectures = {"OlmoeForCausalLM"},
       .description = "OLMoE: q/k RMSNorm over the projection, softmax top-k router "
                      "(norm_topk_prob), SwiGLU experts on every layer",
       .qk_norm = QkNorm::kWhole,
       .biases = Biases::kAttentionBias,
       .vocab = 50304,
       .hidden = 2048,
       .intermediate = 2048,
       .layers = 16,
       .heads = 16,
       .max_pos = 4096,
       .eps = 1e-5,
       .moe =
           MoeDefaults{.family = MoeFamily::kOlmoe, .experts = 64, .top_k = 8, .aux_coef = 0.01}},
      {.model_type = "mixtral",
       .architectures = {"MixtralForCausalLM"},
       .description = "Mixtral: Mistral's attention, softmax top-k router (always renormalised), "
                      "SwiGLU experts on every layer",
       .vocab = 32000,
       .hidden = 4096,
       .intermediate = 14336,
       .layers = 32,
       .heads = 32,
       .kv_heads = 8,
       .max_pos = 131072,
       .eps = 1e-5,
       .sliding = Sliding::kEveryLayer,
       .theta = 1e6,
       .moe =
           MoeDefaults{.family = MoeFamily::kMixtral, .experts = 8, .top_k = 2, .aux_coef = 0.001}},
      {.model_type = "gpt_oss",
       .architectures = {"GptOssForCausalLM"},
       .description = "gpt-oss: attention sinks and biases, sliding (128) and full layers "
                      "alternating, YaRN; router with bias, top-k softmax, clamped SwiGLU experts "
                      "with biases; MXFP4 experts dequantised on load",
       .biases = Biases::kAttentionBias,
       .attention_bias = true,
       .sinks = true,
       .vocab = 201088,
       .hidden = 2880,
       .intermediate = 2880,
       .layers = 36,
       .heads = 64,
       .kv_heads = 8,
       .head_dim = 64,
       .max_pos = 131072,
       .eps = 1e-5,
       .sliding = Sliding::kAlternating,
       .window = 128,
       .pattern = 2,
       .theta = 150000.0,
       .default_rope = R"({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                           "beta_slow": 1.0, "truncate": false,
                           "original_max_position_embeddings": 4096})",
       .moe =
           MoeDefaults{
               .family = MoeFamily::kGptOss, .experts = 128, .top_k = 4, .aux_coef = 0.001}},
  };
}

// The table, in the order ModelTypes and SupportedFamilies list it.
const std::vector<FamilyRule>& Rules() {
  static const auto* rules = [] {
    auto* all = new std::vector<FamilyRule>();
    for (auto group : {LlamaRules, GemmaRules, OtherDenseRules, MoeRules}) {
      for (FamilyRule& f : group()) all->push_back(std::move(f));
    }
    return all;
  }();
  return *rules;
}

const FamilyRule* FindRule(std::string_view model_type) {
  for (const FamilyRule& f : Rules()) {
    if (f.model_type == model_type) return &f;
  }
  return nullptr;
}

// ---- sliding layers -----------------------------------------------------------------------------

Status ParseSliding(const FamilyRule& f, const ConfigReader& r, ModelConfig* c) {
  const int64_t n = c->num_layers;
  // The window: absent means the config class default, null means none.
  std::optional<int64_t> window;
  auto read_window = [&]() -> Status {
    if (r.Has("sliding_window")) {
      ASSIGN_OR_RETURN(int64_t w, r.Int("sliding_window"));
      window = w;
    } else if (!r.Present("sliding_window") && f.window > 0) {
      window = f.window;
    }
    return OkStatus();
  };
  std::vector<bool> computed(n, false);  // the layer types transformers computes without the key
  switch (f.sliding) {
    case Sliding::kNone:
      break;
    case Sliding::kEveryLayer:
      RETURN_IF_ERROR(read_window());
      computed.assign(n, window.has_value());
      break;
    case Sliding::kQwen: {
      ASSIGN_OR_RETURN(bool use, r.Bool("use_sliding_window", false));
      if (use) RETURN_IF_ERROR(read_window());
      ASSIGN_OR_RETURN(int64_t max_window_layers, r.Int("max_window_layers", 28, 0));
      for (int64_t i = 0; i < n; ++i) computed[i] = window.has_value() && i >= max_window_layers;
      break;
    }
    case Sliding::kAlternating: {
      RETURN_IF_ERROR(read_window());
      ASSIGN_OR_RETURN(int64_t pattern, r.Int("sliding_window_pattern", f.pattern));
      for (int64_t i = 0; i < n; ++i) computed[i] = (i + 1) % pattern != 0;
      break;
    }
  }
  std::vector<bool> types = computed;
  if (r.Has("layer_types")) {
    const json& lt = r.raw().at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != n) {
      return r.Error("layer_types", "expected a list of num_hidden_layers (" + std::to_string(n) +
                                        ") layer types");
    }
    for (int64_t i = 0; i < n; ++i) {
      const json& t = lt[i];
      if (t != "full_attention" && t != "sliding_attention") {
        return r.Error("layer_types[" + std::to_string(i) + "]",
                       "unsupported layer type " + t.dump() +
                           " (supported: full_attention, sliding_attention)");
      }
      types[i] = t == "sliding_attention";
    }
    // Families whose modeling code has no per-layer types ignore the key: refuse a list that
    // asks for layers other than those transformers would run.
    if ((f.sliding == Sliding::kNone || f.sliding == Sliding::kEveryLayer) && types != computed) {
      return r.Unsupported("layer_types", c->architecture + " " +
                                              (f.sliding == Sliding::kNone
                                                   ? "has no sliding-window layers"
                                                   : "applies sliding_window to every layer") +
                                              " and ignores layer_types");
    }
  }
  bool any = false;
  for (int64_t i = 0; i < n; ++i) any = any || types[i];
  if (!any) return OkStatus();
  if (!window) {
    if (f.sliding == Sliding::kAlternating) {
      return r.Error("sliding_window", "null, but layer types include sliding_attention");
    }
    return OkStatus();  // Qwen: layer types without a window attend to everything
  }
  c->sliding = types;
  c->sliding_window = *window;
  return OkStatus();
}

// ---- names --------------------------------------------------------------------------------------

TensorNames NamesFor(const FamilyRule& f, const ModelConfig& c) {
  TensorNames n;
  if (c.attention_sinks) n.sinks = "self_attn.sinks";
  if (c.qk_norm != QkNorm::kNone) {
    n.q_norm = "self_attn.q_norm";
    n.k_norm = "self_attn.k_norm";
  }
  if (c.norm_placement == NormPlacement::kSandwich) {
    n.pre_mlp_norm = "pre_feedforward_layernorm";
    n.post_mlp_norm = "post_feedforward_layernorm";
  } else if (c.norm_placement == NormPlacement::kPost) {
    n.input_norm.clear();
    n.post_mlp_norm = "post_feedforward_layernorm";
  }
  if (f.fused) {
    n.q.clear(), n.k.clear(), n.v.clear();
    n.qkv = "self_attn.qkv_proj";
    n.gate.clear(), n.up.clear();
    n.gate_up = "mlp.gate_up_proj";
  }
  return n;
}

TensorNames Gpt2Names() {
  // Hub GPT-2 files have no prefix; save_pretrained writes "transformer." (Model::Load adds it).
  TensorNames n;
  n.embed = "wte.weight";
  n.position_embed = "wpe.weight";
  n.final_norm = "ln_f.weight";
  n.final_norm_bias = "ln_f.bias";
  n.lm_head = "lm_head.weight";
  n.layer_prefix = "h.";
  n.input_norm = "ln_1";
  n.post_attn_norm = "ln_2";
  n.q.clear(), n.k.clear(), n.v.clear();
  n.qkv = "attn.c_attn";
  n.o = "attn.c_proj";
  n.gate.clear();
  n.up = "mlp.c_fc";
  n.down = "mlp.c_proj";
  return n;
}

// ---- families -----------------------------------------------------------------------------------

Status ParseTokenIds(const ConfigReader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->bos_token_id, r.Int("bos_token_id", -1, -1, int64_t{1} << 40));
  if (c->arch == Architecture::kLlama) {  // GPT-2's wte has no padding_idx
    ASSIGN_OR_RETURN(int64_t pad, r.Int("pad_token_id", -1, -1, int64_t{1} << 40));
    c->pad_token_id = pad < c->vocab_size ? pad : -1;
  }
  if (!r.Has("eos_token_id")) return OkStatus();
  const json& e = r.raw().at("eos_token_id");
  if (e.is_number_integer()) {
    c->eos_token_ids.push_back(e.get<int64_t>());
  } else if (e.is_array()) {
    for (const json& x : e) {
      if (!x.is_number_integer()) return r.Error("eos_token_id", "expected integers");
      c->eos_token_ids.push_back(x.get<int64_t>());
    }
  } else {
    return r.Error("eos_token_id", "expected an integer or a list, got " + e.dump());
  }
  return OkStatus();
}

// Only the keys the family's CausalLM modeling code applies: GPT-2's summary_first_dropout belongs
// to GPT2DoubleHeadsModel, Phi-3's embd_pdrop to no module.
Status ParseDropout(const FamilyRule& f, const ConfigReader& r, ModelConfig* c) {
  const bool gpt2 = f.model_type == "gpt2";
  for (const std::string& key : f.dropout) {
    // transformers' defaults: 0.1 for GPT-2's three, 0.0 elsewhere.
    ASSIGN_OR_RETURN(double p, r.Double(key, gpt2 ? 0.1 : 0.0));
    if (!(p >= 0 && p < 1)) return r.Error(key, "must be in [0, 1)");
    if (p > 0) c->dropout.emplace_back(key, p);
  }
  return OkStatus();
}

// Keys any family may carry that would make transformers compute something else. gpt-oss ships
// its experts in MXFP4 (quantization_config.quant_method "mxfp4"): they are dequantised on load.
Status RefuseOddities(const FamilyRule& f, const ConfigReader& r) {
  if (r.Has("quantization_config") && f.model_type == "gpt_oss") {
    ASSIGN_OR_RETURN(ConfigReader q, r.Child("quantization_config"));
    ASSIGN_OR_RETURN(std::string method, q.String("quant_method", std::nullopt));
    if (method != "mxfp4") {
      return q.Unsupported("quant_method",
                           "gpt-oss checkpoints are read in mxfp4 (dequantised to "
                           "the training dtype), F32, F16 or BF16");
    }
  } else if (r.Has("quantization_config")) {
    return r.Error("quantization_config",
                   "quantized checkpoints are not supported (offloadd "
                   "trains F32, F16 or BF16 weights)");
  }
  ASSIGN_OR_RETURN(bool causal, r.Bool("is_causal", true));
  if (!causal) return r.Unsupported("is_causal", "offloadd trains causal language models");
  ASSIGN_OR_RETURN(bool bidirectional, r.Bool("use_bidirectional_attention", false));
  if (bidirectional) {
    return r.Unsupported("use_bidirectional_attention", "offloadd trains causal attention");
  }
  return OkStatus();
}

Status ParseGpt2(const FamilyRule& f, const ConfigReader& r, ModelConfig* c) {
  c->arch = Architecture::kGpt2;
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size", f.vocab));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("n_embd", f.hidden));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("n_layer", f.layers));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("n_head", f.heads));
  ASSIGN_OR_RETURN(c->initializer_range, r.Double("initializer_range", 0.02));
  if (c->hidden_size % c->num_heads != 0) return r.Error("n_embd", "not divisible by n_head");
  c->num_kv_heads = c->num_heads;
  c->head_dim = c->hidden_size / c->num_heads;
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("n_inner", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("n_positions", f.max_pos));
  ASSIGN_OR_RETURN(c->norm_eps, r.Double("layer_norm_epsilon", f.eps));
  ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", f.tie));
  ASSIGN_OR_RETURN(c->hidden_act, r.String("activation_function", "gelu_new"));
  if (c->hidden_act == "gelu_pytorch_tanh") c->hidden_act = "gelu_new";  // same function
  if (c->hidden_act != "gelu_new") {
    return r.Unsupported("activation_function", "the GELU MLP needs gelu_new");
  }
  ASSIGN_OR_RETURN(bool scale, r.Bool("scale_attn_weights", true));
  if (!scale) return r.Unsupported("scale_attn_weights", "attention is scaled by 1/sqrt(head_dim)");
  for (const char* key :
       {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"}) {
    ASSIGN_OR_RETURN(bool on, r.Bool(key, false));
    if (on) return r.Unsupported(key, "GPT2LMHeadModel's default (false) only");
  }
  c->norm = f.norm;
  c->mlp = f.mlp;
  c->qkv_bias = c->o_bias = c->mlp_bias = true;
  c->attn_scale = 1.0 / std::sqrt(static_cast<double>(c->head_dim));
  c->names = Gpt2Names();
  return OkStatus();
}

Status ParseRotary(const FamilyRule& f, const ConfigReader& r, ModelConfig* c) {
  c->arch = Architecture::kLlama;
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size", f.vocab));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("hidden_size", f.hidden));
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("intermediate_size", f.intermediate));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("num_hidden_layers", f.layers));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("num_attention_heads", f.heads));
  ASSIGN_OR_RETURN(c->num_kv_heads,
                   r.Int("num_key_value_heads", f.kv_heads > 0 ? f.kv_heads : c->num_heads));
  if (c->num_heads % c->num_kv_heads != 0) {
    return r.Error("num_key_value_heads",
                   "must divide num_attention_heads (" + std::to_string(c->num_heads) + ")");
  }
  if (!r.Has("head_dim") && f.head_dim == 0 && c->hidden_size % c->num_heads != 0) {
    return r.Error("hidden_size", "not divisible by num_attention_heads and no head_dim given");
  }
  ASSIGN_OR_RETURN(c->head_dim,
                   r.Int("head_dim", f.head_dim > 0 ? f.head_dim : c->hidden_size / c->num_heads));
  if (c->head_dim % 2 != 0) return r.Error("head_dim", "must be even for rotary embeddings");
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("max_position_embeddings", f.max_pos));
  ASSIGN_OR_RETURN(c->norm_eps, r.Double("rms_norm_eps", f.eps));
  if (!(c->norm_eps >= 0 && c->norm_eps < 1)) return r.Error("rms_norm_eps", "must be in [0, 1)");
  ASSIGN_OR_RETURN(c->initializer_range, r.Double("initializer_range", 0.02));
  ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", f.tie));

  // Parts.
  c->norm = f.norm;
  c->norm_placement = f.placement;
  c->qk_norm = f.qk_norm;
  c->mlp = f.mlp;
  ASSIGN_OR_RETURN(c->hidden_act, r.String(f.act_key, f.act));
  if (c->hidden_act != f.act) {
    return r.Unsupported(f.act_key, c->model_type + "'s " +
                                        (f.mlp == MlpKind::kSwiGlu ? "SwiGLU" : "GeGLU") +
                                        " part needs " + f.act);
  }
  if (f.biases == Biases::kQkv) {
    c->qkv_bias = true;
  } else if (f.biases == Biases::kAttentionBias) {
    ASSIGN_OR_RETURN(bool bias, r.Bool("attention_bias", f.attention_bias));
    c->qkv_bias = c->o_bias = bias;
  }
  if (f.mlp_bias_key) {
    ASSIGN_OR_RETURN(c->mlp_bias, r.Bool("mlp_bias", false));
  }
  c->attn_scale = std::pow(static_cast<double>(c->head_dim), -0.5);
  if (f.gemma) {
    ASSIGN_OR_RETURN(double scalar, r.Positive("query_pre_attn_scalar", 256.0));
    c->attn_scale = std::pow(scalar, -0.5);
    c->scale_embeddings = true;
    // Absent: the config class default; null: no soft-capping.
    auto softcap = [&](const char* key, double def, double* out) -> Status {
      if (!r.Present(key)) {
        *out = def;
        return OkStatus();
      }
      if (!r.Has(key)) return OkStatus();
      ASSIGN_OR_RETURN(*out, r.Positive(key));
      return OkStatus();
    };
    RETURN_IF_ERROR(softcap("attn_logit_softcapping", f.attn_softcap, &c->attn_logit_softcap));
    RETURN_IF_ERROR(softcap("final_logit_softcapping", f.final_softcap, &c->final_logit_softcap));
  }
  c->attention_sinks = f.sinks;
  RETURN_IF_ERROR(ParseSliding(f, r, c));
  RETURN_IF_ERROR(ParseRope(f, r, c));
  c->names = NamesFor(f, *c);
  return f.moe ? ParseMoe(*f.moe, r, c) : OkStatus();
}

Status CheckArchitectures(const FamilyRule& f, const ConfigReader& r, ModelConfig* c) {
  c->architecture = f.architectures.front();
  if (!r.Has("architectures")) return OkStatus();
  const json& a = r.raw().at("architectures");
  if (!a.is_array()) return r.Error("architectures", "expected a list");
  std::string accepted;
  for (const std::string& name : f.architectures) accepted += (accepted.empty() ? "" : ", ") + name;
  for (size_t i = 0; i < a.size(); ++i) {
    const json& name = a[i];
    bool known = false;
    for (const std::string& k : f.architectures) known = known || (name.is_string() && name == k);
    if (!known) {
      return r.Error("architectures", "unsupported architecture " + name.dump() +
                                          " for model_type " + f.model_type +
                                          " (supported: " + accepted + ")");
    }
    if (i == 0) c->architecture = name.get<std::string>();
  }
  return OkStatus();
}

std::string ModelTypes() {
  std::string out;
  for (const FamilyRule& f : Rules()) out += (out.empty() ? "" : ", ") + f.model_type;
  return out;
}

}  // namespace

Status ParseFamily(const ConfigReader& r, ModelConfig* c) {
  const FamilyRule* f = FindRule(c->model_type);
  if (f == nullptr) {
    return r.Error("model_type", "unsupported model type \"" + c->model_type +
                                     "\" (supported: " + ModelTypes() + ")");
  }
  RETURN_IF_ERROR(CheckArchitectures(*f, r, c));
  RETURN_IF_ERROR(RefuseOddities(*f, r));
  if (!f->text_config_of.empty()) {
    // A multimodal checkpoint: its language model is text_config's family, stored under
    // "language_model." as transformers' save_pretrained writes it (Model::Load also accepts
    // "model.language_model."); the rest passes through to the export.
    ASSIGN_OR_RETURN(ConfigReader text, r.Child("text_config"));
    ASSIGN_OR_RETURN(std::string text_type, text.String("model_type", f->text_config_of));
    if (text_type != f->text_config_of) {
      return text.Error("model_type",
                        "expected \"" + f->text_config_of + "\", got \"" + text_type + "\"");
    }
    const FamilyRule* tf = FindRule(f->text_config_of);
    RETURN_IF_ERROR(RefuseOddities(*tf, text));
    RETURN_IF_ERROR(ParseRotary(*tf, text, c));
    // The wrapper's own tie_word_embeddings decides (PreTrainedModel reads the top config).
    ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", f->tie));
    // Gemma3ForConditionalGeneration's forward applies no final-logit soft-capping (only
    // Gemma3ForCausalLM reads text_config.final_logit_softcapping).
    c->final_logit_softcap = 0;
    TensorNames& n = c->names;
    n.embed = "language_model." + n.embed;
    n.final_norm = "language_model." + n.final_norm;
    n.layer_prefix = "language_model." + n.layer_prefix;
    n.lm_head = "language_model." + n.lm_head;
    n.passthrough_prefixes = {"vision_tower.", "multi_modal_projector."};
    RETURN_IF_ERROR(ParseTokenIds(r.Has("eos_token_id") ? r : text, c));
    return ParseDropout(*tf, text, c);
  }
  if (f->model_type == "gpt2") {
    RETURN_IF_ERROR(ParseGpt2(*f, r, c));
  } else {
    RETURN_IF_ERROR(ParseRotary(*f, r, c));
  }
  RETURN_IF_ERROR(ParseTokenIds(r, c));
  return ParseDropout(*f, r, c);
}

const std::vector<FamilyInfo>& SupportedFamilies() {
  static const auto* families = [] {
    auto* out = new std::vector<FamilyInfo>();
    for (const FamilyRule& f : Rules()) {
      out->push_back({f.model_type, f.architectures, f.description});
    }
    return out;
  }();
  return *families;
}

std::string SupportedModelTypes() { return ModelTypes(); }

}  // namespace offloadd::engine
