#pragma once
// The named checks of job validation that ask the node (job_validator.h): its GPUs and cores
// against resources, and the GPU memory the job needs against the job's budget. Internal to
// daemon/jobs (job_validator.cc calls them); not thread-safe beyond ValidateJobSpec's own calls.

#include <cstdint>

#include "engine/model_config.h"
#include "job/job_validator.h"
#include "jobspec/field_violation.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// Bytes per value the job computes in: 4 for fp32 (the default on the CPU), else 2.
int ComputeBytes(const offloadd::v1::JobSpec& spec, bool gpu);

// resources.gpus and gpu_index against this node's GPUs (or cores, without GPUs); a GPU the node
// cannot drive; lsp compression's compute dtype on a GPU.
void CheckResources(const offloadd::v1::JobSpec& spec, const NodeBudget& node, Checker& c);

// The model's size, the memory floor of its batch and the step's price on this node into `r`;
// on a GPU node, the floor (or the measured working set of this shape) and the optimizer states
// asked onto the GPU against `gpu_memory_limit` (the job's or the daemon's; 0: the GPU's memory).
// The step's price on this node for `offloadctl submit --validate-only`, after the host check has
// placed the NVMe blocks (r->host_memory).
void PriceStep(const offloadd::v1::JobSpec& spec, const engine::ModelConfig& config,
               const NodeBudget& node, ValidationResult* r);
void CheckGpuMemory(const offloadd::v1::JobSpec& spec, const engine::ModelConfig& config,
                    const NodeBudget& node, uint64_t gpu_memory_limit, Checker& c,
                    ValidationResult* r);

}  // namespace offloadd::daemon
