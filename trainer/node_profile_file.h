#pragma once
// The node profile's value type and its JSON file (torch-free: the daemon reads it for
// `offloadctl node`). Measuring it is trainer/node_profile.h.
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

inline constexpr char kNodeProfileFile[] = "node-profile.json";

// NOT_FOUND when absent; INVALID_ARGUMENT naming the problem when it is not a profile.
StatusOr<NodeProfile> ReadNodeProfile(const std::string& path);
std::string NodeProfileJson(const NodeProfile& p);

}  // namespace offloadd::trainer
