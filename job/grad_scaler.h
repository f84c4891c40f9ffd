#pragma once
// GradScaler: the dynamic loss scale of fp16 training, torch.amp.GradScaler's update rule
// (aten _amp_update_scale_) on the host. The loss is multiplied by scale() before backward; the
// optimizer unscales with grad_unscale() (1 / scale, computed as GradScaler.unscale_ does). After
// each optimizer step Update(found_inf) halves the scale on overflow (the step was skipped) or,
// after growth_interval clean steps in a row, doubles it. The scale is an fp32 value, as torch's
// scale tensor. Torch-free value type; not thread-safe.

#include <cstdint>

#include "common/status.h"

namespace offloadd::trainer {

// torch.amp.GradScaler's constructor arguments and defaults.
struct LossScaleConfig {
  double init_scale = 65536.0;  // 2**16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct GradScalerState {  // what a checkpoint keeps
  float scale = 0;
  int64_t growth_tracker = 0;  // clean steps since the last change of the scale
};

class GradScaler {
 public:
  // INVALID_ARGUMENT naming the field: init_scale finite > 0, growth_factor > 1,
  // backoff_factor in (0, 1), growth_interval >= 1.
  static Status Validate(const LossScaleConfig& config);
  explicit GradScaler(const LossScaleConfig& config);

  float scale() const { return state_.scale; }
  float grad_unscale() const;
  int64_t growth_tracker() const { return state_.growth_tracker; }
  void Update(bool found_inf);

  const GradScalerState& state() const { return state_; }
  // INVALID_ARGUMENT for a scale that is not finite and > 0 or a negative tracker.
  Status Restore(const GradScalerState& state);

 private:
  LossScaleConfig config_;
  GradScalerState state_;
};

}  // namespace offloadd::trainer
