#pragma once
// Lower bounds on the memory a job needs, from the model's shape and the job's batch, so that an
// infeasible budget is refused at validation with the numbers that do not fit. These are floors
// (what the streaming schedule cannot go below), not the planner's exact placement.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "job/host_memory.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

struct ModelSize {
  int64_t total_params = 0;
  int64_t largest_block_params = 0;  // the largest of embedding, one decoder layer, head
  int64_t layer_params = 0;          // the largest decoder layer (MoE models: a sparse one)
  int64_t embedding_params = 0;
  // Per decoder layer (MoE models mix sparse layers, which hold every expert, and dense ones);
  // what the host RAM estimate and the step estimate price block by block.
  std::vector<int64_t> layers;
};
// The blocks the trainer plans (embedding, each of the num_layers decoder layers, the head with the
// final norm); a size without per-layer figures prices every layer at layer_params.
std::vector<int64_t> BlockParams(const ModelSize& size, int64_t num_layers);

ModelSize EstimateModelSize(const engine::ModelConfig& config);

struct MemoryFloor {
  uint64_t gpu_bytes = 0;         // streaming everything, recomputing activations
  std::string gpu_breakdown;      // human-readable parts of gpu_bytes
  // Host RAM and disk: JobHostMemoryInputs below, priced by the trainer's own functions.
};

// compute_bytes: 2 for bf16/fp16, 4 for fp32.
MemoryFloor EstimateMemoryFloor(const ModelSize& size, const engine::ModelConfig& config, int64_t batch,
                                int64_t seq_len, int compute_bytes);

// The largest batch (1..max_batch) whose floor fits gpu_bytes at seq_len; 0 when not even batch 1.
int64_t LargestBatchWithin(const ModelSize& size, const engine::ModelConfig& config, int64_t seq_len,
                           int compute_bytes, uint64_t gpu_bytes, int64_t max_batch);
// The largest max_seq_length (a multiple of 8, at most max_len) whose floor at `batch` fits
// gpu_bytes; 0 when not even 8 tokens do. The floor grows with the sequence, so bisect.
int64_t LargestSeqLengthWithin(const ModelSize& size, const engine::ModelConfig& config,
                               int64_t batch, int compute_bytes, uint64_t gpu_bytes,
                               int64_t max_len);

// The GPU floor measured on this node: when <profile_dir>/shapes holds the
// shape profile a job of this model, micro-batch and dtype recorded on a GPU named `gpu`
// (job/shape_profile.h), the floor is the static floor's weight buffers (two of the largest
// block plus its gradient) plus that run's measured working set and a 256 MiB margin; the
// checkpoints can wait in pinned RAM (recompute_offload_cpu). Nothing when no profile matches.
struct ProfiledFloor {
  uint64_t gpu_bytes = 0;
  std::string source;  // "the shape profile of <date> on <gpu>: working set W + weights S + margin"
};
std::optional<ProfiledFloor> ProfiledGpuFloor(const std::string& profile_dir, const std::string& gpu,
                                              const engine::ModelConfig& config, const ModelSize& size,
                                              int64_t batch, int64_t seq_len, int compute_bytes);

// The job's step priced on this node (job/step_estimate.h) for `offloadctl submit
// --validate-only`: the node profile under profile_dir and, when a run of this model at this
// micro-batch and length recorded one on the GPU named `gpu` ("" for a CPU job), its shape profile.
v1::StepEstimate StepEstimateUnavailable(const std::string& why);
v1::StepEstimate EstimateJobStep(const std::string& profile_dir, const std::string& gpu,
                                 const engine::ModelConfig& config, const ModelSize& size,
                                 int64_t micro, int64_t accumulation, int64_t seq_len,
                                 int compute_bytes, bool held_updates, int64_t nvme_params = 0,
                                 bool weights_fp32 = true);

// The host RAM and disk the job needs as the trainer plans it (job/host_memory.h): its arena
// sized by ArenaBytes from the model's blocks (embedding, decoder layers, head),
// the compute dtype, the accumulation and the tier of its optimizer states. The checkpoints the
// trainer may keep in pinned RAM are placed when the job starts and are not counted here (the
// trainer checks again with them before its arena is made).
trainer::HostMemoryInputs JobHostMemoryInputs(const v1::JobSpec& spec, const engine::ModelConfig& config,
                                              const ModelSize& size, int compute_bytes, bool gpu);

}  // namespace offloadd::daemon
