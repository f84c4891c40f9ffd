#pragma once
// Learning-rate schedules with Hugging Face semantics (transformers.get_scheduler, as the HF
// Trainer builds them): optimizer update k (0-based) uses learning_rate * Multiplier(k).
//   linear:               k < w ? k / w : max(0, (T - k) / (T - w))
//   cosine:               k < w ? k / w : max(0, 0.5 * (1 + cos(2 pi c (k - w) / (T - w))))
//   cosine_with_min_lr:   cosine's factor f scaled to f * (1 - m) + m
//   constant:             1
//   constant_with_warmup: k < w ? k / w : 1
// w = warmup_steps, or ceil(warmup_ratio * T) when warmup_steps is 0 (TrainingArguments.
// get_warmup_steps); T = total optimizer steps; c = num_cycles (0.5: one half wave); m =
// min_lr_rate (the floor as a fraction of learning_rate). Thread-safe value type.

#include <cstdint>
#include <string>

#include "common/status.h"

namespace offloadd::trainer {

// transformers' lr_scheduler_kwargs that the schedules take.
struct LrScheduleKwargs {
  double num_cycles = 0.5;   // cosine, cosine_with_min_lr
  double min_lr_rate = 0.0;  // cosine_with_min_lr (min_lr is min_lr_rate * learning_rate)
};

class LrSchedule {
 public:
  // INVALID_ARGUMENT for an unknown type, T < 1, negative warmup, warmup_ratio or min_lr_rate
  // outside [0, 1], or a num_cycles that is not positive.
  static StatusOr<LrSchedule> Create(const std::string& type, int64_t warmup_steps, double warmup_ratio,
                                     int64_t total_steps, const LrScheduleKwargs& kwargs = {});
  double Multiplier(int64_t step) const;
  int64_t warmup_steps() const { return warmup_; }
  int64_t total_steps() const { return total_; }

 private:
  enum class Kind { kLinear, kCosine, kConstant, kConstantWithWarmup };
  LrSchedule(Kind kind, int64_t warmup, int64_t total, const LrScheduleKwargs& kwargs)
      : kind_(kind), warmup_(warmup), total_(total), kwargs_(kwargs) {}

  Kind kind_;
  int64_t warmup_;
  int64_t total_;
  LrScheduleKwargs kwargs_;  // min_lr_rate is 0 unless the type is cosine_with_min_lr
};

}  // namespace offloadd::trainer
