#pragma once
// ExecutorJobRunner: the JobRunner that trains each job in executor processes (offloadd-executor),
// so that LibTorch and CUDA never load into the daemon and a job that crashes its
// process cannot take the daemon down with it.
//
// Per run of a job: one executor per GPU the job uses (resources.gpus; rank r on the r-th GPU the
// scheduler assigned, JobControl::gpus()), each started with ipc::LaunchChild and sent, after the
// versioned hellos, the job with the daemon's TrainerEnvironment and its placement in the job's
// data-parallel group (world_size > 1: file rendezvous in <state_dir>/jobs/<id>/rendezvous-<n>,
// fresh per attempt and removed after it). The runner relays rank 0's progress, logs, checkpoints
// and stats to the job's events and the offloadd_train_* metrics (other ranks send warnings and
// errors only), forwards pause / cancel requests, and supervises the executors by polling their
// pidfds and sockets (and the JobControl's stop fd).
//
// Endings: every executor sends its final status and exits 0 -> the job's result (an ordinary
// training error fails the job, without retries). An executor that dies otherwise (a signal, a
// non-zero exit, a lost socket, a garbled message), or whose final error is a lost device or a
// lost NVMe store process (IsRestartableFailure) -> the others of the job are cancelled, and
// SIGKILLed after kill_grace_seconds; the job starts again from its newest checkpoint up to
// max_restarts times, each restart a warning event naming the cause (ipc::DescribeExit); then it
// fails with that cause. Every executor start is an event "executor started: pid N rank r gpu g".
//
// Liveness: every executor sends heartbeats (executor/heartbeat.h). One not heard
// from for max(6 heartbeats, 1 s) (60 s before its first: the process is still loading), or whose
// phase (a step) overruns floor + max(floor, factor x its expected time) (one floor more than the
// workers' and the store's own deadlines inside the step, so that theirs act first), is
// logged, counted (offloadd_watchdog_kills_total{process="executor"}), SIGKILLed, and handled as
// a death: restart, then failure naming the executor and its phase.
//
// Cancel: the executors are asked to stop; those still running cancel_grace_seconds later are
// SIGKILLed (JobControl::force_stop(): at once). The job ends CANCELLED either way.
//
// Thread-safe: Run may be called for several jobs at once (one scheduler thread per running job).
// The executors' death signal (PR_SET_PDEATHSIG) follows the thread that launched them, so Run
// launches and reaps them on its own thread, which outlives them.

#include <cstdint>
#include <map>
#include <string>

#include "daemon/config/config.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/metrics/train_metrics.h"
#include "job/train_job_config.h"

namespace offloadd::daemon {

struct ExecutorRunnerOptions {
  std::string executor_binary;   // offloadd-executor
  TrainerEnvironment environment;
  std::string state_dir;         // rendezvous files under <state_dir>/jobs/<job id>/
  uint32_t max_restarts = 2;     // jobs.max_executor_restarts
  double kill_grace_seconds = 5;  // the others of a failed executor: cancel, then SIGKILL
  double cancel_grace_seconds = 30;  // jobs.cancel_grace_seconds: a cancelled job's executors
  double group_timeout_seconds = 300;  // jobs.group_timeout_seconds: Placement.timeout_seconds
  // jobs.liveness: the phase deadline's floor and factor (0 floor: no phase deadline) and the
  // heartbeat interval (0: no heartbeats watched). The environment carries them to the executor.
  double liveness_floor_seconds = 0;
  double liveness_factor = 10;
  double heartbeat_seconds = 0;
  std::string log_level = "info";  // the executors' --log-level
  // TCP token client name -> the user= of its token file line: whose rights its jobs' files are
  // opened with (SubmitterFileIdentity).
  std::map<std::string, std::string> token_users;
};

// One host's part of a job across hosts (resources.hosts > 1; daemon/cluster/): this daemon runs
// host `index` of `hosts`, resources.gpus_per_host executors (JobRanksPerHost) on the GPUs
// JobControl::gpus() gives, ranks index x N .. index x N + N-1 of hosts x N, sharing this host's
// arena; they meet the others at `rendezvous` ("tcp://host:port"; rank 0, the coordinator's,
// serves the c10d store there).
struct HostRank {
  int index = 0;
  int hosts = 1;
  std::string rendezvous;
};

class ExecutorJobRunner final : public JobRunner {
 public:
  // `metrics` may be null (no offloadd_train_* series); when set it must outlive the runner.
  ExecutorJobRunner(ExecutorRunnerOptions options, TrainMetrics* metrics)
      : options_(std::move(options)), metrics_(metrics) {}

  Status Run(const offloadd::v1::Job& job, JobControl& control) override;
  // Runs this host's rank of a job across hosts, as Run does one host's job, but never restarts
  // it: its group spans other daemons' executors, which a restart here would not rejoin (the
  // coordinator fails the job on every host instead). Only rank 0 reports the job's progress,
  // checkpoints and metrics; the others' warnings and errors reach `control`'s log.
  Status RunHostRank(const offloadd::v1::Job& job, JobControl& control, const HostRank& rank);
  // Removes the job's per-job NVMe state directories.
  void DiscardJobState(const offloadd::v1::Job& job) override;
  // CheckpointForFailedJob (train_job_config.h).
  StatusOr<std::string> CheckpointForResume(const offloadd::v1::Job& job) override;

  const ExecutorRunnerOptions& options() const { return options_; }

 private:
  const ExecutorRunnerOptions options_;
  TrainMetrics* const metrics_;
};

// The executors a job runs: resources.gpus, 0 meaning 1.
int JobWorldSize(const offloadd::v1::Job& job);
// The executors a job runs on each of its hosts: resources.gpus_per_host across hosts
// (resources.hosts > 1), JobWorldSize on one; 0 meaning 1.
int JobRanksPerHost(const offloadd::v1::Job& job);

// Whether an executor's final error is its device's, not the job's: a CUDA error (the context is
// lost with the process), the GPU out of memory, a cuBLAS/cuDNN failure, or the NCCL data-parallel
// group failing (a peer lost). Such a job restarts from its last checkpoint like one
// whose executor died, up to jobs.max_executor_restarts; any other error fails it at once.
bool IsDeviceFailure(const Status& s);

// IsDeviceFailure, or the job's NVMe store process died or was killed by its liveness watchdog
// (storage::kStoreDiedSign): a store death restarts the job as an executor death does.
bool IsRestartableFailure(const Status& s);

// The daemon's TrainerEnvironment: binaries beside the offloadd executable, workers.processes
// (0: one per NUMA node this process may use) and threads_per_process, memory defaults, store
// directories. `has_gpu`: whether the GPU probe found a GPU (CUDA flavour executor).
TrainerEnvironment DaemonTrainerEnvironment(const DaemonConfig& config, bool has_gpu);

}  // namespace offloadd::daemon
