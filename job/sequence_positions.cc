#include "job/sequence_positions.h"

#include <cstdio>
#include <string>

namespace offloadd::daemon {
namespace {

// 2 rather than 2.000000; 1e+06 for a million.
std::string FormatNumber(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

}  // namespace

// The longest sequence the model's positions cover, as its family encodes them: RoPE models
// rotate any position, but train and are evaluated up to max_position_embeddings, which "linear"
// scaling stretches by its factor and "yarn", "llama3" and "longrope" extend to
// original_max_position_embeddings x factor (transformers writes the extended length into
// max_position_embeddings for the latter; the larger of the two counts). GPT-2's learned positions
// and "dynamic" RoPE are engine::SequenceLengthProblem's. A 512-position model asked for 8192
// tokens per sequence used to pass validation and make no step in 20 minutes.
// The limit itself (0: none known): what a job that leaves dataset.max_seq_length unset trains
// at when the default (1024) is longer.
int64_t PositionsLimit(const engine::ModelConfig& config) {
  const int64_t positions = config.max_position_embeddings;
  if (positions <= 0) return 0;
  const engine::RopeConfig& rope = config.rope;
  if (config.arch == engine::Architecture::kGpt2) return positions;
  if (rope.type == "dynamic") return std::min(positions, rope.original_max_position_embeddings);
  if (rope.type == "linear" && rope.factor > 1) return static_cast<int64_t>(positions * rope.factor);
  if ((rope.type == "yarn" || rope.type == "llama3" || rope.type == "longrope") && rope.factor > 1) {
    return std::max<int64_t>(positions, static_cast<int64_t>(rope.original_max_position_embeddings * rope.factor));
  }
  return positions;
}

Status PositionsProblem(const engine::ModelConfig& config, int64_t max_seq_length) {
  const int64_t positions = config.max_position_embeddings;
  if (positions <= 0 || max_seq_length <= positions) return OkStatus();
  const engine::RopeConfig& rope = config.rope;
  double limit = static_cast<double>(positions);
  std::string how = "max_position_embeddings is " + std::to_string(positions);
  if (rope.type == "linear" && rope.factor > 1) {
    limit = positions * rope.factor;
    how += ", x " + FormatNumber(rope.factor) + " by its linear RoPE scaling = " + FormatNumber(limit);
  } else if ((rope.type == "yarn" || rope.type == "llama3" || rope.type == "longrope") && rope.factor > 1) {
    const double extended = static_cast<double>(rope.original_max_position_embeddings) * rope.factor;
    if (extended > limit) {
      limit = extended;
      how += "; its " + rope.type + " RoPE scaling extends original_max_position_embeddings " +
             std::to_string(rope.original_max_position_embeddings) + " x " + FormatNumber(rope.factor) +
             " = " + FormatNumber(limit);
    }
  }
  if (static_cast<double>(max_seq_length) <= limit) return OkStatus();
  return InvalidArgumentError(std::to_string(max_seq_length) +
                              " tokens per sequence is longer than the model's positions: its config.json " +
                              how + " (set dataset.max_seq_length to at most " +
                              std::to_string(static_cast<int64_t>(limit)) +
                              ", or use a model whose RoPE scaling covers " + std::to_string(max_seq_length) + ")");
}

}  // namespace offloadd::daemon
