// RoPE of the family table (engine/families.cc): what transformers' config classes make of the
// rope parameters, per family rule.
#include <cmath>
#include <optional>
#include <string>

#include "engine/families_internal.h"

namespace offloadd::engine::internal {

using json = nlohmann::json;

namespace {

// ---- RoPE ---------------------------------------------------------------------------------------

// What transformers' RotaryEmbeddingConfigMixin (and Phi3Config / Gemma3TextConfig) make of one
// RoPE parameter object, then what ROPE_INIT_FUNCTIONS read from it. `p` is null when config.json
// has none (default RoPE). `theta_key` is the top-level key a missing rope_theta comes from.
Status ParseRopeParams(const FamilyRule& f, const ConfigReader& top, const ConfigReader* p,
                       const std::string& theta_key, double theta_default, const ModelConfig& c,
                       RopeConfig* rope) {
  const ConfigReader& src = p != nullptr ? *p : top;
  if (p != nullptr && p->Has("rope_theta")) {
    ASSIGN_OR_RETURN(rope->theta, p->Positive("rope_theta"));
  } else {
    ASSIGN_OR_RETURN(rope->theta, top.Positive(theta_key, theta_default));
  }
  std::string type = "default";
  if (p != nullptr && p->Has("rope_type")) {
    ASSIGN_OR_RETURN(type, p->String("rope_type", std::nullopt));
  } else if (p != nullptr && p->Has("type")) {
    ASSIGN_OR_RETURN(type, p->String("type", std::nullopt));
  }
  const std::string type_key = p != nullptr && p->Has("rope_type") ? "rope_type" : "type";
  if (f.rope == RopeKind::kPhi3 && (type == "su" || type == "yarn")) type = "longrope";

  // partial_rotary_factor: in the parameters, else at the top level. Only Phi-3's modeling code
  // rotates part of a head; elsewhere transformers would fail or rotate the whole head anyway.
  double prf = 1.0;
  const ConfigReader& prf_src = p != nullptr && p->Has("partial_rotary_factor") ? *p : top;
  ASSIGN_OR_RETURN(prf, prf_src.Double("partial_rotary_factor", 1.0));
  if (prf != 1.0 && f.rope != RopeKind::kPhi3) {
    return prf_src.Unsupported(
        "partial_rotary_factor",
        c.model_type + " rotates whole heads (only phi3 has partial rotary)");
  }
  if (!(prf > 0 && prf <= 1)) return prf_src.Error("partial_rotary_factor", "must be in (0, 1]");
  // int(head_dim * partial_rotary_factor), as transformers computes it.
  const auto rotary = static_cast<int64_t>(static_cast<double>(c.head_dim) * prf);
  if (rotary < 2 || rotary % 2 != 0) {
    return prf_src.Error("partial_rotary_factor",
                         "gives " + std::to_string(rotary) + " rotary dimensions of head_dim " +
                             std::to_string(c.head_dim) + "; need an even number >= 2");
  }
  rope->rotary_dim = rotary;
  rope->type = type;

  if (f.rope == RopeKind::kPhi3 && type != "default" && type != "longrope") {
    return src.Unsupported(type_key, "phi3 takes default or longrope (as Phi3Config validates)");
  }
  if (type == "default") return OkStatus();
  // Types with scaling need the parameter object.
  const ConfigReader& q = *p;
  // original_max_position_embeddings for llama3 / yarn / longrope: Phi-3's top-level value (its
  // config class default 4096) always wins; elsewhere a top-level key wins over the parameters'
  // one, and max_position_embeddings is the fallback (standardize_rope_params).
  auto original_max = [&]() -> StatusOr<int64_t> {
    if (f.rope == RopeKind::kPhi3) return top.Int("original_max_position_embeddings", 4096);
    if (f.rope == RopeKind::kSingle && top.Has("original_max_position_embeddings")) {
      return top.Int("original_max_position_embeddings");
    }
    return q.Int("original_max_position_embeddings", c.max_position_embeddings);
  };
  if (type == "linear") {
    ASSIGN_OR_RETURN(rope->factor, q.Positive("factor"));
    return OkStatus();
  }
  if (type == "dynamic") {
    ASSIGN_OR_RETURN(rope->factor, q.Positive("factor"));
    // transformers rescales from max_position_embeddings (not the parameters' original length).
    rope->original_max_position_embeddings = c.max_position_embeddings;
    return OkStatus();
  }
  if (type == "llama3") {
    ASSIGN_OR_RETURN(rope->factor, q.Positive("factor"));
    ASSIGN_OR_RETURN(rope->low_freq_factor, q.Positive("low_freq_factor"));
    ASSIGN_OR_RETURN(rope->high_freq_factor, q.Positive("high_freq_factor"));
    ASSIGN_OR_RETURN(rope->original_max_position_embeddings, original_max());
    if (rope->high_freq_factor <= rope->low_freq_factor) {
      return q.Error("high_freq_factor", "must be greater than low_freq_factor");
    }
    return OkStatus();
  }
  if (type == "yarn") {
    ASSIGN_OR_RETURN(rope->original_max_position_embeddings, original_max());
    if (!q.Present("factor")) return q.Error("factor", "required number is missing");
    // factor null: max_position_embeddings / original_max_position_embeddings.
    ASSIGN_OR_RETURN(
        rope->factor,
        q.Positive("factor", static_cast<double>(c.max_position_embeddings) /
                                 static_cast<double>(rope->original_max_position_embeddings)));
    if (q.Has("attention_factor")) {
      ASSIGN_OR_RETURN(rope->attention_factor, q.Positive("attention_factor"));
    }
    ASSIGN_OR_RETURN(rope->mscale, q.Double("mscale", 0.0));
    ASSIGN_OR_RETURN(rope->mscale_all_dim, q.Double("mscale_all_dim", 0.0));
    // `rope_parameters.get("beta_fast") or 32`: 0 and null both mean the default.
    ASSIGN_OR_RETURN(rope->beta_fast, q.Double("beta_fast", 32.0));
    ASSIGN_OR_RETURN(rope->beta_slow, q.Double("beta_slow", 1.0));
    if (rope->beta_fast == 0) rope->beta_fast = 32.0;
    if (rope->beta_slow == 0) rope->beta_slow = 1.0;
    ASSIGN_OR_RETURN(rope->truncate, q.Bool("truncate", true));
    if (!rope->truncate && f.rope == RopeKind::kPerLayerType) {
      // transformers reads `truncate` from the top of rope_parameters, never from a layer type's.
      return q.Unsupported("truncate", "transformers ignores it per layer type and truncates");
    }
    return OkStatus();
  }
  if (type == "longrope") {
    ASSIGN_OR_RETURN(rope->original_max_position_embeddings, original_max());
    ASSIGN_OR_RETURN(
        rope->factor,
        q.Positive("factor", static_cast<double>(c.max_position_embeddings) /
                                 static_cast<double>(rope->original_max_position_embeddings)));
    if (q.Has("attention_factor")) {
      ASSIGN_OR_RETURN(rope->attention_factor, q.Positive("attention_factor"));
    }
    for (const char* key : {"short_factor", "long_factor"}) {
      if (!q.Has(key)) return q.Error(key, "required list is missing");
      const json& v = q.raw().at(key);
      if (!v.is_array() || static_cast<int64_t>(v.size()) != rotary / 2) {
        return q.Error(key, "expected a list of " + std::to_string(rotary / 2) +
                                " numbers (rotary dimensions / 2)");
      }
      std::vector<double>& out =
          std::string_view(key) == "short_factor" ? rope->short_factor : rope->long_factor;
      for (const json& x : v) {
        if (!x.is_number() || !(x.get<double>() > 0)) {
          return q.Error(key, "expected numbers > 0, got " + x.dump());
        }
        out.push_back(x.get<double>());
      }
    }
    return OkStatus();
  }
  return src.Unsupported(type_key,
                         "supported RoPE types: default, linear, dynamic, llama3, yarn, "
                         "longrope");
}

// The parameter object of a single-RoPE config: transformers 5's rope_parameters, or 4.x's
// rope_scaling, which wins when both are there (`rope_scaling or rope_parameters`).
StatusOr<std::optional<ConfigReader>> RopeObject(const ConfigReader& r) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.Has(key)) continue;
    ASSIGN_OR_RETURN(ConfigReader p, r.Child(key));
    if (!p.raw().empty()) return std::optional<ConfigReader>(std::move(p));
  }
  return std::optional<ConfigReader>();
}

}  // namespace

