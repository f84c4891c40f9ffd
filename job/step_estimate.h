#pragma once
// The step a job would run at, priced without running anything (`offloadctl
// submit --validate-only` shows it): the step planner's cost model (job/step_planner.h) on the
// node profile's rates, with the GPU work of the job's shape from the shape profile a run of the
// same model, micro-batch and length recorded on this node. Without such a profile the GPU's share
// is unknown to a process that cannot run the model (the daemon validating a spec), and the
// estimate is a lower bound: the CPU update, host memory and PCIe terms only. offloadd-train
// --validate-only prices the GPU work too (it times the blocks at the shape).
//
// Torch-free: the daemon computes it at validation.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/node_profile_file.h"
#include "job/shape_profile.h"

namespace offloadd::trainer {

struct StepEstimateInputs {
  std::vector<int64_t> block_params;  // embedding, decoder layers, head
  int64_t micro = 1, seq = 1;         // rows and tokens per row of a micro-batch
  int64_t accumulation = 1;
  int compute_bytes = 2;  // of the gradients that cross PCIe
  // The device reads the fp32 masters and casts them (4 B per upload; the default on the RAM
  // tier); false: the 16-bit copy the workers write (compute_bytes per upload, 2 B more traffic).
  bool weights_fp32 = true;
  int64_t nvme_params = 0;            // parameters whose states are on NVMe (the store's rates)
  bool gpu = true;                    // CUDA: weights stream in, gradients out
  bool held_updates = false;          // clipping or fp16's overflow check: updates wait for the norm
  std::optional<NodeProfile> node;    // none: no estimate (NOT_FOUND)
  std::optional<ShapeProfile> shape;  // the job's shape measured on this node: the GPU's work
};

struct StepEstimate {
  bool lower_bound = false;  // the GPU's work was not known: the step takes at least this
  double step_seconds = 0;
  double tokens_per_second = 0;  // micro x accumulation x seq per step (at most, for a bound)
  std::string bound;             // the resource that sets it
  std::string basis;             // where the figures come from
  std::string text;              // "0.78 s/step, 42.1k tokens/s (...)"
};

// NOT_FOUND without a node profile; INVALID_ARGUMENT for inputs the planner refuses.
StatusOr<StepEstimate> EstimateStep(const StepEstimateInputs& in);

// The newest cached shape profile of this model (fingerprint prefix "<model_type>/<blocks>
// layers/<params> params/"), micro-batch, length and dtype on the GPU named `gpu`; none if absent.
std::optional<ShapeProfile> FindShapeProfile(const std::string& profile_dir, const std::string& gpu,
                                             const std::string& fingerprint_prefix, int64_t batch,
                                             int64_t seq, int compute_bytes);

}  // namespace offloadd::trainer
