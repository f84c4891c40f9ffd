#pragma once
// The offloadd_train_* metrics: what each optimizer step of a running job measured (progress,
// throughput, per-resource busy and stall time, bytes per link, GPU memory), plus the number of
// jobs in each state. Declared in one place (train_metrics.cc) with their help text, on the
// daemon's prometheus::Registry next to DaemonMetrics.
//
// Per-job series carry the label job_id (not "job": Prometheus sets its own job target label at
// scrape time and would rename ours to exported_job). Their number stays bounded: the job runner
// calls EndJob when a job stops running, and the series go job_series_retention_seconds later (so
// a job shorter than a scrape interval still appears), with offloadd_job_info{job_id, gpus} beside
// them from StartJob. offloadd_jobs{state} is fed by the job manager's state counts
// (JobManager::StateCountsSink).
//
// /metrics has no authentication (its port is for a Prometheus on the host or a trusted network),
// so no label carries what a user wrote: no display name, label, model or dataset path, only the
// daemon's job ids and fixed words. `offloadctl get <job_id>` names the job.
//
// Thread-safe: all members may be called from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "job/step_stats.h"

namespace prometheus {
class Registry;
}

namespace offloadd::daemon {

class TrainMetrics {
 public:
  struct Options {
    // Peak dense bf16 FLOP/s of the training GPU. When positive, offloadd_train_mfu_ratio is
    // exported as model FLOP/s over this peak; 0 leaves MFU out (peak unknown).
    double peak_flops = 0;
    // How long a job's series stay after EndJob (0: removed at once).
    double job_series_retention_seconds = 900;
    // Tests: the clock the retention is measured with (default std::chrono::steady_clock).
    std::function<std::chrono::steady_clock::time_point()> clock;
  };

  // Registers the families on `registry`, which must outlive this object.
  explicit TrainMetrics(prometheus::Registry& registry) : TrainMetrics(registry, Options{}) {}
  TrainMetrics(prometheus::Registry& registry, Options options);
  ~TrainMetrics();
  TrainMetrics(const TrainMetrics&) = delete;
  TrainMetrics& operator=(const TrainMetrics&) = delete;

  // One finished optimizer step of `job_id`: counters grow by the step's amounts, gauges take
  // its values, offloadd_train_step_seconds observes step_seconds.
  void Observe(const std::string& job_id, const trainer::StepStats& stats);

  // A held-out evaluation of `job_id`: offloadd_train_eval_loss and offloadd_train_eval_step
  // (series that exist only for jobs that evaluate).
  void ObserveEval(const std::string& job_id, const trainer::EvalStats& stats);
  // An LSP projector check of `job_id`: offloadd_train_lsp_checks_total,
  // offloadd_train_lsp_switched_matrices_total, offloadd_train_lsp_check_seconds_total and
  // offloadd_train_lsp_bias{projectors="in_use"|"learned"}.
  void ObserveProjectorCheck(const std::string& job_id, const trainer::ProjectorCheckStats& stats);

  // The job's worker and store processes after a step: offloadd_worker_*{job_id, worker} (CPU
  // time, busy time, parameters updated, restarts, queue depth), offloadd_job_store_*{job_id,
  // role} (CPU time, requests by result, in flight, latency), offloadd_job_host_arena_bytes and
  // offloadd_job_host_pinned_bytes.
  void ObserveRuntime(const std::string& job_id, const trainer::RuntimeStats& stats);

  // offloadd_watchdog_kills_total{process}: a job's `process` ("executor", "store") was killed for
  // missing its liveness deadline.
  void CountWatchdogKill(const std::string& process);
  // The same for "worker", from the job's cumulative count of workers its executor killed (the
  // series grows by the increase since the last report).
  void ObserveWorkerWatchdogKills(const std::string& job_id, uint64_t total);

  // offloadd_jobs{state}: the count of jobs in each state. A state reported before and absent
  // from `counts` is set to 0, so its series does not go stale.
  void SetJobsByState(const std::map<std::string, int64_t>& counts);

  // A job starts (or resumes) running: offloadd_job_info{job_id, gpus} = 1; a removal pending from
  // an earlier EndJob is cancelled, so its counters continue. `gpus`: the GPUs its executors use,
  // e.g. "0,1" (empty: it trains on the CPU, shown as "cpu").
  void StartJob(const std::string& job_id, const std::string& gpus = "");
  // The job stopped running: its series stay for job_series_retention_seconds, then go.
  void EndJob(const std::string& job_id);
  // Removes what has outlived the retention (every member also does; the daemon calls this on a
  // timer so that series go without other traffic).
  void Sweep();
  // Removes every series of `job_id` now (a no-op for an unknown job).
  void ClearJob(const std::string& job_id);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::daemon
