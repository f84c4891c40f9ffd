#include "job/grad_scaler.h"

#include <cmath>
#include <string>

namespace offloadd::trainer {

Status GradScaler::Validate(const LossScaleConfig& c) {
  const auto bad = [](const char* field, double v, const char* want) {
    return InvalidArgumentError(std::string("loss scaling: ") + field + " = " +
                                std::to_string(v) + " is out of range (" + want + ")");
  };
  if (!std::isfinite(c.init_scale) || c.init_scale <= 0 ||
      !std::isfinite(static_cast<float>(c.init_scale)))
    return bad("init_scale", c.init_scale, "finite in fp32, > 0");
  if (!std::isfinite(c.growth_factor) || c.growth_factor <= 1)
    return bad("growth_factor", c.growth_factor, "finite, > 1");
  if (!(c.backoff_factor > 0 && c.backoff_factor < 1))
    return bad("backoff_factor", c.backoff_factor, "(0, 1)");
  if (c.growth_interval < 1)
    return bad("growth_interval", static_cast<double>(c.growth_interval), ">= 1");
  return OkStatus();
}

GradScaler::GradScaler(const LossScaleConfig& config) : config_(config) {
  state_.scale = static_cast<float>(config.init_scale);
}

float GradScaler::grad_unscale() const {
  // GradScaler.unscale_: self._scale.double().reciprocal().float()
  return static_cast<float>(1.0 / static_cast<double>(state_.scale));
}

void GradScaler::Update(bool found_inf) {
  // aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp, _amp_update_scale_cpu_: the products are
  // float scale times double factor, rounded back to the fp32 scale.
  if (found_inf) {
    state_.scale = static_cast<float>(state_.scale * config_.backoff_factor);
    state_.growth_tracker = 0;
    return;
  }
  const int64_t successful = state_.growth_tracker + 1;
  if (successful == config_.growth_interval) {
    const float grown = static_cast<float>(state_.scale * config_.growth_factor);
    if (std::isfinite(grown)) state_.scale = grown;
    state_.growth_tracker = 0;
  } else {
    state_.growth_tracker = successful;
  }
}

Status GradScaler::Restore(const GradScalerState& state) {
  if (!std::isfinite(state.scale) || state.scale <= 0 || state.growth_tracker < 0) {
    return InvalidArgumentError("loss scaler state: scale " + std::to_string(state.scale) +
                                ", growth_tracker " + std::to_string(state.growth_tracker));
  }
  state_ = state;
  return OkStatus();
}

}  // namespace offloadd::trainer
