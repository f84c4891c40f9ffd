#pragma once
// NodeProfile: what this machine's resources do alone, measured once and cached (issue #13 item 1,
// the per-node half): host memory bandwidth (STREAM triad on every usable core), the AdamW
// kernel's rate on the optimizer's thread count, and each PCIe direction alone and both at once
// (pinned host memory, on CUDA). The step planner (trainer/step_planner.h) prices a plan with it.
//
// Cached as JSON at <dir>/node-profile.json under a key naming the host, the CPU model, the
// usable cores, the AdamW thread count and kernel, and the GPU: a profile measured elsewhere or
// with other settings is measured again, never reused.
#include <c10/core/Device.h>

#include <string>

#include "common/status.h"

namespace offloadd::trainer {

struct NodeProfile {
  std::string key;
  // The larger of a STREAM triad (a = b + s c, 3 x 4 B per element, no write-allocate) and the
  // AdamW measurement's own traffic (28 B per parameter).
  double host_bytes_per_s = 0;
  double cpu_params_per_s = 0;  // fused AdamW, bf16 grads/weights, alone on idle cores
  int threads = 0;              // of the AdamW measurement
  std::string kernel;           // its code path
  double h2d_bytes_per_s = 0;   // 0 without CUDA
  double d2h_bytes_per_s = 0;
  double both_bytes_per_s = 0;  // H2D + D2H at once, summed
  double measure_seconds = 0;   // how long measuring took
  std::string measured_at;      // UTC, ISO 8601
};

// Cached profile when `dir` holds one with the same key, else measures (and writes it when `dir`
// is not empty; a failure to write is returned, not ignored). `*cached` tells which.
StatusOr<NodeProfile> LoadOrMeasureNodeProfile(const std::string& dir, int threads,
                                               const std::string& kernel, c10::Device device,
                                               bool* cached);
std::string DescribeNodeProfile(const NodeProfile& p);

}  // namespace offloadd::trainer
