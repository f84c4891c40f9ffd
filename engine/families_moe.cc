// The mixture-of-experts keys of the family table (engine/families.cc): the sparse feed-forward's
// size, routing, sparse layers and load-balancing loss, as transformers' config classes read them,
// and the expert tensor names. Refused, naming key and value: what the MoE part does not compute.
#include <string>
#include <vector>

#include "engine/config_reader.h"
#include "engine/model_config.h"

namespace offloadd::engine {

using json = nlohmann::json;

namespace {

// gpt-oss's router and experts (transformers' GptOssTopKRouter / GptOssExperts): a router bias,
// softmax over the top-k logits, the clamped SwiGLU with biases in the packed, transposed layout
// (always: the hub's files and save_pretrained both write it), MXFP4 per quantization_config.
Status ParseGptOssExperts(const ConfigReader& r, ModelConfig* c) {
  MoeConfig& m = c->moe;
  m.routing = MoeRouting::kTopKSoftmax;
  m.activation = ExpertActivation::kClampedSwiGlu;
  m.router_bias = m.expert_bias = true;
  m.packed = m.transposed = true;
  // GptOssExperts fixes alpha 1.702 and limit 7.0; the hub's config.json carries swiglu_limit,
  // which transformers does not read: a different value would be silently ignored there.
  ASSIGN_OR_RETURN(double limit, r.Double("swiglu_limit", m.swiglu_limit));
  if (limit != m.swiglu_limit) {
    return r.Unsupported("swiglu_limit",
                         "transformers' GptOssExperts clamps at 7.0 whatever the "
                         "config says");
  }
  m.mxfp4 = r.Has("quantization_config");  // its quant_method was checked with the family
  TensorNames& names = c->names;
  names.router = "mlp.router";
  names.experts = "mlp.experts";
  return OkStatus();
}

}  // namespace

Status ParseMoe(const MoeDefaults& f, const ConfigReader& r, ModelConfig* c) {
  MoeConfig& m = c->moe;
  const int64_t n = c->num_layers;
  const bool mixtral = f.family == MoeFamily::kMixtral;
  const bool gpt_oss = f.family == MoeFamily::kGptOss;
  // The config classes alias num_experts and num_local_experts (attribute_map): transformers 5
  // writes num_local_experts for Qwen3-MoE and Mixtral, num_experts for OLMoE; hub files have
  // either.
  const char* experts_key = r.Has("num_local_experts") ? "num_local_experts" : "num_experts";
  // Qwen3-MoE with num_experts 0 is a dense model (every layer its MLP).
  ASSIGN_OR_RETURN(m.num_experts, r.Int(experts_key, f.experts,
                                        f.family == MoeFamily::kQwen3 ? 0 : 1, int64_t{1} << 16));
  if (r.Has("num_local_experts") && r.Has("num_experts")) {
    ASSIGN_OR_RETURN(int64_t other, r.Int("num_experts", std::nullopt, 0, int64_t{1} << 16));
    if (other != m.num_experts) {
      return r.Error("num_experts", "is " + std::to_string(other) + " but num_local_experts is " +
                                        std::to_string(m.num_experts) + " (the same setting)");
    }
  }
  if (m.num_experts == 0) {
    m.sparse.assign(n, false);
    return OkStatus();
  }
  ASSIGN_OR_RETURN(m.top_k, r.Int("num_experts_per_tok", f.top_k, 1, m.num_experts));
  if (f.family == MoeFamily::kQwen3) {
    ASSIGN_OR_RETURN(m.intermediate_size, r.Int("moe_intermediate_size", f.intermediate));
  } else {
    m.intermediate_size = c->intermediate_size;  // OLMoE and Mixtral: the expert's width
  }
  m.norm_topk_prob = true;  // Mixtral's router always renormalises
  if (gpt_oss) {
    m.norm_topk_prob = false;  // the softmax over the k selected logits sums to 1 already
  } else if (!mixtral) {
    ASSIGN_OR_RETURN(m.norm_topk_prob, r.Bool("norm_topk_prob", false));
  }
  ASSIGN_OR_RETURN(m.output_router_logits, r.Bool("output_router_logits", false));
  ASSIGN_OR_RETURN(m.router_aux_loss_coef, r.Double("router_aux_loss_coef", f.aux_coef));
  if (!(m.router_aux_loss_coef >= 0 && m.router_aux_loss_coef < 1e6)) {
    return r.Error("router_aux_loss_coef",
                   "must be a finite number >= 0, got " + r.Dump("router_aux_loss_coef"));
  }
  m.sparse.assign(n, true);
  if (f.family == MoeFamily::kQwen3) {
    ASSIGN_OR_RETURN(bool sliding, r.Bool("use_sliding_window", false));
    if (sliding) {
      return r.Unsupported("use_sliding_window",
                           "qwen3_moe's sliding window on every layer is not implemented");
    }
    ASSIGN_OR_RETURN(int64_t step, r.Int("decoder_sparse_step", 1));
    std::vector<bool> dense(n, false);
    if (r.Has("mlp_only_layers")) {
      const json& v = r.raw().at("mlp_only_layers");
      if (!v.is_array()) return r.Error("mlp_only_layers", "expected a list of layer indices");
      for (const json& x : v) {
        // transformers tests `layer_idx in mlp_only_layers`: an index past the last layer has no
        // effect there, but is almost surely a mistake in the config.
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= n) {
          return r.Error("mlp_only_layers", "expected layer indices in [0, " + std::to_string(n) +
                                                "), got " + x.dump());
        }
        dense[x.get<int64_t>()] = true;
      }
    }
    for (int64_t i = 0; i < n; ++i) m.sparse[i] = !dense[i] && (i + 1) % step == 0;
  } else if (gpt_oss) {
    RETURN_IF_ERROR(ParseGptOssExperts(r, c));
  } else if (f.family == MoeFamily::kOlmoe) {
    if (r.Has("clip_qkv")) {
      return r.Unsupported("clip_qkv", "OLMoE's q/k/v clamping is not implemented");
    }
  } else {
    ASSIGN_OR_RETURN(double jitter, r.Double("router_jitter_noise", 0.0));
    if (jitter != 0) {
      return r.Unsupported("router_jitter_noise",
                           "Mixtral multiplies the router input by random noise in training, which "
                           "offloadd does not reproduce; set it to 0");
    }
    TensorNames& names = c->names;
    names.router = "block_sparse_moe.gate";
    names.experts = "block_sparse_moe.experts";
    names.expert_gate = "w1";
    names.expert_up = "w3";
    names.expert_down = "w2";
  }
  return OkStatus();
}

}  // namespace offloadd::engine
