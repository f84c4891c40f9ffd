#pragma once
// The named checks of job validation that ask the node (job_validator.h): its GPUs and cores
// against resources, and the GPU memory the job needs against the job's budget; the dataset
// previews (job_validator_datasets.cc). Internal to
// daemon/jobs (job_validator.cc calls them); not thread-safe beyond ValidateJobSpec's own calls.

#include <cstdint>
#include <memory>
#include <string>

#include "engine/model_config.h"
#include "job/job_validator.h"
#include "job/path_policy.h"
#include "jobspec/field_violation.h"
#include "offloadd/v1/job.pb.h"
#include "text/chat_template.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

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

// The tokenizer (tokenizer.path, else the model directory's) and the directory it is in.
struct TokenizerCheck {
  std::unique_ptr<text::Tokenizer> tokenizer;  // null when it did not load
  std::string dir;
};

// dataset.paths, eval_paths and a mixture's datasets[i].paths: each distinct file resolves, and
// its first records parse and encode, within the request's preview budget; something trains
// (job_validator_datasets.cc).
void CheckDatasets(offloadd::v1::JobSpec& spec, const PathPolicy& paths, const TokenizerCheck& tok,
                   const text::ChatTemplate* chat, const engine::ModelConfig* config,
                   const ValidationOptions& options, text::jinja::RequestBudget* render_budget,
                   Checker& c, ValidationResult* r);

}  // namespace offloadd::daemon