Status ParseRope(const FamilyRule& f, const ConfigReader& r, ModelConfig* c) {
  if (f.rope != RopeKind::kPerLayerType) {
    ASSIGN_OR_RETURN(auto p, RopeObject(r));
    if (!p && !f.default_rope.empty()) {
      // What the config class writes into rope_parameters when config.json has none (gpt-oss:
      // YaRN); the origin still names config.json.
      const json defaults = json::parse(f.default_rope);
      const ConfigReader d(defaults, r.origin(), r.prefix() + "rope_parameters(default).");
      return ParseRopeParams(f, r, &d, "rope_theta", f.theta, *c, &c->rope);
    }
    return ParseRopeParams(f, r, p ? &*p : nullptr, "rope_theta", f.theta, *c, &c->rope);
  }
  // Gemma 3: rope_parameters {full_attention: {...}, sliding_attention: {...}}; or 4.x's
  // rope_theta (global), rope_local_base_freq (local) and rope_scaling (merged into the global).
  c->has_local_rope = true;
  std::optional<ConfigReader> full, local;
  if (r.Has("rope_parameters")) {
    ASSIGN_OR_RETURN(ConfigReader params, r.Child("rope_parameters"));
    for (const auto& [key, value] : params.raw().items()) {
      if (key != "full_attention" && key != "sliding_attention") {
        return params.Error(key,
                            "expected only full_attention and sliding_attention entries "
                            "(Gemma 3 has a RoPE per layer type)");
      }
    }
    if (params.Has("full_attention")) {
      ASSIGN_OR_RETURN(ConfigReader x, params.Child("full_attention"));
      full.emplace(std::move(x));
    }
    if (params.Has("sliding_attention")) {
      ASSIGN_OR_RETURN(ConfigReader x, params.Child("sliding_attention"));
      local.emplace(std::move(x));
    }
  }
  if (r.Has("rope_scaling")) {
    if (full) return r.Error("rope_scaling", "given together with rope_parameters.full_attention");
    ASSIGN_OR_RETURN(ConfigReader x, r.Child("rope_scaling"));
    full.emplace(std::move(x));
  }
  RETURN_IF_ERROR(
      ParseRopeParams(f, r, full ? &*full : nullptr, "rope_theta", f.theta, *c, &c->rope));
  return ParseRopeParams(f, r, local ? &*local : nullptr, "rope_local_base_freq", f.local_theta, *c,
                         &c->rope_local);
}

}  // namespace offloadd::engine::internal
