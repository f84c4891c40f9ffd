#pragma once
// The longest sequence a model's positions cover, for job validation (job_validator.cc): the limit
// a job's dataset.max_seq_length is checked against, and the refusal naming both numbers.
// Torch-free; thread-safe (pure functions).
#include <cstdint>

#include "common/status.h"
#include "engine/model_config.h"

namespace offloadd::daemon {

// The limit itself (0: none known): what a job that leaves dataset.max_seq_length unset trains
// at when the default (1024) is longer.
int64_t PositionsLimit(const engine::ModelConfig& config);
// OK when max_seq_length fits PositionsLimit; else INVALID_ARGUMENT naming the config's numbers.
Status PositionsProblem(const engine::ModelConfig& config, int64_t max_seq_length);

}  // namespace offloadd::daemon
