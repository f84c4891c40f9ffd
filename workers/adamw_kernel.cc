#include "workers/adamw_kernel.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "workers/adamw_kernel_impl.h"

namespace offloadd::workers {
namespace internal {

AdamWScalars MakeScalars(const AdamWHyper& h) {
  // Mirrors torch/optim/adamw.py (_single_tensor_adamw): Python floats are doubles; each scalar is
  // rounded to float where it meets the float32 tensors.
  const double step = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
  AdamWScalars s{};
  s.grad_scale = h.grad_scale;
  s.decay_on = h.weight_decay != 0.0;
  s.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float w = static_cast<float>(1.0 - h.beta1);
  s.lerp_small = std::fabs(w) < 0.5f;
  s.lerp_coeff = s.lerp_small ? w : w - 1.0f;
  s.one_minus_beta1 = w;
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
  s.bc2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
  s.eps = static_cast<float>(h.eps);
  return s;
}

}  // namespace internal

Status ValidateHyper(const AdamWHyper& h) {
  const auto bad = [](const char* field, double v, const char* want) {
    return InvalidArgumentError(std::string("AdamW ") + field + " = " + std::to_string(v) +
                                " is out of range (" + want + ")");
  };
  if (!std::isfinite(h.lr) || h.lr < 0) return bad("lr", h.lr, "finite, >= 0");
  if (!(h.beta1 >= 0 && h.beta1 < 1)) return bad("beta1", h.beta1, "[0, 1)");
  if (!(h.beta2 >= 0 && h.beta2 < 1)) return bad("beta2", h.beta2, "[0, 1)");
  if (!std::isfinite(h.eps) || h.eps <= 0) return bad("eps", h.eps, "finite, > 0");
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0) {
    return bad("weight_decay", h.weight_decay, "finite, >= 0");
  }
  if (h.step == 0) return InvalidArgumentError("AdamW step must be >= 1 (the step being applied)");
  if (!std::isfinite(h.grad_scale) || h.grad_scale < 0) {
    return bad("grad_scale", h.grad_scale, "finite, >= 0");
  }
  return OkStatus();
}

bool PathSupported(KernelPath path) {
  switch (path) {
    case KernelPath::kPortable:
      return true;
    case KernelPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case KernelPath::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    case KernelPath::kAvx512Bf16:
      return PathSupported(KernelPath::kAvx512) && __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

std::vector<KernelPath> SupportedPaths() {
  std::vector<KernelPath> out;
  for (KernelPath p :
       {KernelPath::kAvx512Bf16, KernelPath::kAvx512, KernelPath::kAvx2, KernelPath::kPortable}) {
    if (PathSupported(p)) out.push_back(p);
  }
  return out;
}

KernelPath BestPath() { return SupportedPaths().front(); }

std::string_view KernelPathName(KernelPath path) {
  switch (path) {
    case KernelPath::kPortable:
      return "portable";
    case KernelPath::kAvx2:
      return "avx2";
    case KernelPath::kAvx512:
      return "avx512";
    case KernelPath::kAvx512Bf16:
      return "avx512bf16";
  }
  return "unknown";
}

std::string MissingInstructionSets(KernelPath path) {
  std::string out;
  const auto need = [&](bool have, const char* name) {
    if (have) return;
    if (!out.empty()) out += ", ";
    out += name;
  };
  switch (path) {
    case KernelPath::kPortable:
      break;
    case KernelPath::kAvx512Bf16:
      need(__builtin_cpu_supports("avx512bf16"), "AVX512_BF16");
      [[fallthrough]];
    case KernelPath::kAvx512:
      need(__builtin_cpu_supports("avx512f"), "AVX-512F");
      need(__builtin_cpu_supports("avx512bw"), "AVX-512BW");
      need(__builtin_cpu_supports("avx512vl"), "AVX-512VL");
      break;
    case KernelPath::kAvx2:
      need(__builtin_cpu_supports("avx2"), "AVX2");
      need(__builtin_cpu_supports("fma"), "FMA");
      need(__builtin_cpu_supports("f16c"), "F16C");
      break;
  }
  return out;
}

StatusOr<KernelPath> ParseKernelPath(std::string_view name) {
  if (name == "auto") return BestPath();
  for (KernelPath p :
       {KernelPath::kPortable, KernelPath::kAvx2, KernelPath::kAvx512, KernelPath::kAvx512Bf16}) {
    if (KernelPathName(p) != name) continue;
    if (!PathSupported(p)) {
      return FailedPreconditionError("kernel path '" + std::string(name) +
                                     "' needs instructions this CPU lacks: " +
                                     MissingInstructionSets(p));
    }
    return p;
  }
  return InvalidArgumentError("unknown kernel path '" + std::string(name) +
                              "' (auto, portable, avx2, avx512, avx512bf16)");
}

std::string KernelChoice::Describe() const {
  return std::string(KernelPathName(path)) + " (" + reason + ")";
}

StatusOr<KernelChoice> ResolveKernelPath(std::string_view requested) {
  KernelChoice c;
  if (!requested.empty() && requested != "auto") {
    auto p = ParseKernelPath(requested);
    if (!p.ok()) return Status(p.status().code(), "AdamW kernel: " + p.status().message());
    c.path = *p;
    c.reason = "requested";
    return c;
  }
  const char* env = std::getenv(kKernelEnvVar);
  if (env != nullptr && *env != '\0' && std::string_view(env) != "auto") {
    auto p = ParseKernelPath(env);
    if (!p.ok()) {
      return Status(p.status().code(),
                    std::string(kKernelEnvVar) + "=" + env + ": " + p.status().message());
    }
    c.path = *p;
    c.reason = std::string(kKernelEnvVar) + "=" + env;
    return c;
  }
  c.path = BestPath();
  c.reason = "fastest this CPU supports";
  return c;
}

#define OFFLOADD_DISPATCH(path, fn, ...)            \
  switch (path) {                                   \
    case KernelPath::kAvx512Bf16:                   \
      return internal::avx512bf16::fn(__VA_ARGS__); \
    case KernelPath::kAvx512:                       \
      return internal::avx512::fn(__VA_ARGS__);     \
    case KernelPath::kAvx2:                         \
      return internal::avx2::fn(__VA_ARGS__);       \
    case KernelPath::kPortable:                     \
      break;                                        \
  }                                                 \
  return internal::portable::fn(__VA_ARGS__)

double FusedAdamW(const AdamWSpan& span, const AdamWHyper& hyper, KernelPath path) {
  const internal::AdamWScalars s = internal::MakeScalars(hyper);
  OFFLOADD_DISPATCH(path, FusedAdamW, span, s);
}

double AccumulateGrad(float* acc, const void* grad, GradDtype dtype, size_t n, bool overwrite,
                      KernelPath path, const float* acc_in) {
  OFFLOADD_DISPATCH(path, AccumulateGrad, acc, acc_in != nullptr ? acc_in : acc, grad, dtype, n,
                    overwrite);
}

double GradSquaredNorm(const void* grad, GradDtype dtype, size_t n, KernelPath path) {
  OFFLOADD_DISPATCH(path, GradSquaredNorm, grad, dtype, n);
}

double CorrectAdamW(const AdamWSpan& span, const AdamWHyper& hyper, KernelPath path) {
  const internal::AdamWScalars s = internal::MakeScalars(hyper);
  OFFLOADD_DISPATCH(path, CorrectAdamW, span, s);
}

}  // namespace offloadd::workers
