#include "job/step_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/units.h"

namespace offloadd::trainer {
std::vector<int> KeptBlocks(const PlanInputs& in, int keep) {
  std::vector<int> kept;
  for (int b = static_cast<int>(in.keep_extra_bytes.size()) - 1; b >= 0; --b) {
    if (static_cast<int>(kept.size()) == keep) break;
    if (in.keep_extra_bytes[b] > 0) kept.push_back(b);
  }
  return kept;
}

std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f s", s);
  return buf;
}

Status ValidatePlanInputs(const PlanInputs& in) {
  const size_t n = in.params.size();
  if (n == 0) return InvalidArgumentError("plan inputs: no blocks");
  if (in.device_state_bytes.size() != n || in.keep_extra_bytes.size() != n ||
      in.recompute_seconds.size() != n) {
    return InvalidArgumentError("plan inputs: params, device_state_bytes, keep_extra_bytes and "
                                "recompute_seconds must have one entry per block");
  }
  for (size_t b = 0; b < n; ++b) {
    if (in.params[b] < 0 || in.device_state_bytes[b] < 0 || in.keep_extra_bytes[b] < 0 ||
        !(in.recompute_seconds[b] >= 0)) {
      return InvalidArgumentError("plan inputs: block " + std::to_string(b) +
                                  " has a negative size or time");
    }
  }
  const std::pair<const char*, double> rates[] = {{"host_bytes_per_s", in.host_bytes_per_s},
                                                  {"cpu_params_per_s", in.cpu_params_per_s},
                                                  {"h2d_bytes_per_s", in.h2d_bytes_per_s},
                                                  {"d2h_bytes_per_s", in.d2h_bytes_per_s}};
  for (const auto& [name, v] : rates) {
    if (!(v > 0) || !std::isfinite(v)) {
      return InvalidArgumentError(std::string("plan inputs: ") + name + " must be positive");
    }
  }
  if (!(in.gpu_seconds >= 0) || !(in.h2d_bytes >= 0) || !(in.d2h_bytes >= 0)) {
    return InvalidArgumentError("plan inputs: gpu_seconds, h2d_bytes and d2h_bytes must be >= 0");
  }
  if (!(in.cpu_params_per_s_during_dma >= 0) || !std::isfinite(in.cpu_params_per_s_during_dma)) {
    return InvalidArgumentError("plan inputs: cpu_params_per_s_during_dma must be >= 0");
  }
  if (!(in.norm_tail_seconds >= 0) || !(in.update_tail_seconds >= 0) || !std::isfinite(in.norm_tail_seconds) ||
      !std::isfinite(in.update_tail_seconds)) {
    return InvalidArgumentError("plan inputs: norm_tail_seconds and update_tail_seconds must be >= 0");
  }
  if (!(in.nvme_weight_params >= 0) || !(in.nvme_weight_params <= in.nvme_params) ||
      !(in.nvme_weight_reads >= 0)) {
    return InvalidArgumentError(
        "plan inputs: nvme_weight_params must be in [0, nvme_params] and nvme_weight_reads >= 0");
  }
  if (!(in.nvme_params >= 0) || !(in.nvme_read_bytes_per_s >= 0) ||
      !(in.nvme_write_bytes_per_s >= 0) || !std::isfinite(in.nvme_params)) {
    return InvalidArgumentError("plan inputs: nvme_params and the NVMe rates must be >= 0");
  }
  if (!(in.nvme_activation_bytes >= 0) || !std::isfinite(in.nvme_activation_bytes)) {
    return InvalidArgumentError("plan inputs: nvme_activation_bytes must be >= 0");
  }
  if (!(in.gpu_forward_seconds >= 0) || in.gpu_forward_seconds > in.gpu_seconds) {
    return InvalidArgumentError("plan inputs: gpu_forward_seconds must be in [0, gpu_seconds]");
  }
  if (in.budget_bytes <= 0) return InvalidArgumentError("plan inputs: budget_bytes must be positive");
  return OkStatus();
}

