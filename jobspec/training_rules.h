#pragma once
// The rules of a job spec that need nothing but its values: the Hugging Face / DeepSpeed defaults
// of job.proto, and the ranges of the training arguments (learning_rate, steps, betas, the
// scheduler and its kwargs). Job validation (job_validator.h) applies them at CreateJob, and
// `offloadctl convert` (client/cpp/config_convert.h) checks the values it converts with the same
// rules, so a converted file holds no value the daemon would refuse. Torch-free and daemon-free
// (proto and common only; part of the C++ SDK). Thread-safe: pure functions.

#include <vector>

#include "jobspec/field_violation.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// Fills unset optional fields with the Hugging Face / DeepSpeed defaults documented in job.proto.
void ApplyJobDefaults(offloadd::v1::JobSpec* spec);

// Appends a violation ("training.learning_rate": "must be in (0, 1], got nan") for each value of
// `t` out of its range. Every field is checked: apply the defaults first for a spec with unset
// ones.
void CheckTrainingValues(const offloadd::v1::TrainingArguments& t,
                         std::vector<FieldViolation>* out);

}  // namespace offloadd::daemon
