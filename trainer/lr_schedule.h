#pragma once
// Learning-rate schedules with Hugging Face semantics (transformers.get_scheduler, as the HF
// Trainer builds them): optimizer update k (0-based) uses learning_rate * Multiplier(k).
//   linear:               k < w ? k / w : max(0, (T - k) / (T - w))
//   cosine:               k < w ? k / w : max(0, 0.5 * (1 + cos(pi * (k - w) / (T - w))))
//   constant:             1
//   constant_with_warmup: k < w ? k / w : 1
// w = warmup_steps, or ceil(warmup_ratio * T) when warmup_steps is 0 (TrainingArguments.
// get_warmup_steps); T = total optimizer steps. Thread-safe value type.

#include <cstdint>
#include <string>

#include "common/status.h"

namespace offloadd::trainer {

class LrSchedule {
 public:
  // INVALID_ARGUMENT for an unknown type, T < 1, negative warmup or warmup_ratio outside [0, 1].
  static StatusOr<LrSchedule> Create(const std::string& type, int64_t warmup_steps, double warmup_ratio,
                                     int64_t total_steps);
  double Multiplier(int64_t step) const;
  int64_t warmup_steps() const { return warmup_; }
  int64_t total_steps() const { return total_; }

 private:
  enum class Kind { kLinear, kCosine, kConstant, kConstantWithWarmup };
  LrSchedule(Kind kind, int64_t warmup, int64_t total) : kind_(kind), warmup_(warmup), total_(total) {}

  Kind kind_;
  int64_t warmup_;
  int64_t total_;
};

}  // namespace offloadd::trainer
