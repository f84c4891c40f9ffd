#include "engine/model_config.h"

#include <nlohmann/json.hpp>
#include <cmath>
#include <cstdio>
#include <optional>
#include <span>

#include "engine/file_util.h"

namespace offloadd::engine {
namespace {

using json = nlohmann::json;

// Small typed accessors that name the key and the file on error.
class Reader {
 public:
  Reader(const json& j, std::string_view origin, std::string prefix = "")
      : j_(j), origin_(origin), prefix_(std::move(prefix)) {}

  Status Error(std::string_view key, const std::string& what) const {
    return InvalidArgumentError(std::string(origin_) + ": " + prefix_ + std::string(key) + ": " +
                                what);
  }
  bool Has(std::string_view key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  // Dimensions beyond 2^24 (16.7M) are refused: real models stay far below, and the size
  // arithmetic downstream (parameter counts, memory estimates) must not overflow.
  StatusOr<int64_t> Int(std::string_view key, std::optional<int64_t> def = std::nullopt,
                        int64_t min = 1, int64_t max = int64_t{1} << 24) const {
    if (!Has(key)) {
      if (def) return *def;
      return Error(key, "required integer is missing");
    }
    const json& v = j_.at(std::string(key));
    if (!v.is_number_integer()) return Error(key, "expected an integer, got " + v.dump());
    int64_t x = v.get<int64_t>();
    if (x < min) return Error(key, "must be >= " + std::to_string(min) + ", got " + v.dump());
    if (x > max) return Error(key, "must be <= " + std::to_string(max) + ", got " + v.dump());
    return x;
  }
  StatusOr<double> Double(std::string_view key, std::optional<double> def = std::nullopt) const {
    if (!Has(key)) {
      if (def) return *def;
      return Error(key, "required number is missing");
    }
    const json& v = j_.at(std::string(key));
    if (!v.is_number()) return Error(key, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  StatusOr<bool> Bool(std::string_view key, bool def) const {
    if (!Has(key)) return def;
    const json& v = j_.at(std::string(key));
    if (!v.is_boolean()) return Error(key, "expected true/false, got " + v.dump());
    return v.get<bool>();
  }
  StatusOr<std::string> String(std::string_view key, std::optional<std::string> def) const {
    if (!Has(key)) {
      if (def) return *def;
      return Error(key, "required string is missing");
    }
    const json& v = j_.at(std::string(key));
    if (!v.is_string()) return Error(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  const json& raw() const { return j_; }

 private:
  const json& j_;
  std::string_view origin_;
  std::string prefix_;
};

Status ParseRope(const Reader& r, std::string_view origin, RopeConfig* rope) {
  const json& j = r.raw();
  // transformers >= 5 writes rope_parameters {rope_type, rope_theta, ...}; older files have a
  // top-level rope_theta and an optional rope_scaling {type|rope_type, factor, ...}.
  const json* params = nullptr;
  std::string prefix;
  if (r.Has("rope_parameters")) {
    params = &j.at("rope_parameters");
    prefix = "rope_parameters.";
  } else if (r.Has("rope_scaling")) {
    params = &j.at("rope_scaling");
    prefix = "rope_scaling.";
  }
  ASSIGN_OR_RETURN(rope->theta, r.Double("rope_theta", 10000.0));
  if (params == nullptr) return OkStatus();
  if (!params->is_object()) return r.Error(prefix, "expected an object, got " + params->dump());
  Reader p(*params, origin, prefix);
  if (p.Has("rope_theta")) {
    ASSIGN_OR_RETURN(rope->theta, p.Double("rope_theta"));
  }
  std::string type = "default";
  if (p.Has("rope_type")) {
    ASSIGN_OR_RETURN(type, p.String("rope_type", std::nullopt));
  } else if (p.Has("type")) {
    ASSIGN_OR_RETURN(type, p.String("type", std::nullopt));
  }
  if (p.Has("partial_rotary_factor")) {
    ASSIGN_OR_RETURN(double prf, p.Double("partial_rotary_factor"));
    if (prf != 1.0) return p.Error("partial_rotary_factor", "only 1.0 is supported");
  }
  rope->type = type;
  if (type == "default") return OkStatus();
  if (type == "linear") {
    ASSIGN_OR_RETURN(rope->factor, p.Double("factor"));
    return OkStatus();
  }
  if (type == "llama3") {
    ASSIGN_OR_RETURN(rope->factor, p.Double("factor"));
    ASSIGN_OR_RETURN(rope->low_freq_factor, p.Double("low_freq_factor"));
    ASSIGN_OR_RETURN(rope->high_freq_factor, p.Double("high_freq_factor"));
    ASSIGN_OR_RETURN(rope->original_max_position_embeddings,
                     p.Int("original_max_position_embeddings"));
    if (rope->high_freq_factor <= rope->low_freq_factor) {
      return p.Error("high_freq_factor", "must be greater than low_freq_factor");
    }
    return OkStatus();
  }
  return p.Error("rope_type",
                 "unsupported rope type \"" + type + "\" (supported: default, linear, llama3)");
}

Status ParseTokenIds(const Reader& r, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->bos_token_id, r.Int("bos_token_id", -1, -1));
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

Status ParseLlama(const Reader& r, std::string_view origin, ModelConfig* c) {
  c->arch = Architecture::kLlama;
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("hidden_size"));
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("intermediate_size"));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(c->num_kv_heads, r.Int("num_key_value_heads", c->num_heads));
  if (c->num_heads % c->num_kv_heads != 0) {
    return r.Error("num_key_value_heads",
                   "must divide num_attention_heads (" + std::to_string(c->num_heads) + ")");
  }
  if (!r.Has("head_dim") && c->hidden_size % c->num_heads != 0) {
    return r.Error("hidden_size", "not divisible by num_attention_heads and no head_dim given");
  }
  ASSIGN_OR_RETURN(c->head_dim, r.Int("head_dim", c->hidden_size / c->num_heads));
  if (c->head_dim % 2 != 0) return r.Error("head_dim", "must be even for rotary embeddings");
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("max_position_embeddings", 2048));
  ASSIGN_OR_RETURN(c->norm_eps, r.Double("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c->initializer_range, r.Double("initializer_range", 0.02));
  ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c->hidden_act, r.String("hidden_act", "silu"));
  if (c->hidden_act != "silu") {
    return r.Error("hidden_act", "unsupported activation \"" + c->hidden_act + "\" (need silu)");
  }
  ASSIGN_OR_RETURN(bool mlp_bias, r.Bool("mlp_bias", false));
  if (mlp_bias) return r.Error("mlp_bias", "true is not supported");
  if (c->model_type == "qwen2") {
    c->qkv_bias = true;
    ASSIGN_OR_RETURN(bool use_sw, r.Bool("use_sliding_window", false));
    if (use_sw) return r.Error("use_sliding_window", "true is not supported");
  } else {
    ASSIGN_OR_RETURN(bool attention_bias, r.Bool("attention_bias", false));
    c->qkv_bias = c->o_bias = attention_bias;
  }
  if (c->model_type == "mistral") {
    ASSIGN_OR_RETURN(c->sliding_window, r.Int("sliding_window", 0));
  }
  if (r.Has("partial_rotary_factor")) {
    ASSIGN_OR_RETURN(double prf, r.Double("partial_rotary_factor"));
    if (prf != 1.0) return r.Error("partial_rotary_factor", "only 1.0 is supported");
  }
  return ParseRope(r, origin, &c->rope);
}

Status ParseGpt2(const Reader& r, ModelConfig* c) {
  c->arch = Architecture::kGpt2;
  ASSIGN_OR_RETURN(c->vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c->hidden_size, r.Int("n_embd"));
  ASSIGN_OR_RETURN(c->num_layers, r.Int("n_layer"));
  ASSIGN_OR_RETURN(c->num_heads, r.Int("n_head"));
  ASSIGN_OR_RETURN(c->initializer_range, r.Double("initializer_range", 0.02));
  if (c->hidden_size % c->num_heads != 0) return r.Error("n_embd", "not divisible by n_head");
  c->num_kv_heads = c->num_heads;
  c->head_dim = c->hidden_size / c->num_heads;
  ASSIGN_OR_RETURN(c->intermediate_size, r.Int("n_inner", 4 * c->hidden_size));
  ASSIGN_OR_RETURN(c->max_position_embeddings, r.Int("n_positions"));
  ASSIGN_OR_RETURN(c->norm_eps, r.Double("layer_norm_epsilon", 1e-5));
  ASSIGN_OR_RETURN(c->tie_word_embeddings, r.Bool("tie_word_embeddings", true));
  ASSIGN_OR_RETURN(c->hidden_act, r.String("activation_function", "gelu_new"));
  if (c->hidden_act == "gelu_pytorch_tanh") c->hidden_act = "gelu_new";  // same function
  if (c->hidden_act != "gelu_new") {
    return r.Error("activation_function",
                   "unsupported activation \"" + c->hidden_act + "\" (need gelu_new)");
  }
  ASSIGN_OR_RETURN(bool scale, r.Bool("scale_attn_weights", true));
  if (!scale) return r.Error("scale_attn_weights", "false is not supported");
  for (const char* key :
       {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"}) {
    ASSIGN_OR_RETURN(bool on, r.Bool(key, false));
    if (on) return r.Error(key, "true is not supported");
  }
  c->qkv_bias = c->o_bias = true;
  return OkStatus();
}

// Only the keys HF's modeling code for the architecture reads in its CausalLM model: GPT-2's
// summary_first_dropout belongs to GPT2DoubleHeadsModel and does not act here.
Status ParseDropout(const Reader& r, ModelConfig* c) {
  static const char* const kGpt2[] = {"embd_pdrop", "attn_pdrop", "resid_pdrop"};
  static const char* const kLlama[] = {"attention_dropout"};
  const bool gpt2 = c->arch == Architecture::kGpt2;
  const std::span<const char* const> keys = gpt2 ? std::span<const char* const>(kGpt2)
                                                 : std::span<const char* const>(kLlama);
  for (const char* key : keys) {
    // transformers' defaults: 0.1 for GPT-2's three, 0.0 for attention_dropout.
    ASSIGN_OR_RETURN(double p, r.Double(key, gpt2 ? 0.1 : 0.0));
    if (!(p >= 0 && p < 1)) return r.Error(key, "must be in [0, 1)");
    if (p > 0) c->dropout.emplace_back(key, p);
  }
  return OkStatus();
}

}  // namespace

StatusOr<ModelConfig> ParseModelConfig(std::string_view text, std::string_view origin) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(std::string(origin) + ": not valid JSON");
  if (!j.is_object()) return InvalidArgumentError(std::string(origin) + ": not a JSON object");
  Reader r(j, origin);
  ModelConfig c;
  ASSIGN_OR_RETURN(c.model_type, r.String("model_type", std::nullopt));
  if (r.Has("architectures")) {
    const json& a = j.at("architectures");
    if (!a.is_array()) return r.Error("architectures", "expected a list");
    for (const json& name : a) {
      static const char* kKnown[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                     "GPT2LMHeadModel"};
      bool known = false;
      for (const char* k : kKnown) known = known || (name.is_string() && name == k);
      if (!known) {
        return r.Error("architectures", "unsupported architecture " + name.dump() +
                                            " (supported: LlamaForCausalLM, MistralForCausalLM, "
                                            "Qwen2ForCausalLM, GPT2LMHeadModel)");
      }
    }
  }
  if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2") {
    RETURN_IF_ERROR(ParseLlama(r, origin, &c));
  } else if (c.model_type == "gpt2") {
    RETURN_IF_ERROR(ParseGpt2(r, &c));
  } else {
    return r.Error("model_type", "unsupported model type \"" + c.model_type +
                                     "\" (supported: llama, mistral, qwen2, gpt2)");
  }
  RETURN_IF_ERROR(ParseTokenIds(r, &c));
  RETURN_IF_ERROR(ParseDropout(r, &c));
  // Bounded dimensions can still multiply past what any machine trains (and past int64 in the
  // callers' byte counts): refuse more than 2^50 parameters (1.1e15), in double arithmetic.
  const double h = static_cast<double>(c.hidden_size);
  const double params = 2.0 * static_cast<double>(c.vocab_size) * h +
                        static_cast<double>(c.num_layers) *
                            (2.0 * h * static_cast<double>(c.q_dim() + c.kv_dim()) +
                             3.0 * h * static_cast<double>(c.intermediate_size));
  if (params > std::ldexp(1.0, 50)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g", params);
    return InvalidArgumentError(std::string(origin) + ": the dimensions give " + buf +
                                " parameters, beyond the 2^50 offloadd accepts");
  }
  return c;
}

std::string DescribeDropout(const ModelConfig& c) {
  std::string out;
  for (const auto& [key, p] : c.dropout) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", p);
    out += (out.empty() ? "" : ", ") + key + "=" + buf;
  }
  return out;
}

Status DropoutProblem(const ModelConfig& c, bool dropout_disabled) {
  if (c.dropout.empty() || dropout_disabled) return OkStatus();
  return FailedPreconditionError(
      "the model's config.json sets " + DescribeDropout(c) +
      ", which Hugging Face applies in training, and offloadd does not implement dropout; set "
      "`dropout: disable` in the job (offloadd-train --dropout=disable) to train without it, or set "
      "those values to 0 in config.json");
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = JoinPath(dir, "config.json");
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseModelConfig(text, path);
}

}  // namespace offloadd::engine
