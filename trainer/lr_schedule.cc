#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace offloadd::trainer {

StatusOr<LrSchedule> LrSchedule::Create(const std::string& type, int64_t warmup_steps, double warmup_ratio,
                                        int64_t total_steps, const LrScheduleKwargs& kwargs) {
  if (total_steps < 1) return InvalidArgumentError("a schedule needs at least one optimizer step");
  if (warmup_steps < 0) return InvalidArgumentError("warmup_steps must not be negative");
  if (!(warmup_ratio >= 0.0 && warmup_ratio <= 1.0)) return InvalidArgumentError("warmup_ratio must be in [0, 1]");
  if (!(kwargs.num_cycles > 0.0 && std::isfinite(kwargs.num_cycles))) {
    return InvalidArgumentError("num_cycles must be positive");
  }
  if (!(kwargs.min_lr_rate >= 0.0 && kwargs.min_lr_rate <= 1.0)) {
    return InvalidArgumentError("min_lr_rate must be in [0, 1]");
  }
  Kind kind;
  LrScheduleKwargs used = kwargs;
  if (type != "cosine_with_min_lr") used.min_lr_rate = 0.0;
  if (type == "linear") kind = Kind::kLinear;
  else if (type == "cosine" || type == "cosine_with_min_lr") kind = Kind::kCosine;
  else if (type == "constant") kind = Kind::kConstant;
  else if (type == "constant_with_warmup") kind = Kind::kConstantWithWarmup;
  else return InvalidArgumentError("lr_scheduler_type '" + type + "' is not supported (linear, cosine, " +
                                   "cosine_with_min_lr, constant, constant_with_warmup)");
  const int64_t warmup = warmup_steps > 0
                             ? warmup_steps
                             : static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(total_steps)));
  return LrSchedule(kind, warmup, total_steps, used);
}

double LrSchedule::Multiplier(int64_t k) const {
  if (kind_ == Kind::kConstant) return 1.0;
  if (k < warmup_) return static_cast<double>(k) / static_cast<double>(std::max<int64_t>(1, warmup_));
  if (kind_ == Kind::kConstantWithWarmup) return 1.0;
  const double span = static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
  if (kind_ == Kind::kLinear) return std::max(0.0, static_cast<double>(total_ - k) / span);
  const double progress = static_cast<double>(k - warmup_) / span;
  const double factor = 0.5 * (1.0 + std::cos(std::numbers::pi * kwargs_.num_cycles * 2.0 * progress));
  return std::max(0.0, factor * (1.0 - kwargs_.min_lr_rate) + kwargs_.min_lr_rate);
}

}  // namespace offloadd::trainer
