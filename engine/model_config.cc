#include "engine/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/file.h"
#include "engine/config_reader.h"

namespace offloadd::engine {
namespace {

using json = nlohmann::json;

// Parameter counts in T: double for the parser's overflow check, int64_t once it passed.
template <typename T>
struct Counts {
  T embedding = 0, layer = 0, final_norm = 0, lm_head = 0;
  T layers = 0;  // all decoder layers (MoE models mix sparse and dense layers)
  T dense_layer = 0, sparse_layer = 0, expert = 0, router = 0;
};

template <typename T>
Counts<T> CountIn(const ModelConfig& c) {
  Counts<T> n;
  const T h = static_cast<T>(c.hidden_size), v = static_cast<T>(c.vocab_size);
  const T q = static_cast<T>(c.q_dim()), kv = static_cast<T>(c.kv_dim());
  const T inter = static_cast<T>(c.intermediate_size), d = static_cast<T>(c.head_dim);
  const T norm = c.norm == NormKind::kLayer ? 2 * h : h;  // LayerNorm has a bias
  // Attention: q, k, v (separate or fused: the same count) and o, with their biases.
  T layer = h * q + 2 * h * kv + q * h;
  if (c.qkv_bias) layer += q + 2 * kv;
  if (c.o_bias) layer += h;
  if (c.qk_norm == QkNorm::kPerHead) layer += 2 * d;
  if (c.qk_norm == QkNorm::kWhole) layer += q + kv;
  if (c.attention_sinks) layer += static_cast<T>(c.num_heads);
  // Norms: pre-norm and post-norm have two per layer, the sandwich four.
  layer += (c.norm_placement == NormPlacement::kSandwich ? 4 : 2) * norm;
  // MLP: gate, up (separate or fused) and down; GPT-2's c_fc and c_proj.
  if (c.mlp == MlpKind::kGeluMlp) {
    layer += 2 * h * inter + (c.mlp_bias ? inter + h : 0);
  } else {
    layer += 3 * h * inter + (c.mlp_bias ? 2 * inter + h : 0);
  }
  // A sparse layer: the router and E SwiGLU experts instead of the MLP.
  const T dense_mlp = 3 * h * inter + (c.mlp_bias ? 2 * inter + h : 0);
  const T experts = static_cast<T>(c.moe.num_experts);
  const T ff = static_cast<T>(c.moe.intermediate_size);
  n.router = c.moe.router_bias ? experts * h + experts : experts * h;
  n.expert = 3 * h * ff + (c.moe.expert_bias ? 2 * ff + h : 0);
  const T sparse_mlp = n.router + experts * n.expert;
  n.dense_layer = layer;
  n.sparse_layer = c.moe.num_experts > 0 ? layer - dense_mlp + sparse_mlp : 0;
  n.layers = 0;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    n.layers += c.layer_sparse(i) ? layer - dense_mlp + sparse_mlp : layer;
  }
  if (c.moe.num_experts > 0) layer = std::max(layer, layer - dense_mlp + sparse_mlp);
  n.layer = layer;
  n.embedding = v * h;
  if (c.arch == Architecture::kGpt2) n.embedding += static_cast<T>(c.max_position_embeddings) * h;
  n.final_norm = norm;
  n.lm_head = c.tie_word_embeddings ? 0 : v * h;
  return n;
}

}  // namespace

ParamCounts CountParams(const ModelConfig& c) {
  const Counts<int64_t> n = CountIn<int64_t>(c);
  ParamCounts p;
  p.embedding = n.embedding;
  p.layer = n.layer;
  p.final_norm = n.final_norm;
  p.lm_head = n.lm_head;
  p.total = n.embedding + n.layers + n.final_norm + n.lm_head;
  p.dense_layer = n.dense_layer;
  p.sparse_layer = n.sparse_layer;
  p.expert = n.expert;
  p.router = n.router;
  p.layers.reserve(static_cast<size_t>(std::max<int64_t>(0, c.num_layers)));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    p.layers.push_back(c.layer_sparse(i) ? n.sparse_layer : n.dense_layer);
    if (c.layer_sparse(i)) ++p.sparse_layers;
  }
  // A token computes with top_k of each sparse layer's experts.
  p.active =
      p.total - p.sparse_layers * std::max<int64_t>(0, c.moe.num_experts - c.moe.top_k) * n.expert;
  return p;
}

StatusOr<ModelConfig> ParseModelConfig(std::string_view text, std::string_view origin) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(std::string(origin) + ": not valid JSON");
  if (!j.is_object()) return InvalidArgumentError(std::string(origin) + ": not a JSON object");
  ConfigReader r(j, origin);
  ModelConfig c;
  ASSIGN_OR_RETURN(c.model_type, r.String("model_type", std::nullopt));
  RETURN_IF_ERROR(ParseFamily(r, &c));
  // Bounded dimensions can still multiply past what any machine trains (and past int64 in the
  // callers' byte counts): refuse more than 2^50 parameters (1.1e15), in double arithmetic.
  const Counts<double> n = CountIn<double>(c);
  const double params = n.embedding + n.layers + n.final_norm + n.lm_head;
  if (params > std::ldexp(1.0, 50)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g", params);
    return InvalidArgumentError(std::string(origin) + ": the dimensions give " + buf +
                                " parameters, beyond the 2^50 offloadd accepts");
  }
  return c;
}

