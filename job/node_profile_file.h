#pragma once
// The node profile's value type and its JSON file (torch-free: the daemon reads it for
// `offloadctl node`). Measuring it is trainer/plan/node_profile.h.
#include <cstdint>
#include <string>
#include <vector>

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
  // The AdamW rate per thread count (1, 2, 4, ... up to `threads`), alone on idle cores, and at
  // `threads` while both PCIe directions copy (CUDA; 0 without): how the update scales and what
  // the DMA's share of the memory bus costs it.
  struct ThreadRate {
    int threads = 0;
    double params_per_s = 0;
  };
  std::vector<ThreadRate> adamw_by_threads;
  double cpu_params_per_s_during_dma = 0;
  // Each NVMe store directory's sequential rates alone (O_DIRECT when it allows it).
  struct StoreRate {
    std::string dir;
    double read_bytes_per_s = 0, write_bytes_per_s = 0;
    bool direct_io = false;
    uint64_t device = 0;  // st_dev: directories on one device share its rate
  };
  std::vector<StoreRate> stores;
  // What the store reaches striped over them: per device the fastest directory's rate, summed
  // over the devices. store_dir: the first directory (empty: none).
  std::string store_dir;
  double store_read_bytes_per_s = 0;
  double store_write_bytes_per_s = 0;
  bool store_direct_io = false;
  double measure_seconds = 0;   // how long measuring took
  std::string measured_at;      // UTC, ISO 8601
};

inline constexpr char kNodeProfileFile[] = "node-profile.json";

// The striped rates from `stores` (per device the fastest directory, summed over devices), and
// store_dir, store_direct_io.
void SumStoreRates(NodeProfile* p);
// NOT_FOUND when absent; INVALID_ARGUMENT naming the problem when it is not a profile.
StatusOr<NodeProfile> ReadNodeProfile(const std::string& path);
std::string NodeProfileJson(const NodeProfile& p);

}  // namespace offloadd::trainer
