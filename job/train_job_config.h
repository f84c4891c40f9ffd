#pragma once
// From a job the daemon accepted (its spec validated and resolved by ValidateJobSpec, defaults
// filled) to the trainer's TrainConfig, and the checkpoint the job continues from. Torch-free and
// side-effect free apart from LatestCheckpoint's cleanup of dead writers' temporary directories,
// so tests check the mapping without LibTorch. Thread-safe (no shared state).

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/train_config.h"
#include "jobspec/job_defaults.h"
#include "offloadd/internal/executor.pb.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// What the daemon adds to every job (its binaries, worker pool, defaults and devices) is the
// protocol's TrainerEnvironment message itself (proto/offloadd/internal/executor.proto), built by
// the daemon (DaemonTrainerEnvironment) and by offloadd-train, carried to the executor in StartJob
// and read here: a setting of the daemon that reaches the trainer is one field there.
using TrainerEnvironment = offloadd::internal::TrainerEnvironment;

// An environment with the defaults the proto's comments name (one optimizer worker process, the
// "auto" AdamW kernel, 3 traced steps, progress every 10 s, liveness factor 10): proto3 fields
// default to zero, so every environment starts from this one.
TrainerEnvironment DefaultTrainerEnvironment();

// The defaults the environment gives a job (its storage.aio is in the spec validation resolved).
JobDefaults JobDefaultsOf(const TrainerEnvironment& env);

// The job's TrainConfig, resume_from left empty, from its spec resolved with ResolveJobDefaults
// (jobspec/job_defaults.h) and the environment's defaults: the choice validation made. Each job's
// NVMe states go to a subdirectory named after the job in its nvme_path (or in every configured
// store directory). Settings the pipeline does not implement (unsupported_options.h) are
// UNIMPLEMENTED, naming every field.
StatusOr<trainer::TrainConfig> MakeTrainConfig(const offloadd::v1::Job& job, const TrainerEnvironment& env);

// Where the job continues from: when it ran before (paused, or the daemon stopped or crashed while
// it ran: its transitions show an earlier RUNNING), the newest valid checkpoint in its output_dir;
// else the spec's resume_from_checkpoint (a new job continuing another's run); else "" (a fresh
// start). A first run whose output_dir already holds checkpoints of some other run is
// FAILED_PRECONDITION: mixing two runs' checkpoints would let a later resume pick the wrong one.
// `restarted`: this run goes on after its executor died (ExecutorJobRunner), so it continues from
// its own newest checkpoint as a later run would.
// Checkpoints passed over as corrupt or incomplete are described in `skipped` when given.
StatusOr<std::string> ResumePoint(const offloadd::v1::Job& job, bool restarted = false,
                                  std::vector<std::string>* skipped = nullptr);

// Where a FAILED job continues from when ResumeJob asks it to: the newest intact checkpoint in its
// output_dir, if the job wrote one itself (latest_checkpoint_step > 0: an output_dir holding only
// another run's checkpoints does not count). FAILED_PRECONDITION saying why otherwise.
StatusOr<std::string> CheckpointForFailedJob(const offloadd::v1::Job& job);

// What a job writes to its output_dir at most at once: one new checkpoint (fp32 master weights and
// the two AdamW moments, 12 bytes a parameter; older checkpoints are pruned only after it commits)
// and the exported model (the size of the model directory's weights and the JSON and tokenizer
// files it copies).
struct OutputSpaceNeed {
  uint64_t checkpoint_bytes = 0;
  uint64_t export_bytes = 0;
  uint64_t total() const { return checkpoint_bytes + export_bytes; }
};
OutputSpaceNeed EstimateOutputSpace(int64_t total_params, const std::string& model_dir);

// RESOURCE_EXHAUSTED, with the free and needed bytes, when the file system that holds output_dir
// (or its nearest existing ancestor) has less space available than `need`. OK when it has enough
// or cannot be examined (the writes themselves then report the problem).
Status CheckOutputSpace(const std::string& output_dir, const OutputSpaceNeed& need);

// `name` next to the running executable, else in ../<component>/ beside it (the build tree:
// build/daemon/offloadd, build/workers/offloadd-worker); the first path when neither exists, so
// the error that follows names where it was looked for.
std::string FindSiblingBinary(const std::string& name, const std::string& component);

}  // namespace offloadd::daemon
