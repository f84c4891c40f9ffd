#pragma once
// NodeProfile: what this machine's resources do alone, measured once and cached (the per-node half
// of the step's price): host memory bandwidth (STREAM triad on every usable core), the AdamW
// kernel's rate on the optimizer's thread count and on 1, 2, 4, ... threads, and while both PCIe
// directions copy, each PCIe direction alone and both at once (pinned host memory, on CUDA), and
// the NVMe store directory's write and read rates. The step planner (job/step_planner.h) prices
// a plan with it.
//
// Cached as JSON at <dir>/node-profile.json under a key naming the host, the CPU model, the
// usable cores, the AdamW thread count and kernel, and the GPU: a profile measured elsewhere or
// with other settings is measured again, never reused.
#include <c10/core/Device.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "job/node_profile_file.h"

namespace offloadd::trainer {

// Cached profile when `dir` holds one with the same key, else measures (and writes it when `dir`
// is not empty). `*cached` tells which; `*cache_problem` says why a measured profile could not be
// written (the caller warns: the cache only saves time). Errors: an unusable AdamW kernel.
// store_dirs: the NVMe store directories to measure, each alone (part of the key).
StatusOr<NodeProfile> LoadOrMeasureNodeProfile(const std::string& dir, int threads,
                                               const std::string& kernel, c10::Device device,
                                               const std::vector<std::string>& store_dirs,
                                               bool* cached, std::string* cache_problem);
std::string DescribeNodeProfile(const NodeProfile& p);

}  // namespace offloadd::trainer
