#pragma once
// Test helper: writes a randomly initialised tiny model directory (config.json +
// model.safetensors) for the engine tests, without Python.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/file.h"
#include "engine/model_config.h"
#include "engine/tensor_io.h"

namespace offloadd::engine::testing {

enum class TinyArch { kLlama, kQwen2, kGpt2 };

// For INSTANTIATE_TEST_SUITE_P names.
inline std::string TinyArchName(const ::testing::TestParamInfo<TinyArch>& info) {
  switch (info.param) {
    case TinyArch::kLlama:
      return "Llama";
    case TinyArch::kQwen2:
      return "Qwen2";
    case TinyArch::kGpt2:
      return "Gpt2";
  }
  return "Unknown";
}

inline std::string TinyConfigJson(TinyArch arch, bool tied) {
  const std::string tie = tied ? "true" : "false";
  switch (arch) {
    case TinyArch::kLlama:
      return R"({"model_type":"llama","vocab_size":64,"hidden_size":32,"intermediate_size":48,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
        "max_position_embeddings":64,"rms_norm_eps":1e-5,"rope_theta":10000.0,
        "tie_word_embeddings":)" +
             tie + "}";
    case TinyArch::kQwen2:
      return R"({"model_type":"qwen2","vocab_size":64,"hidden_size":32,"intermediate_size":48,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":1,
        "max_position_embeddings":64,"rms_norm_eps":1e-6,"tie_word_embeddings":)" +
             tie + "}";
    case TinyArch::kGpt2:
      return R"({"model_type":"gpt2","vocab_size":64,"n_embd":32,"n_layer":2,"n_head":4,
        "n_positions":32,"tie_word_embeddings":)" +
             tie + "}";
  }
  return "";
}

// Parameter names and shapes the engine expects, derived from the config.
inline std::vector<std::pair<std::string, std::vector<int64_t>>> TinyParamSpecs(
    const ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> s;
  const int64_t h = c.hidden_size, ff = c.intermediate_size;
  if (c.arch == Architecture::kGpt2) {
    s = {{"transformer.wte.weight", {c.vocab_size, h}},
         {"transformer.wpe.weight", {c.max_position_embeddings, h}},
         {"transformer.ln_f.weight", {h}},
         {"transformer.ln_f.bias", {h}}};
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string p = "transformer.h." + std::to_string(i) + ".";
      for (auto& e : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"ln_1.weight", {h}},
               {"ln_1.bias", {h}},
               {"attn.c_attn.weight", {h, 3 * h}},
               {"attn.c_attn.bias", {3 * h}},
               {"attn.c_proj.weight", {h, h}},
               {"attn.c_proj.bias", {h}},
               {"ln_2.weight", {h}},
               {"ln_2.bias", {h}},
               {"mlp.c_fc.weight", {h, ff}},
               {"mlp.c_fc.bias", {ff}},
               {"mlp.c_proj.weight", {ff, h}},
               {"mlp.c_proj.bias", {h}},
               {"attn.bias", {1, 1, c.max_position_embeddings, c.max_position_embeddings}}}) {
        s.push_back({p + e.first, e.second});
      }
    }
  } else {
    s = {{"model.embed_tokens.weight", {c.vocab_size, h}}, {"model.norm.weight", {h}}};
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      s.push_back({p + "input_layernorm.weight", {h}});
      s.push_back({p + "post_attention_layernorm.weight", {h}});
      s.push_back({p + "self_attn.q_proj.weight", {c.q_dim(), h}});
      s.push_back({p + "self_attn.k_proj.weight", {c.kv_dim(), h}});
      s.push_back({p + "self_attn.v_proj.weight", {c.kv_dim(), h}});
      s.push_back({p + "self_attn.o_proj.weight", {h, c.q_dim()}});
      s.push_back({p + "mlp.gate_proj.weight", {ff, h}});
      s.push_back({p + "mlp.up_proj.weight", {ff, h}});
      s.push_back({p + "mlp.down_proj.weight", {h, ff}});
      if (c.qkv_bias) {
        s.push_back({p + "self_attn.q_proj.bias", {c.q_dim()}});
        s.push_back({p + "self_attn.k_proj.bias", {c.kv_dim()}});
        s.push_back({p + "self_attn.v_proj.bias", {c.kv_dim()}});
      }
    }
  }
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, h}});
  return s;
}

// Writes dir/config.json and dir/model.safetensors (float32, seeded). Returns the parsed config.
inline ModelConfig WriteTinyModel(const std::string& dir, TinyArch arch, bool tied,
                                  uint64_t seed = 0) {
  (void)MakeDirs(dir);
  const std::string json = TinyConfigJson(arch, tied);
  std::ofstream(JoinPath(dir, "config.json")) << json;
  ModelConfig c = *ParseModelConfig(json, "tiny");
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, shape] : TinyParamSpecs(c)) {
    at::Tensor t;
    const bool norm =
        name.find("norm") != std::string::npos || name.find("ln_") != std::string::npos;
    if (name.find("attn.bias") != std::string::npos && name.find("c_attn") == std::string::npos) {
      t = at::ones(shape).tril();  // GPT-2 mask buffer: must be skipped by the loader
    } else if (norm && name.find(".weight") != std::string::npos) {
      t = 1.0 + 0.1 * at::randn(shape, gen);
    } else {
      t = 0.2 * at::randn(shape, gen);
    }
    tensors.push_back({name, t});
  }
  (void)SaveTensorFile(JoinPath(dir, "model.safetensors"), tensors);
  return c;
}

}  // namespace offloadd::engine::testing
