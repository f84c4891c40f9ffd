#include "job/capacity.h"

#include <cstdio>
#include <limits>
#include <vector>

#include "common/units.h"
#include "job/arena_layout.h"
#include "workers/adamw_kernel.h"

namespace offloadd::trainer {
namespace {

std::string Fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "10.43 B", "110.6 M", "84224": parameter counts.
std::string Count(double n) {
  if (n >= 1e9) return Fixed(n / 1e9, 2) + " B";
  if (n >= 1e6) return Fixed(n / 1e6, 1) + " M";
  return Fixed(n, 0);
}

// "12", "6.03", "1.2": bytes per parameter as the docs write them.
std::string PerParam(double v) {
  if (v >= 100) return Fixed(v, 0);  // a small model's processes: no exponent
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

bool OnDevice(const HostOptimizerOptions& o, size_t b) {
  return b < o.device_blocks.size() && o.device_blocks[b];
}

}  // namespace

CapacityFigures JobCapacity(const HostMemoryInputs& in, uint64_t limit, uint64_t disk_free) {
  CapacityFigures c;
  const HostOptimizerOptions& o = in.optimizer;
  c.limit = limit;
  c.disk_free = disk_free == std::numeric_limits<uint64_t>::max() ? 0 : disk_free;
  c.floor_bytes = workers::StateBytesPerParam(o.mode);
  const workers::ShardLayoutOptions lo = internal::LayoutOptions(o);
  const double grad = static_cast<double>(workers::GradBytes(lo.grad_dtype)) +
                      (lo.accumulation_steps > 1 ? 4.0 : 0.0);
  double states = 0, gradients = 0, copies = 0;
  for (size_t b = 0; b < o.block_elements.size(); ++b) {
    const auto n = static_cast<double>(o.block_elements[b]);
    c.params += o.block_elements[b];
    gradients += grad * n;
    if (OnDevice(o, b)) continue;  // master and moments on the GPU
    states += c.floor_bytes * n;
    // A 16-bit copy beside the fp32 master, in the arena or in the store (none where the device
    // reads the master: internal::BlockWeightsFp32); with fp32 compute an NVMe block's fp32
    // compute copy stays in RAM (internal::ExtraBytes).
    if (lo.weight_dtype != workers::WeightDtype::kNone && !internal::BlockWeightsFp32(o, b)) {
      copies += 2 * n;
    } else if (o.compute == HostDtype::kFp32 && internal::OnNvme(o, b)) {
      copies += 4 * n;
    }
  }
  if (c.params == 0) return c;
  const double p = static_cast<double>(c.params);
  c.states = states / p;
  c.gradients = gradients / p;
  c.weight_copies = copies / p;
  const HostMemoryPrediction pred = PredictHostMemory(in);
  const double held = static_cast<double>(pred.total + pred.disk_bytes) / p;
  c.rest = held - c.states - c.gradients - c.weight_copies;
  c.physical_params = static_cast<double>(c.limit + c.disk_free) / c.floor_bytes;
  c.fraction = c.physical_params > 0 ? p / c.physical_params : 0;
  return c;
}

std::string CapacityFigures::Describe() const {
  const std::string mode = floor_bytes == 12 ? "exact AdamW" : "this optimizer mode";
  std::string s = "capacity: " + Count(static_cast<double>(params)) + " parameters, " +
                  Fixed(100 * fraction, 1) + "% of the " + Count(physical_params) +
                  " this node holds for " + mode + " ((host memory limit " + FormatByteSize(limit) +
                  " + " +
                  (disk_free > 0 ? FormatByteSize(disk_free) + " free in the store directories"
                                 : std::string("no store directory")) +
                  ") / " + PerParam(floor_bytes) + " B per parameter)";
  s += "; the plan holds " + PerParam(held()) +
       " B per parameter in RAM and on disk: " + PerParam(states) +
       " master and optimizer states, " + PerParam(gradients) + " gradients";
  if (weight_copies > 0) s += ", " + PerParam(weight_copies) + " weight copies beside the masters";
  s += ", " + PerParam(rest) +
       " the rest (staging slots, versions in flight, processes, activations, rounding)";
  return s;
}

std::optional<std::string> CompactModeFix(const HostMemoryInputs& in, uint64_t limit) {
  if (!in.optimizer.mode.Exact() || limit == 0) return std::nullopt;
  using workers::MasterDtype;
  using workers::StateDtype;
  // The least lossy first. A bf16 master (bf16 compute only) is the fp32 master's 4 bytes with its
  // compensation, but is itself the device's weights: last, for a job that keeps a 16-bit copy
  // beside its fp32 masters (host_weight_copy), which it then drops.
  std::vector<workers::OptimizerMode> modes = {{StateDtype::kBf16, MasterDtype::kFp32},
                                               {StateDtype::kInt8, MasterDtype::kFp32}};
  if (in.optimizer.compute == HostDtype::kBf16)
    modes.push_back({StateDtype::kInt8, MasterDtype::kBf16});
  for (const workers::OptimizerMode& m : modes) {
    HostMemoryInputs t = in;
    t.optimizer.tier = StateTier::kCpu;  // the compact modes keep their states in RAM
    t.optimizer.nvme_blocks.clear();
    t.optimizer.nvme_weight_blocks.clear();
    t.optimizer.mode = m;
    const HostMemoryPrediction q = PredictHostMemory(t);
    if (q.total > limit) continue;
    const std::string state = m.state == StateDtype::kBf16 ? "bf16" : "int8";
    std::string settings = "optimizer.state_dtype: " + state + " (--state-dtype=" + state + ")";
    if (m.master == MasterDtype::kBf16)
      settings += " and optimizer.master_dtype: bf16 (--master-dtype=bf16)";
    return "a compact optimizer mode, " + m.Describe() + ", with the states in RAM: " + settings +
           ": " + q.Describe();
  }
  return std::nullopt;
}

}  // namespace offloadd::trainer
