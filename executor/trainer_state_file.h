#pragma once
// trainer_state.json in a finished job's output_dir (beside the exported model): Hugging Face's
// TrainerState with the job's whole log_history, one entry per recorded step ({epoch, grad_norm,
// learning_rate, loss, step}) and one per evaluation ({epoch, eval_loss, step}) after its step's,
// from the job's metrics history (the daemon's rows of earlier runs, StartJob.history, plus this
// run's steps). Checkpoints keep their own trainer_state.json, up to their step.
// Torch-free; thread-compatible.

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::executor {

// A job's metrics rows by step, merged as the daemon's job store merges them
// (daemon::MergeStepMetrics: a value a step has keeps its first report).
class LogHistory {
 public:
  void Add(const offloadd::v1::StepMetrics& row);
  const std::map<int64_t, offloadd::v1::StepMetrics>& rows() const { return rows_; }

 private:
  std::map<int64_t, offloadd::v1::StepMetrics> rows_;
};

// The rest of the TrainerState, as the job ran.
struct TrainerStateFacts {
  int64_t global_step = 0;
  int64_t max_steps = 0;
  double epoch = 0;
  int64_t num_input_tokens_seen = 0;
  int64_t logging_steps = 0, eval_steps = 0, save_steps = 0;
  int64_t train_batch_size = 0;  // per_device_train_batch_size
};

// The trainer_state.json text (indented JSON; non-finite numbers as null).
std::string TrainerStateJson(const LogHistory& history, const TrainerStateFacts& facts);
// Writes it to `dir`/trainer_state.json atomically (common/safe_path.h), replacing one there.
Status WriteTrainerState(const std::string& dir, const LogHistory& history,
                         const TrainerStateFacts& facts);

}  // namespace offloadd::executor