Status SequenceLengthProblem(const ModelConfig& c, int64_t max_seq_length) {
  const std::string got = ", got max_seq_length " + std::to_string(max_seq_length);
  if (c.arch == Architecture::kGpt2 && max_seq_length > c.max_position_embeddings) {
    return InvalidArgumentError("the model's n_positions is " +
                                std::to_string(c.max_position_embeddings) +
                                ": GPT-2 has learned positions for that many tokens" + got);
  }
  for (const RopeConfig* rope : {&c.rope, &c.rope_local}) {
    if (rope->type == "dynamic" && max_seq_length > rope->original_max_position_embeddings) {
      return InvalidArgumentError(
          "the model's RoPE type is \"dynamic\": transformers rescales its frequencies from the "
          "longest sequence seen so far once sequences exceed max_position_embeddings (" +
          std::to_string(rope->original_max_position_embeddings) +
          "), which offloadd does not reproduce" + got);
    }
  }
  return OkStatus();
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

namespace {

// 1e6 rather than 1e+06; 10000 stays 10000.
std::string Num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  std::string s = buf;
  if (auto e = s.find("e+"); e != std::string::npos) {
    size_t d = e + 2;
    while (d + 1 < s.size() && s[d] == '0') ++d;
    s = s.substr(0, e + 1) + s.substr(d);
  }
  return s;
}

std::string DescribeRope(const RopeConfig& r, int64_t head_dim) {
  std::string out = "RoPE " + r.type + " θ=" + Num(r.theta);
  if (r.type != "default") out += " factor " + Num(r.factor);
  if (r.rotary_dim > 0 && r.rotary_dim < head_dim) {
    out += ", rotary " + std::to_string(r.rotary_dim) + "/" + std::to_string(head_dim) + " dims";
  }
  return out;
}

}  // namespace

std::string DescribeParts(const ModelConfig& c) {
  std::vector<std::string> parts;
  static const char* kNorm[] = {"RMSNorm", "RMSNorm (1 + w)", "LayerNorm"};
  static const char* kPlacement[] = {"pre-norm", "sandwich norms", "post-norm"};
  parts.push_back(std::string(kNorm[static_cast<int>(c.norm)]) + " " +
                  kPlacement[static_cast<int>(c.norm_placement)]);
  std::string attn = c.num_kv_heads == c.num_heads ? "MHA " + std::to_string(c.num_heads)
                     : c.num_kv_heads == 1         ? "MQA " + std::to_string(c.num_heads) + "/1"
                                                   : "GQA " + std::to_string(c.num_heads) + "/" +
                                                 std::to_string(c.num_kv_heads);
  attn += " head_dim " + std::to_string(c.head_dim);
  if (c.qkv_bias) attn += c.o_bias ? ", q/k/v/o bias" : ", q/k/v bias";
  parts.push_back(attn);
  if (c.qk_norm == QkNorm::kPerHead) parts.push_back("per-head q/k norm");
  if (c.qk_norm == QkNorm::kWhole) parts.push_back("q/k norm over the projection");
  if (c.attn_scale > 0 && std::abs(c.attn_scale * std::sqrt(static_cast<double>(c.head_dim)) - 1) >
                              1e-12) {
    parts.push_back("attention scale " + Num(c.attn_scale));
  }
  if (c.attn_logit_softcap > 0) parts.push_back("attention softcap " + Num(c.attn_logit_softcap));
  if (c.attention_sinks) parts.push_back("attention sinks");
  if (!c.sliding.empty()) {
    int64_t n = 0;
    for (bool s : c.sliding) n += s;
    parts.push_back("sliding window " + std::to_string(c.sliding_window) + " on " +
                    std::to_string(n) + "/" + std::to_string(c.num_layers) + " layers");
  }
  static const char* kMlp[] = {"SwiGLU", "GeGLU (tanh)", "GELU MLP"};
  parts.push_back(std::string(kMlp[static_cast<int>(c.mlp)]) + (c.mlp_bias ? " with bias" : ""));
  if (c.moe.num_experts > 0) {
    int64_t n = 0;
    for (bool s : c.moe.sparse) n += s;
    const bool clamped = c.moe.activation == ExpertActivation::kClampedSwiGlu;
    std::string moe =
        "MoE " + std::to_string(c.moe.num_experts) +
        (clamped ? " clamped SwiGLU experts (with biases) of " : " SwiGLU experts of ") +
        std::to_string(c.moe.intermediate_size) + ", top-" + std::to_string(c.moe.top_k) +
        (c.moe.norm_topk_prob ? " renormalised" : "") +
        (c.moe.routing == MoeRouting::kTopKSoftmax ? " softmax, router bias" : "") + " on " +
        std::to_string(n) + "/" + std::to_string(c.num_layers) + " layers";
    if (c.moe.output_router_logits) moe += ", aux loss " + Num(c.moe.router_aux_loss_coef);
    if (c.moe.mxfp4) moe += ", MXFP4 experts dequantised on load";
    parts.push_back(moe);
  }
  if (c.arch == Architecture::kGpt2) {
    parts.push_back("learned positions " + std::to_string(c.max_position_embeddings));
  } else {
    parts.push_back(DescribeRope(c.rope, c.head_dim));
    if (c.has_local_rope) parts.push_back("local " + DescribeRope(c.rope_local, c.head_dim));
  }
  if (c.scale_embeddings) parts.push_back("embedding x sqrt(hidden)");
  parts.push_back(c.tie_word_embeddings ? "tied head" : "untied head");
  if (c.final_logit_softcap > 0) parts.push_back("final softcap " + Num(c.final_logit_softcap));
  std::string out = c.model_type + ":";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : " ") + parts[i];
  return out;
}

StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = JoinPath(dir, "config.json");
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseModelConfig(text, path);
}

}  // namespace offloadd::engine
