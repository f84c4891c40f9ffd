#pragma once
// ShapeProfile: what one step of a model at one micro-batch shape measured on this node, per block
// (the per-block half; LoHan §IV-B's first-iteration profile): forward,
// backward and recompute times, the bytes its activations hold when kept and when recomputed,
// and the caching allocator's peak within its forward and backward, plus the step's own peak.
// The trainer records it on the step it prices its plan with and caches it under
// <profile_dir>/shapes/, keyed by the GPU, the model fingerprint, the micro-batch shape and dtype;
// later runs of the same key size their GPU working set from it instead of the static estimate
// (trainer_setup.cc), and the step planner prices kept layers with its measured bytes and times.
//
// Torch-free: the daemon lists the cached profiles for `offloadctl node`.
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::trainer {

struct BlockProfile {
  std::string name;            // "embedding", "model.layers.3", "head"
  std::string mode;            // what its forward kept in the profiled step (SaveModeName)
  // Per micro-batch, seconds of device time (CUDA events; wall time on a CPU device).
  double forward_s = 0;
  double backward_s = 0;       // recompute included when recomputed
  double recompute_s = 0;      // the forward re-run inside backward: the same Run as forward_s
  int64_t keep_bytes = 0;      // activations held when kept (measured: the tensors it saved)
  int64_t recompute_bytes = 0; // held when recomputed (its input)
  // CUDA: the allocator's peak within the span above the bytes allocated at its start.
  int64_t forward_transient_bytes = 0;
  int64_t backward_transient_bytes = 0;
};

struct ShapeProfile {
  std::string key;       // ShapeProfileKey()
  std::string gpu;       // device name, "cpu" on the CPU device
  std::string model;     // model fingerprint (trainer/state/checkpoint.h ModelFingerprint)
  int64_t batch = 0, seq = 0;
  std::string dtype;
  int64_t profiled_step = 0;
  std::vector<BlockProfile> blocks;
  double gpu_seconds = 0;           // the step's compute, per micro-batch
  int64_t peak_reserved_bytes = 0;  // the step's allocator peaks (CUDA)
  int64_t peak_allocated_bytes = 0;
  // peak_reserved_bytes less what the plan held by design when it was measured (weights and
  // activations, by the same formulas the plan uses): the step's working set, in place of the
  // static workspace estimate for this key.
  int64_t workspace_bytes = 0;
  std::string measured_at;  // UTC, ISO 8601
};

inline constexpr char kShapeProfileDir[] = "shapes";

// "<gpu> | <model> | <batch>x<seq> <dtype>".
std::string ShapeProfileKey(const std::string& gpu, const std::string& model, int64_t batch,
                            int64_t seq, const std::string& dtype);
// <dir>/shapes/<16 hex digits of the key's hash>.json.
std::string ShapeProfilePath(const std::string& dir, const std::string& key);

// NOT_FOUND when absent; INVALID_ARGUMENT naming the problem when it is not a shape profile.
StatusOr<ShapeProfile> ReadShapeProfile(const std::string& path);
std::string ShapeProfileJson(const ShapeProfile& p);
// Writes it atomically (temporary file, rename), creating <dir>/shapes.
Status WriteShapeProfile(const std::string& dir, const ShapeProfile& p);
// The profiles cached under <dir>/shapes, newest first; unreadable files are named in *problems.
std::vector<ShapeProfile> ListShapeProfiles(const std::string& dir, std::vector<std::string>* problems);

// One line: "model.layers.3: fwd 12.1 ms, bwd 30.2 ms (recompute 12.0 ms), keeps 1.2 GiB ..."
std::string DescribeBlockProfile(const BlockProfile& b);

}  // namespace offloadd::trainer