double HostUpdateBytesPerParam(const ParamTraffic& t) {
  const int A = std::max(1, t.accumulation);
  const double grad = A > 1 ? 4 : t.grad_bytes;  // what the update and the norm read
  double bytes = grad + 2 * t.state_bytes + (t.weight_copy ? 2 : 0) + (t.cpu_norm ? grad : 0);
  // Accumulation: each micro-batch's staged gradient read; the buffer written by the first, read
  // and written by the others.
  if (A > 1) bytes += A * t.grad_bytes + 4 + 8.0 * (A - 1);
  return bytes;
}

void ApplyParamTraffic(const ParamTraffic& t, PlanInputs* in) {
  const int A = std::max(1, t.accumulation);
  in->host_bytes_per_param = HostUpdateBytesPerParam(t);
  in->h2d_saved_per_param = (t.streamed ? 2.0 * A : 1.0) * t.upload_bytes;
  in->d2h_saved_per_param = static_cast<double>(A) * t.grad_bytes;
  in->nvme_state_bytes = t.state_bytes;
}

PlanChoice EvaluatePlan(const PlanInputs& in, int device_blocks, int keep_layers) {
  PlanChoice c;
  c.device_blocks = device_blocks;
  c.keep_layers = keep_layers;
  int64_t total_params = 0, placed = 0, state_bytes = 0, keep_bytes = 0;
  double recompute_saved = 0;
  for (size_t b = 0; b < in.params.size(); ++b) total_params += in.params[b];
  for (int b = 0; b < device_blocks; ++b) {
    placed += in.params[b];
    state_bytes += in.device_state_bytes[b];
  }
  for (int b : KeptBlocks(in, keep_layers)) {
    keep_bytes += in.keep_extra_bytes[b];
    recompute_saved += in.recompute_seconds[b];
  }
  c.placed_params = placed;
  c.recompute_saved_s = recompute_saved;
  const double cpu_params = static_cast<double>(total_params - placed);
  const double h2d = std::max(0.0, in.h2d_bytes - in.h2d_saved_per_param * placed);
  const double d2h = std::max(0.0, in.d2h_bytes - in.d2h_saved_per_param * placed);
  c.gpu_s = std::max(0.0, in.gpu_seconds - recompute_saved) + in.device_seconds_per_param * placed;
  c.cpu_s = cpu_params / in.cpu_params_per_s;
  if (in.cpu_params_per_s_during_dma > 0) {
    // The first min(T, DMA time) seconds run at the contended rate, the rest alone.
    const double dma = std::max(h2d / in.h2d_bytes_per_s, d2h / in.d2h_bytes_per_s);
    const double contended = in.cpu_params_per_s_during_dma * dma;
    c.cpu_s = cpu_params <= contended ? cpu_params / in.cpu_params_per_s_during_dma
                                      : dma + (cpu_params - contended) / in.cpu_params_per_s;
  }
  // An NVMe block's states also cross host memory twice more: read into the staging slots, and
  // written back from them (nvme_state_bytes each way: 12 B exact).
  // The weights on NVMe cross it once per read and once written back.
  const double weight_read = 2.0 * in.nvme_weight_reads * in.nvme_weight_params;
  const double weight_write = 2.0 * in.nvme_weight_params;
  c.host_s = (cpu_params * in.host_bytes_per_param + 2 * in.nvme_state_bytes * in.nvme_params +
              weight_read + weight_write + h2d + d2h) /
             in.host_bytes_per_s;
  c.h2d_s = h2d / in.h2d_bytes_per_s;
  c.d2h_s = d2h / in.d2h_bytes_per_s;
  if ((in.nvme_params > 0 || in.nvme_activation_bytes > 0) && in.nvme_read_bytes_per_s > 0 &&
      in.nvme_write_bytes_per_s > 0) {
    // Reads and writes share the drives (NvmeStepSeconds, job/host_memory.h).
    const double bytes = in.nvme_state_bytes * in.nvme_params + in.nvme_activation_bytes;
    c.nvme_s = (bytes + weight_read) / in.nvme_read_bytes_per_s +
               (bytes + weight_write) / in.nvme_write_bytes_per_s;
  }
  if (in.held_updates) {
    const double update = std::max(c.cpu_s, cpu_params * in.host_bytes_per_param / in.host_bytes_per_s);
    c.update_s = update;
    const double backward = std::max(0.0, in.gpu_seconds - in.gpu_forward_seconds - recompute_saved);
    c.held_s = backward + in.norm_tail_seconds + in.device_seconds_per_param * placed +
               std::max(in.gpu_forward_seconds, update + in.update_tail_seconds);
  }
  const std::pair<const char*, double> parts[] = {
      {"GPU", c.gpu_s}, {"CPU update", c.cpu_s}, {"host memory", c.host_s}, {"H2D", c.h2d_s},
      {"D2H", c.d2h_s}, {"NVMe", c.nvme_s},      {"held updates", c.held_s}};
  for (const auto& [name, s] : parts) {
    if (s > c.predicted_s || c.bound.empty()) {
      c.predicted_s = s;
      c.bound = name;
    }
  }
  c.gpu_bytes = in.base_peak_bytes + in.margin_bytes + state_bytes + keep_bytes;
  c.feasible = c.gpu_bytes <= in.budget_bytes;
  return c;
}

