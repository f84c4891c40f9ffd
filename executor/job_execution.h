#pragma once
// What one executor does with its job: the run TrainJobRunner once did inside the daemon, now
// in a process of its own. Builds the job's TrainConfig (job/train_job_config.h)
// with this rank's placement, picks the checkpoint to continue from (ResumePoint; after an
// executor restart, the newest one in output_dir), checks output_dir's free space, runs
// trainer::Trainer and, on a pause request, writes a checkpoint.
//
// Events go to the daemon through `channel`: rank 0 sends progress (every logging_steps, the last
// step, every checkpoint and at least every progress_interval_seconds), log lines, checkpoints and
// the step / eval / projector-check / runtime stats behind the metrics; other ranks send only
// their warnings and errors (rank 0 speaks for the job). After a restart, steps up to the last
// one the job reported are trained again without new progress events.
#include "common/status.h"
#include "executor/executor_channel.h"
#include "offloadd/internal/executor.pb.h"

namespace offloadd::executor {

// Trains the job of `start` until it ends: OK, CANCELLED after a stop request (for a pause, after
// writing a checkpoint), or the error that failed it. Never throws.
Status ExecuteJob(const offloadd::internal::StartJob& start, ExecutorChannel& channel);

}  // namespace offloadd::executor
