#pragma once
// engine-internal: typed access to a config.json object whose errors name the file and the key
// path ("cfg.json: text_config.rope_parameters.factor: expected a number, got \"8\""), and the
// family table's entry points (engine/families.cc) that engine/model_config.cc dispatches to.
// Not thread-safe; a ConfigReader borrows the JSON value and the origin string.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "engine/model_config.h"

namespace offloadd::engine {

class ConfigReader {
 public:
  using json = nlohmann::json;
  ConfigReader(const json& j, std::string_view origin, std::string prefix = "")
      : j_(j), origin_(origin), prefix_(std::move(prefix)) {}

  // A reader over the object at `key` (which must be one), naming keys "<prefix><key>.<name>".
  StatusOr<ConfigReader> Child(std::string_view key) const {
    if (!Has(key)) return Error(key, "required object is missing");
    const json& v = j_.at(std::string(key));
    if (!v.is_object()) return Error(key, "expected an object, got " + v.dump());
    return ConfigReader(v, origin_, prefix_ + std::string(key) + ".");
  }

  Status Error(std::string_view key, const std::string& what) const {
    return InvalidArgumentError(std::string(origin_) + ": " + prefix_ + std::string(key) + ": " +
                                what);
  }
  // "key = value is not supported" style refusals name the value as config.json writes it.
  Status Unsupported(std::string_view key, const std::string& why) const {
    return Error(key, Dump(key) + " is not supported: " + why);
  }
  // Present and not null (transformers treats null as "use the default" almost everywhere).
  bool Has(std::string_view key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  // Present, possibly null (Mistral: an absent sliding_window means 4096, null means none).
  bool Present(std::string_view key) const { return j_.find(key) != j_.end(); }
  std::string Dump(std::string_view key) const {
    auto it = j_.find(key);
    return it == j_.end() ? "(absent)" : it->dump();
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
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Error(key, "must be <= " + std::to_string(max) + ", got " + v.dump());
    }
    const int64_t x = v.get<int64_t>();
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
  // A finite number > 0 (RoPE bases and factors, softcaps, scalars).
  StatusOr<double> Positive(std::string_view key, std::optional<double> def = std::nullopt) const {
    ASSIGN_OR_RETURN(double x, Double(key, def));
    if (!(x > 0) || x > 1e300) return Error(key, "must be a finite number > 0, got " + Dump(key));
    return x;
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
  std::string_view origin() const { return origin_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const json& j_;
  std::string_view origin_;
  std::string prefix_;
};

// engine/families.cc: fills everything family-specific of `c` (dimensions, parts, attention
// options, sliding layers, RoPE, tensor names, dropout keys) from config.json, or refuses naming
// the key and value. `c->model_type` and `c->architecture` are set by the caller; OK with an
// unknown model_type is impossible (INVALID_ARGUMENT naming model_type and the supported ones).
Status ParseFamily(const ConfigReader& r, ModelConfig* c);

// engine/families_moe.cc: a mixture-of-experts family's MoeConfig (and expert tensor names) from
// config.json, with its config class's defaults.
enum class MoeFamily {
  kQwen3,    // num_experts, moe_intermediate_size, decoder_sparse_step, mlp_only_layers
  kOlmoe,    // num_experts of intermediate_size, every layer sparse
  kMixtral,  // num_local_experts of intermediate_size, always renormalised, router_jitter_noise
  kGptOss,   // num_local_experts of intermediate_size, router bias, top-k softmax, clamped SwiGLU
};
struct MoeDefaults {
  MoeFamily family = MoeFamily::kQwen3;
  int64_t experts = 0, top_k = 0;
  int64_t intermediate = 0;  // Qwen3-MoE's moe_intermediate_size (the others: intermediate_size)
  double aux_coef = 0;       // router_aux_loss_coef
};
Status ParseMoe(const MoeDefaults& defaults, const ConfigReader& r, ModelConfig* c);

}  // namespace offloadd::engine
