#pragma once
// offloadd-train's command line, parsed with CLI11 (as offloadctl's is):
//
//   offloadd-train [JOB_FILE] [--set KEY=VALUE ...] [flags ...]
//
// JOB_FILE is a job spec as the daemon reads it (job_file_config.h); --set overrides one of its
// fields by its dotted job.proto path. The flags are overrides of the configuration the job file
// gives (or, without one, of the trainer's defaults) and are applied in the order given, after
// the job file. Not thread-safe.

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/train_config.h"

namespace offloadd::trainer {

// What one run of offloadd-train is asked to do.
struct TrainArgs {
  TrainConfig config;
  std::string job_file;                 // empty: the flags alone describe the run
  std::vector<std::string> sets;        // --set KEY=VALUE, in order
  std::string stats_path;               // --stats-jsonl
  std::string dump_path;                // --dump-batches
  std::vector<std::string> eval_paths;  // --eval-data
  int gpus = 0;                         // --gpus: ranks of this program started here
  // Every argument but --gpus and --control-fd: what each rank started by --gpus gets.
  std::vector<std::string> rank_args;
  bool help = false;
};

// A flag's effect on the arguments, applied after the job file in command-line order.
using FlagAction = std::function<Status(TrainArgs&)>;

struct ParsedCommandLine {
  TrainArgs args;                     // job_file, sets, help and rank_args filled; config default
  std::vector<FlagAction> overrides;  // the flags, in order
};

// INVALID_ARGUMENT naming an unknown flag or an argument CLI11 cannot take.
StatusOr<ParsedCommandLine> ParseCommandLine(int argc, char** argv);

// Applies `overrides` to `args` (whose config holds the job file's, or the defaults): a bad value
// is INVALID_ARGUMENT naming the flag ("--lr: bad value '1e-3abc'"). Then the evaluation data
// (--eval-data) is set up like the training data.
Status ApplyOverrides(const std::vector<FlagAction>& overrides, TrainArgs* args);

extern const char kTrainUsage[];

}  // namespace offloadd::trainer
