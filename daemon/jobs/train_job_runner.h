#pragma once
// TrainJobRunner: the JobRunner that trains a job with the offloaded pipeline (trainer::Trainer).
//
// Per job: builds its TrainConfig (train_job_config.h), continues from the checkpoint ResumePoint
// picks (so a paused job, or one interrupted by a daemon restart or crash, goes on from its last
// checkpoint), and runs Trainer::Train. Progress reaches the job's events every logging_steps, at
// the last step and at every checkpoint; trainer logs become log events; every checkpoint becomes
// a checkpoint_saved event. A pause request ends training with a checkpoint; a cancel request
// ends it without one. Each step also feeds the offloadd_train_* metrics, cleared when the job
// stops running. The per-job NVMe state directories are removed when the job stops running: what
// a later run needs is in its checkpoints.
// Before training, output_dir must have room for one checkpoint and the exported model
// (CheckOutputSpace): the job fails at once, with the numbers, instead of at its first checkpoint.
// After a resume, the steps between the checkpoint and the last step the job had reported are
// trained again without new progress events: the event log shows every step once (the first
// report stands; on the CPU the recomputed step is bit-identical).
//
// Run() is called from the job manager's scheduler thread, one job at a time.

#include <memory>

#include "daemon/config/config.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/jobs/train_job_config.h"
#include "daemon/metrics/train_metrics.h"

namespace offloadd::daemon {

class TrainJobRunner final : public JobRunner {
 public:
  // `metrics` may be null (no offloadd_train_* series); when set it must outlive the runner.
  TrainJobRunner(TrainerEnvironment env, TrainMetrics* metrics) : env_(std::move(env)), metrics_(metrics) {}

  Status Run(const offloadd::v1::Job& job, JobControl& control) override;
  // Removes the job's per-job NVMe state directories.
  void DiscardJobState(const offloadd::v1::Job& job) override;
  // CheckpointForFailedJob (train_job_config.h).
  StatusOr<std::string> CheckpointForResume(const offloadd::v1::Job& job) override;

  const TrainerEnvironment& environment() const { return env_; }

 private:
  TrainerEnvironment env_;
  TrainMetrics* metrics_;
};

// The daemon's TrainerEnvironment: binaries beside the offloadd executable, workers.processes
// (0: one per NUMA node this process may use) and threads_per_process, memory defaults, store
// directories. `has_gpu`: whether the node probe found a GPU (CUDA flavour).
TrainerEnvironment DaemonTrainerEnvironment(const DaemonConfig& config, bool has_gpu);

}  // namespace offloadd::daemon
