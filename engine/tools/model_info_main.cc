// offloadd-model-info: what the engine makes of a model directory's config.json, for the Python
// tests that compare it with transformers (tests/python/engine/test_model_configs.py,
// test_rope.py) and for debugging a refused config.
//
//   offloadd-model-info --config DIR
//       prints the ModelConfig as JSON: dimensions, parts, attention options, sliding layers,
//       RoPE (global and local), tensor names, dropout, parameter counts, the parts line.
//   offloadd-model-info --rope DIR --positions 0,1,2,... --out OUT.safetensors
//       writes the rotary tables for position_ids [1, T]: "inv_freq" [R/2], "cos"/"sin" [1, T, R]
//       (fp32), and "local/..." for the sliding layers' RoPE when the family has one.
// Exit status 1 with the error on stderr when the config is refused.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/rope.h"
#include "engine/tensor_io.h"
#include "engine/torch_boundary.h"

namespace offloadd::engine {
namespace {

using json = nlohmann::json;

json RopeJson(const RopeConfig& r) {
  return {{"type", r.type},
          {"theta", r.theta},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings},
          {"beta_fast", r.beta_fast},
          {"beta_slow", r.beta_slow},
          {"mscale", r.mscale},
          {"mscale_all_dim", r.mscale_all_dim},
          {"attention_factor", r.attention_factor},
          {"attention_scaling", ops::RopeAttentionScaling(r)},
          {"truncate", r.truncate},
          {"short_factor", r.short_factor},
          {"long_factor", r.long_factor},
          {"rotary_dim", r.rotary_dim}};
}

json ConfigJson(const ModelConfig& c) {
  static const char* kNorm[] = {"rms", "rms_one_offset", "layer"};
  static const char* kPlacement[] = {"pre", "sandwich", "post"};
  static const char* kQk[] = {"none", "per_head", "whole"};
  static const char* kMlp[] = {"swiglu", "geglu_tanh", "gelu_mlp"};
  const TensorNames& n = c.names;
  json names = {{"embed", n.embed},
                {"position_embed", n.position_embed},
                {"final_norm", n.final_norm},
                {"final_norm_bias", n.final_norm_bias},
                {"lm_head", n.lm_head},
                {"layer_prefix", n.layer_prefix},
                {"input_norm", n.input_norm},
                {"post_attn_norm", n.post_attn_norm},
                {"pre_mlp_norm", n.pre_mlp_norm},
                {"post_mlp_norm", n.post_mlp_norm},
                {"q", n.q},
                {"k", n.k},
                {"v", n.v},
                {"qkv", n.qkv},
                {"o", n.o},
                {"q_norm", n.q_norm},
                {"k_norm", n.k_norm},
                {"gate", n.gate},
                {"up", n.up},
                {"down", n.down},
                {"gate_up", n.gate_up},
                {"router", n.router},
                {"experts", n.experts},
                {"expert_gate", n.expert_gate},
                {"expert_up", n.expert_up},
                {"expert_down", n.expert_down},
                {"passthrough_prefixes", n.passthrough_prefixes}};
  json dropout = json::object();
  for (const auto& [key, p] : c.dropout) dropout[key] = p;
  const ParamCounts counts = CountParams(c);
  return {{"arch", c.arch == Architecture::kGpt2 ? "gpt2" : "rotary"},
          {"model_type", c.model_type},
          {"architecture", c.architecture},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_layers", c.num_layers},
          {"num_heads", c.num_heads},
          {"num_kv_heads", c.num_kv_heads},
          {"head_dim", c.head_dim},
          {"max_position_embeddings", c.max_position_embeddings},
          {"norm_eps", c.norm_eps},
          {"initializer_range", c.initializer_range},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"norm", kNorm[static_cast<int>(c.norm)]},
          {"norm_placement", kPlacement[static_cast<int>(c.norm_placement)]},
          {"qk_norm", kQk[static_cast<int>(c.qk_norm)]},
          {"mlp", kMlp[static_cast<int>(c.mlp)]},
          {"qkv_bias", c.qkv_bias},
          {"o_bias", c.o_bias},
          {"mlp_bias", c.mlp_bias},
          {"attn_scale", c.attn_scale},
          {"attn_logit_softcap", c.attn_logit_softcap},
          {"final_logit_softcap", c.final_logit_softcap},
          {"scale_embeddings", c.scale_embeddings},
          {"attention_sinks", c.attention_sinks},
          {"sliding", c.sliding},
          {"sliding_window", c.sliding_window},
          {"rope", RopeJson(c.rope)},
          {"has_local_rope", c.has_local_rope},
          {"rope_local", RopeJson(c.rope_local)},
          {"hidden_act", c.hidden_act},
          {"names", names},
          {"moe",
           {{"num_experts", c.moe.num_experts},
            {"top_k", c.moe.top_k},
            {"intermediate_size", c.moe.intermediate_size},
            {"norm_topk_prob", c.moe.norm_topk_prob},
            {"output_router_logits", c.moe.output_router_logits},
            {"router_aux_loss_coef", c.moe.router_aux_loss_coef},
            {"router_bias", c.moe.router_bias},
            {"expert_bias", c.moe.expert_bias},
            {"mxfp4", c.moe.mxfp4},
            {"sparse", c.moe.sparse}}},
          {"eos_token_ids", c.eos_token_ids},
          {"bos_token_id", c.bos_token_id},
          {"dropout", dropout},
          {"params",
           {{"embedding", counts.embedding},
            {"layer", counts.layer},
            {"final_norm", counts.final_norm},
            {"lm_head", counts.lm_head},
            {"total", counts.total}}},
          {"parts", DescribeParts(c)}};
}

