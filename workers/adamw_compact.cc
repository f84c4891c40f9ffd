#include "workers/adamw_compact.h"

#include <string>

#include "workers/adamw_compact_impl.h"

namespace offloadd::workers {

std::string_view StateDtypeName(StateDtype d) {
  switch (d) {
    case StateDtype::kFp32:
      return "fp32";
    case StateDtype::kBf16:
      return "bf16";
    case StateDtype::kInt8:
      return "int8";
  }
  return "unknown";
}

std::string_view MasterDtypeName(MasterDtype d) {
  return d == MasterDtype::kBf16 ? "bf16" : "fp32";
}

std::string OptimizerMode::Describe() const {
  const std::string what = std::string(MasterDtypeName(master)) + " master, " +
                           std::string(StateDtypeName(state)) + " states";
  return Exact() ? "exact (" + what + ")" : "not exact: " + what;
}

StatusOr<OptimizerMode> ParseOptimizerMode(std::string_view state_dtype,
                                           std::string_view master_dtype) {
  OptimizerMode mode;
  if (state_dtype == "bf16") {
    mode.state = StateDtype::kBf16;
  } else if (state_dtype == "int8") {
    mode.state = StateDtype::kInt8;
  } else if (!state_dtype.empty() && state_dtype != "fp32") {
    return InvalidArgumentError("optimizer.state_dtype: unknown value '" +
                                std::string(state_dtype) + "' (fp32, bf16 or int8)");
  }
  if (master_dtype == "bf16") {
    mode.master = MasterDtype::kBf16;
  } else if (!master_dtype.empty() && master_dtype != "fp32") {
    return InvalidArgumentError("optimizer.master_dtype: unknown value '" +
                                std::string(master_dtype) + "' (fp32 or bf16)");
  }
  return mode;
}

namespace {

// Bytes of one state element, and the int8 scale's share (one float per block).
double StateElementBytes(StateDtype d) {
  switch (d) {
    case StateDtype::kFp32:
      return 4;
    case StateDtype::kBf16:
      return 2;
    case StateDtype::kInt8:
      return 1 + 4.0 / kInt8BlockSize;
  }
  return 4;
}

}  // namespace

double StateBytesPerParam(OptimizerMode mode) {
  return 4 + 2 * StateElementBytes(mode.state);  // a bf16 master + compensation is 4 bytes too
}

double StepTrafficBytesPerParam(OptimizerMode mode, GradDtype grad, WeightDtype weights) {
  const double weight_copy = weights == WeightDtype::kNone ? 0 : 2;
  return static_cast<double>(GradBytes(grad)) + 2 * StateBytesPerParam(mode) + weight_copy;
}

Status ValidateCompactSpan(const CompactSpan& span, OptimizerMode mode) {
  const auto missing = [&](const char* what) {
    return InvalidArgumentError(std::string("compact AdamW span (") + mode.Describe() +
                                ") has no " + what);
  };
  if (span.n == 0) return OkStatus();
  if (span.grad == nullptr) return missing("gradients");
  if (span.master == nullptr) return missing("master weights");
  if (mode.master == MasterDtype::kBf16 && span.master_comp == nullptr) {
    return missing("master compensation buffer (bf16 master)");
  }
  if (span.exp_avg == nullptr || span.exp_avg_sq == nullptr) return missing("exp_avg/exp_avg_sq");
  if (mode.state == StateDtype::kInt8) {
    if (span.exp_avg_scale == nullptr || span.exp_avg_sq_scale == nullptr) {
      return missing("int8 block scales");
    }
    if (span.first_index % kInt8BlockSize != 0) {
      return InvalidArgumentError("compact AdamW span: int8 states start at a block boundary (" +
                                  std::to_string(kInt8BlockSize) + "), not at element " +
                                  std::to_string(span.first_index));
    }
  }
  if (span.weights == nullptr && span.weight_dtype != WeightDtype::kNone) {
    return missing("16-bit weight copy (weight_dtype is not kNone)");
  }
  return OkStatus();
}

uint64_t MasterRegionBytes(MasterDtype d, uint64_t n) {
  return d == MasterDtype::kBf16 ? MasterCompOffset(n) + 2 * n : 4 * n;
}

uint64_t StateRegionBytes(StateDtype d, uint64_t n) {
  switch (d) {
    case StateDtype::kFp32:
      return 4 * n;
    case StateDtype::kBf16:
      return 2 * n;
    case StateDtype::kInt8:
      return Int8ScalesOffset(n) + 4 * Int8Blocks(n);
  }
  return 4 * n;
}

void DecodeBf16Master(const uint16_t* master, const uint16_t* comp, uint64_t n, float* out) {
  for (uint64_t i = 0; i < n; ++i)
    out[i] = internal::Bf16ToFloat(master[i]) + internal::Bf16ToFloat(comp[i]);
}

void EncodeBf16Master(const float* p, uint64_t n, uint16_t* master, uint16_t* comp) {
  for (uint64_t i = 0; i < n; ++i) {
    const uint16_t h = internal::FloatToBf16(p[i]);
    master[i] = h;
    comp[i] = internal::FloatToBf16(p[i] - internal::Bf16ToFloat(h));
  }
}

CompactSpan CompactSpanAt(OptimizerMode mode, uint8_t* master, uint8_t* exp_avg,
                          uint8_t* exp_avg_sq, uint64_t n, uint64_t begin, uint64_t count) {
  CompactSpan span;
  span.n = count;
  span.first_index = begin;
  if (mode.master == MasterDtype::kBf16) {
    span.master = master + 2 * begin;
    span.master_comp = reinterpret_cast<uint16_t*>(master + MasterCompOffset(n) + 2 * begin);
  } else {
    span.master = master + 4 * begin;
  }
  switch (mode.state) {
    case StateDtype::kFp32:
      span.exp_avg = exp_avg + 4 * begin;
      span.exp_avg_sq = exp_avg_sq + 4 * begin;
      break;
    case StateDtype::kBf16:
      span.exp_avg = exp_avg + 2 * begin;
      span.exp_avg_sq = exp_avg_sq + 2 * begin;
      break;
    case StateDtype::kInt8: {
      span.exp_avg = exp_avg + begin;
      span.exp_avg_sq = exp_avg_sq + begin;
      const uint64_t block = begin / kInt8BlockSize;
      span.exp_avg_scale = reinterpret_cast<float*>(exp_avg + Int8ScalesOffset(n)) + block;
      span.exp_avg_sq_scale = reinterpret_cast<float*>(exp_avg_sq + Int8ScalesOffset(n)) + block;
      break;
    }
  }
  return span;
}

StatusOr<double> CompactAdamW(const CompactSpan& span, OptimizerMode mode, const AdamWHyper& hyper,
                              KernelPath path) {
  RETURN_IF_ERROR(ValidateCompactSpan(span, mode));
  const internal::AdamWScalars s = internal::MakeScalars(hyper);
  switch (path) {
    case KernelPath::kAvx512Bf16:
      return internal::avx512bf16::CompactAdamW(span, mode, s, hyper.step);
    case KernelPath::kAvx512:
      return internal::avx512::CompactAdamW(span, mode, s, hyper.step);
    case KernelPath::kAvx2:
      return internal::avx2::CompactAdamW(span, mode, s, hyper.step);
    case KernelPath::kPortable:
      break;
  }
  return internal::portable::CompactAdamW(span, mode, s, hyper.step);
}

}  // namespace offloadd::workers