StatusOr<PlanChoice> SolvePlan(const PlanInputs& in) {
  RETURN_IF_ERROR(ValidatePlanInputs(in));
  const int n = static_cast<int>(in.params.size());
  if (in.fixed_device_blocks > n) {
    return InvalidArgumentError("plan inputs: fixed_device_blocks exceeds the " + std::to_string(n) +
                                " blocks");
  }
  const int keepable = static_cast<int>(KeptBlocks(in, n).size());
  const int min_s = std::max(0, in.fixed_device_blocks);
  int max_s = in.fixed_device_blocks >= 0 ? in.fixed_device_blocks : in.place_states ? n : 0;
  if (in.max_device_blocks >= 0 && in.fixed_device_blocks < 0)
    max_s = std::min(max_s, std::max(min_s, in.max_device_blocks));
  const int max_k = in.keep_activations ? keepable : 0;
  // The plan already running is always allowed: (0, 0) is what the first step ran, and fixed
  // blocks are already on the GPU.
  PlanChoice best = EvaluatePlan(in, min_s, 0);
  best.feasible = true;
  auto better = [](const PlanChoice& a, const PlanChoice& b) {
    if (a.predicted_s < b.predicted_s * 0.995) return true;
    if (a.predicted_s > b.predicted_s * 1.005) return false;
    if (a.keep_layers != b.keep_layers) return a.keep_layers < b.keep_layers;
    return a.device_blocks > b.device_blocks;
  };
  for (int s = min_s; s <= max_s; ++s) {
    for (int k = 0; k <= max_k; ++k) {
      const PlanChoice c = EvaluatePlan(in, s, k);
      if (c.feasible && better(c, best)) best = c;
    }
  }
  return best;
}

std::string DescribePlan(const PlanChoice& c, int64_t budget_bytes) {
  std::ostringstream o;
  o << c.device_blocks << (c.device_blocks == 1 ? " block's" : " blocks'")
    << " AdamW states on the GPU, " << c.keep_layers
    << (c.keep_layers == 1 ? " layer's" : " layers'") << " activations kept: predicted "
    << FormatSeconds(c.predicted_s) << "/step (" << c.bound << "; GPU " << FormatSeconds(c.gpu_s)
    << ", CPU " << FormatSeconds(c.cpu_s) << ", host memory " << FormatSeconds(c.host_s) << ", H2D "
    << FormatSeconds(c.h2d_s) << ", D2H " << FormatSeconds(c.d2h_s);
  if (c.nvme_s > 0) o << ", NVMe " << FormatSeconds(c.nvme_s);
  if (c.held_s > 0) o << ", held updates " << FormatSeconds(c.held_s);
  o << "), "
    << FormatByteSize(static_cast<uint64_t>(std::max<int64_t>(0, c.gpu_bytes))) << " of "
    << FormatByteSize(static_cast<uint64_t>(budget_bytes));
  return o.str();
}

}  // namespace offloadd::trainer