Status DumpRope(const ModelConfig& c, const std::vector<int64_t>& positions,
                const std::string& out) {
  if (c.arch != Architecture::kLlama) return InvalidArgumentError("the model has no RoPE");
  if (positions.empty()) return InvalidArgumentError("--positions is empty");
  const at::Tensor ids = at::tensor(positions, at::kLong).unsqueeze(0);
  const int64_t seq_len = *std::max_element(positions.begin(), positions.end()) + 1;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  auto add = [&](const std::string& prefix, const RopeConfig& rope) {
    at::Tensor cos, sin;
    ops::RopeTables(rope, c.head_dim, ids, at::kFloat, &cos, &sin);
    tensors.push_back(
        {prefix + "inv_freq", ops::RopeInvFreq(rope, c.head_dim, seq_len, c10::kCPU)});
    tensors.push_back({prefix + "cos", cos});
    tensors.push_back({prefix + "sin", sin});
  };
  add("", c.rope);
  if (c.has_local_rope) add("local/", c.rope_local);
  return SaveTensorFile(out, tensors);
}

std::vector<int64_t> ParseIds(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) ids.push_back(std::stoll(item));
  }
  return ids;
}

int Run(int argc, char** argv) {
  std::string config_dir, rope_dir, out;
  std::vector<int64_t> positions;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") {
      config_dir = v;
    } else if (k == "--rope") {
      rope_dir = v;
    } else if (k == "--out") {
      out = v;
    } else if (k == "--positions") {
      positions = ParseIds(v);
    } else {
      std::fprintf(stderr, "offloadd-model-info: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0 || (config_dir.empty() == rope_dir.empty()) ||
      (!rope_dir.empty() && out.empty())) {
    std::fprintf(stderr,
                 "usage: offloadd-model-info --config DIR | --rope DIR --positions 0,1,... "
                 "--out OUT.safetensors\n");
    return 2;
  }
  auto c = LoadModelConfig(config_dir.empty() ? rope_dir : config_dir);
  if (!c.ok()) {
    std::fprintf(stderr, "offloadd-model-info: %s\n", c.status().ToString().c_str());
    return 1;
  }
  if (!config_dir.empty()) {
    std::printf("%s\n", ConfigJson(*c).dump(2).c_str());
    return 0;
  }
  Status s = DumpRope(*c, positions, out);
  if (!s.ok()) {
    std::fprintf(stderr, "offloadd-model-info: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace offloadd::engine

int main(int argc, char** argv) {
  const offloadd::StatusOr<int> rc =
      offloadd::engine::RunTorch("model info", [&] { return offloadd::engine::Run(argc, argv); });
  if (!rc.ok()) {
    std::fprintf(stderr, "offloadd-model-info: %s\n", rc.status().ToString().c_str());
    return 1;
  }
  return *rc;
}
