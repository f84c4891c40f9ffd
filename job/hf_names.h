#pragma once
// The Hugging Face TrainingArguments / TRL SFTConfig names that JobSpec.training accepts for
// settings offloadd keeps elsewhere in the spec (bf16, fp16, gradient_checkpointing, optim,
// max_length, completion_only_loss, assistant_only_loss; job.proto, docs/hf-names.md). Job
// validation maps each onto the setting it stands for and clears it, so the resolved spec, the
// stored job and MakeTrainConfig see only offloadd's own settings: a name is never accepted and
// ignored. Thread-safe (no state).

#include <string>
#include <vector>

#include "jobspec/field_violation.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// Maps the names `spec->training()` sets onto their settings and clears them. A name that
// contradicts the setting it maps to (bf16: true with model.compute_dtype: fp32), two names that
// contradict each other, and an optimizer other than AdamW are violations, each at the HF name's
// field path; the settings are then left as they were.
void ResolveHfNames(offloadd::v1::JobSpec* spec, std::vector<FieldViolation>* violations);

// The `optim` values that mean AdamW as offloadd implements it (full-precision, decoupled weight
// decay): the implementation variants of transformers' OptimizerNames.
const std::vector<std::string>& AdamWOptimNames();
// The `optim` values of 8-bit AdamW (bitsandbytes): fp32 master weights, blockwise 8-bit states.
// They resolve to optimizer.state_dtype int8.
const std::vector<std::string>& AdamW8bitOptimNames();

}  // namespace offloadd::daemon
