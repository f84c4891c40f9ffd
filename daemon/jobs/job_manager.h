#pragma once
// JobManager: the job service core. Owns the job lifecycle (states, queue order, cancel / pause /
// resume), persists every change through JobStore, and runs jobs through a JobRunner (the
// training pipeline), each on a thread of its own. gRPC handlers translate to and from these calls.
//
// Scheduling: on a node with GPUs every running job holds the GPUs it needs (resources.gpus, 0
// meaning 1; resources.gpu_index pins a one-GPU job to that GPU), so jobs run side by side while
// GPUs are free: two one-GPU jobs at once on a two-GPU host. The queue is strictly FIFO: a job that
// does not fit the free GPUs waits, and the jobs behind it wait for it (a big job is never starved
// by small ones). A job needing more GPUs than the node has fails when it reaches the head of the
// queue. On a node without GPUs one job runs at a time (whatever its resources.gpus: its executors
// share the CPUs).
//
// States: VALIDATING -> QUEUED -> RUNNING -> SUCCEEDED | FAILED;
//         QUEUED | PAUSED -> CANCELLED at once; RUNNING -> CANCELLING -> CANCELLED;
//         RUNNING -> PAUSING -> PAUSED (the runner checkpoints) ; QUEUED -> PAUSED; PAUSED -> QUEUED;
//         FAILED -> QUEUED (ResumeJob, when the job saved a checkpoint to continue from).
// After a daemon restart, jobs found RUNNING or PAUSING go back to QUEUED / PAUSED (the runner
// resumes from their last checkpoint) and CANCELLING ones end CANCELLED. A job that ends without
// running again has its state outside output_dir removed (JobRunner::DiscardJobState).
// A job's final state is never dropped: when the store cannot record it (a full or failing state
// directory), its thread logs why and retries every few seconds, and the scheduler starts no other
// job, until it is recorded or the daemon stops (the job then runs again from its last checkpoint).
// Meanwhile GetJob and ListJobs show the state the job ended in (kept in memory), and health is
// NOT_SERVING with the reason (HealthProblem()); so it is while the store reports a problem of its
// own (its database file deleted and not yet recreated, a write failing): see SetHealthSink.
// The manager also keeps the number of jobs in each state (counted from the store at start,
// then followed through every transition) and hands it to a StateCountsSink (the daemon's
// offloadd_jobs{state} gauge).
// Thread-safe.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/file_identity.h"
#include "common/status.h"
#include "daemon/jobs/job_store.h"
#include "job/job_validator.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// What a running job can do and see. Implemented by JobManager; handed to JobRunner::Run.
class JobControl {
 public:
  enum class Stop { kNone, kCancel, kPause };
  virtual ~JobControl() = default;
  virtual void ReportProgress(const offloadd::v1::JobProgress& progress) = 0;
  virtual void Log(offloadd::v1::LogLevel level, const std::string& message) = 0;
  virtual void CheckpointSaved(const offloadd::v1::Checkpoint& checkpoint) = 0;
  // One row of the job's metrics history (a step's training values, or an evaluation's loss),
  // merged into the row of its step (JobStore::RecordMetrics). A row the store refuses (its cap,
  // a full disk) is not retried; the job's events say so once per run.
  virtual void RecordMetrics(const offloadd::v1::StepMetrics& row) {}
  // Every row of the job's metrics history recorded so far (for the executor's trainer_state.json).
  virtual StatusOr<std::vector<offloadd::v1::StepMetrics>> RecordedMetrics() {
    return std::vector<offloadd::v1::StepMetrics>{};
  }
  // Polled by the runner between steps.
  virtual Stop stop_requested() const = 0;
  // An fd (eventfd) that turns readable whenever stop_requested() changes, for runners that wait in
  // poll(2); -1 when this control has none (then poll stop_requested()). Owned by the control.
  virtual int stop_fd() const { return -1; }
  // A cancel with `force` (CancelJob force): kill the job's processes now, do not wait for them
  // to stop. Changes wake stop_fd() as stop_requested() does.
  virtual bool force_stop() const { return false; }
  // The GPUs the scheduler gave this run of the job, one per executor (rank r uses gpus()[r]);
  // empty on a node without GPUs.
  virtual std::vector<int> gpus() const { return {}; }
};

// The training pipeline, as the job service sees it.
class JobRunner {
 public:
  virtual ~JobRunner() = default;
  // Trains `job` (its spec is validated and resolved). Returns OK when training finished, a
  // CANCELLED status when it stopped because stop_requested() asked it to (for kPause, after
  // writing a checkpoint to resume from), or the error that failed the job.
  virtual Status Run(const offloadd::v1::Job& job, JobControl& control) = 0;
  // Removes what the job keeps outside its output_dir between runs (per-job NVMe state
  // directories of a run interrupted by a crash). Called, without the manager's lock, for a job
  // that ends without running again: cancelled while queued or paused, or found CANCELLING after
  // a restart. Errors are the runner's to log.
  virtual void DiscardJobState(const offloadd::v1::Job& job) {}
  // The checkpoint a FAILED job continues from when ResumeJob asks for it; FAILED_PRECONDITION
  // saying why when it has none. Called without the manager's lock (it may read checkpoints).
  virtual StatusOr<std::string> CheckpointForResume(const offloadd::v1::Job& job) {
    return FailedPreconditionError("this daemon cannot resume failed jobs");
  }
};

// A job's whole record is bounded: its spec (paths, labels, names) at CreateJob
// (kMaxJobSpecBytes), and the transitions it keeps (older ones stay in its event log). ListJobs
// pages by bytes as well (kListPageBytes), so no listing nears gRPC's 4 MiB message limit.
inline constexpr int kMaxTransitionsKept = 64;

struct JobManagerOptions {
  int gpus = 0;  // GPUs of the node (indices 0..gpus-1); 0: a CPU node, one job at a time
  // Admission (Submit): the roots a job's paths must resolve under, and what the node offers a
  // job now (memory, GPUs, store directories, the daemon's defaults), asked at every Submit.
  // Empty probe: ProbeNodeResources with no store directories and no daemon defaults.
  std::vector<std::string> allowed_roots;
  std::function<NodeBudget()> probe_node;
};

// A client's share of the node's jobs (the server's per-client limit), held from before a job is
// recorded: Reserve, then Commit once the job exists or Release when it was not created.
class SubmitQuota {
 public:
  virtual ~SubmitQuota() = default;
  virtual Status Reserve() = 0;  // RESOURCE_EXHAUSTED naming the limit
  virtual void Commit(const std::string& job_id) = 0;
  virtual void Release() = 0;
};

// One CreateJob, as the wire gave it.
struct SubmitRequest {
  offloadd::v1::JobSpec spec;
  std::string request_id;    // idempotency key, per client
  std::string submitted_by;  // the client (Job.submitted_by)
  bool validate_only = false;
  // Whose rights the job's files are opened with during validation (common/file_identity.h);
  // nullopt: the daemon's own.
  std::optional<FileIdentity> identity;
  std::function<bool()> stop;    // the caller gave up: validation ends early
  SubmitQuota* quota = nullptr;  // may be null (no per-client limit)
};

// What Submit decided. `validation` holds every violation found (none: admitted) and
// `validation.stopped` is CANCELLED when `stop` ended it; `job` is the job created (or the one a
// retry of the same request created before), or, for validate_only, the job as it would be queued:
// its resolved spec, step estimate and model summary.
struct Submission {
  ValidationResult validation;
  offloadd::v1::Job job;
  bool admitted() const { return validation.stopped.ok() && validation.ok(); }
};

class JobManager {
 public:
  // The number of jobs in every state but UNSPECIFIED (zeros included), keyed by the lower-case
  // state name without its prefix ("queued", "running", ...).
  using StateCounts = std::map<std::string, int64_t>;
  // Called once from Start (after the restart recovery) and after every state change, in the
  // order of the changes, with the manager's lock held: it must be quick and must not call back
  // into the manager.
  using StateCountsSink = std::function<void(const StateCounts&)>;

  using Options = JobManagerOptions;

  // Called with why the daemon cannot keep jobs durable ("" when it can again), each time that
  // changes, and once when set; with the manager's lock held (quick; no calls back into it).
  using HealthSink = std::function<void(const std::string& problem)>;

  // `runner` may be null: jobs can then be inspected but not created (the build has no pipeline).
  // `on_counts` may be empty.
  static StatusOr<std::unique_ptr<JobManager>> Start(std::unique_ptr<JobStore> store,
                                                     std::unique_ptr<JobRunner> runner,
                                                     StateCountsSink on_counts = {}, Options options = {});
  ~JobManager();  // stops the scheduler; a running job is asked to pause

  bool can_run_jobs() const { return runner_ != nullptr; }

  // Admission: a retry of a request this client already made (by request_id) is looked up first,
  // so that the checkpoints its job wrote to output_dir are no reason to refuse it; the spec is
  // validated against this node (options' probe_node); an admitted job is created, unless
  // validate_only. Violations are the result's, not an error; errors are the store's, the
  // quota's, or ALREADY_EXISTS for a request_id reused with another spec.
  StatusOr<Submission> Submit(const SubmitRequest& request);
  // Queues a job whose spec has passed ValidateJobSpec.
  // With a request_id: the job `submitted_by` already created with it when its spec is the same
  // (a retry); ALREADY_EXISTS naming that job when the spec differs. Request ids are per client:
  // another client's equal id is another job. `submitted_by` names the client (Job.submitted_by).
  StatusOr<offloadd::v1::Job> Create(const offloadd::v1::JobSpec& resolved_spec,
                                     const std::string& request_id = "", const std::string& submitted_by = "");
  StatusOr<offloadd::v1::Job> Get(const std::string& id);
  StatusOr<JobStore::Page> List(const std::vector<offloadd::v1::JobState>& states, int page_size,
                                const std::string& page_token);
  // `force`: the running job's processes are killed at once (JobControl::force_stop), also when it
  // is CANCELLING already.
  StatusOr<offloadd::v1::Job> Cancel(const std::string& id, const std::string& reason, bool force = false);
  StatusOr<offloadd::v1::Job> Pause(const std::string& id);
  // PAUSED -> QUEUED; FAILED -> QUEUED when JobRunner::CheckpointForResume names a checkpoint.
  StatusOr<offloadd::v1::Job> Resume(const std::string& id);
  // Removes an ended job's record and events (what it wrote to its output_dir stays: removing
  // that is the client's, as the user). FAILED_PRECONDITION for a job that has not ended.
  // Returns the job as it was.
  StatusOr<offloadd::v1::Job> Delete(const std::string& id);

  // The job's metrics history (job_manager_history.cc): rows with step > *after_step (all when
  // nullopt), at most `limit` (0: 1000; at most 10000). NOT_FOUND for an unknown job,
  // INVALID_ARGUMENT for a negative limit.
  StatusOr<JobStore::MetricsPage> Metrics(const std::string& id, std::optional<int64_t> after_step,
                                          int limit);
  struct EventsPage {
    std::vector<offloadd::v1::JobEvent> events;
    bool has_more = false;   // events follow next_after
    int64_t next_after = 0;  // the cursor of the last event examined
  };
  // The job's events with cursor > after, at most `limit` (0: 100; at most 1000) and about
  // kListPageBytes of them (at least one), leaving out progress or log events when asked.
  // NOT_FOUND for an unknown job, INVALID_ARGUMENT for a negative `after` or `limit`.
  StatusOr<EventsPage> Events(const std::string& id, int64_t after, int limit, bool progress = true,
                              bool logs = true);

  // Checkpoints the job announced that still exist on disk (older ones are pruned by
  // save_total_limit), oldest first.
  StatusOr<std::vector<offloadd::v1::Checkpoint>> Checkpoints(const std::string& id);

  // Delivers the job's events after `after_cursor` to `sink`, then new ones as they happen, until
  // the job is in a final state and all its events are delivered (OK), `sink` returns false or
  // `cancelled()` turns true (CANCELLED). `cancelled` is polled at least every `poll_ms`.
  Status Watch(const std::string& id, int64_t after_cursor,
               const std::function<bool(const offloadd::v1::JobEvent&)>& sink,
               const std::function<bool()>& cancelled, int poll_ms = 500);

  // Watching without a thread (a gRPC callback stream): Subscribe registers
  // `wake`, called after each event appended to job `id` and once when the manager shuts down,
  // with the manager's lock held: it must only note the news and hand the reading to another
  // thread, never call into the manager. Unsubscribe (before `wake` becomes invalid) removes it.
  uint64_t Subscribe(const std::string& id, std::function<void()> wake);
  void Unsubscribe(const std::string& id, uint64_t handle);
  // One read of such a watch: up to `limit` events after `after_cursor`, as Watch delivers them;
  // `*complete` is set when the job is in a final state and no event follows those returned.
  // UNAVAILABLE once the manager is shutting down.
  StatusOr<std::vector<offloadd::v1::JobEvent>> ReadWatch(const std::string& id,
                                                          int64_t after_cursor, int limit,
                                                          bool* complete);
  // Why jobs are not durable now (the store's problem, or job ends it could not record), empty
  // when they are. Health is NOT_SERVING while it is not empty.
  std::string HealthProblem();
  // Replaces the health sink (empty: none); calls the new one with the current problem.
  void SetHealthSink(HealthSink sink);

  // GPU index -> the id of the job running on it (GPUs without a job are absent).
  std::map<int, std::string> GpuAssignments();

  // This host's part of a job another daemon coordinates across hosts (daemon/cluster/): holds
  // `gpus` free GPUs (on a node without GPUs, the node: no job of its own runs meanwhile) as a
  // running job holds its own, under `name`; nullopt when they are not free now or the manager is
  // shutting down (the coordinator then starts none of the job's hosts). The queue does not
  // wait for it: a part is admitted only now or never. ReleaseHostPart ends the hold.
  std::optional<std::vector<int>> ReserveHostPart(const std::string& name, int gpus);
  void ReleaseHostPart(const std::string& name);

  // Stops taking new jobs, asks running ones to pause, waits for the scheduler and their threads.
  void Shutdown();

 private:
  class Control;
  struct Running;
  JobManager(std::unique_ptr<JobStore> store, std::unique_ptr<JobRunner> runner, StateCountsSink on_counts,
             Options options);

  Status Recover();
  // The job `submitted_by` created with `request_id`, if any (NOT_FOUND otherwise). Caller
  // holds mu_.
  StatusOr<offloadd::v1::Job> JobForRequestLocked(const std::string& submitted_by,
                                                  const std::string& request_id);
  void SchedulerLoop();
  // Starts queued jobs, in order, while the head of the queue fits. Caller holds `lock` on mu_.
  void StartQueuedLocked(std::unique_lock<std::mutex>& lock);
  // The GPUs `job` would get now; nullopt when they are not free. Caller holds mu_.
  std::optional<std::vector<int>> PickGpusLocked(const offloadd::v1::Job& job) const;
  // A job's thread: runs it, records how it ended.
  void RunJob(offloadd::v1::Job job, Running* running);
  // Sets the stop request of running job `id` and wakes its runner. Caller holds mu_.
  // `force` (a cancel's): JobControl::force_stop() turns true and stays so.
  void RequestStopLocked(const std::string& id, JobControl::Stop stop, bool requeue = false, bool force = false);
  // Sets the state, records the transition and appends its event. Caller holds mu_.
  Status TransitionLocked(offloadd::v1::Job* job, offloadd::v1::JobState state, const std::string& reason);
  Status AppendLocked(offloadd::v1::JobEvent event);
  // Writes the job's record and appends its event in one store transaction.
  Status CommitLocked(const offloadd::v1::Job& job, offloadd::v1::JobEvent event);
  void NotifyLocked(const std::string& job_id, int64_t cursor);
  // How a run ended, as the job's final (or PAUSED) state.
  struct RunEnd {
    offloadd::v1::JobState state;
    std::string reason;
    Status error;  // the runner's error for FAILED
  };
  // Records `end` for job `id`: OK once the store holds the state and its event. Caller holds mu_.
  Status RecordEndLocked(const std::string& id, const RunEnd& end);
  // Moves one job from `from` (UNSPECIFIED: a new job) to `to` in counts_ and reports the
  // counts. Caller holds mu_.
  void CountLocked(offloadd::v1::JobState from, offloadd::v1::JobState to);
  void PublishCountsLocked();
  // The health problem now; tells the sink when it changed. Caller holds mu_.
  std::string HealthProblemLocked();
  void RefreshHealthLocked();
  // `job` as the store holds it, or as it ended when the store could not record that yet.
  void OverlayUnrecordedLocked(offloadd::v1::Job* job) const;

  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobRunner> runner_;
  const StateCountsSink on_counts_;
  // Watchers of one job wait on its slot, which only that job's events signal: an idle watcher
  // costs no database reads, and an event wakes its own job's watchers, not every watcher.
  struct WatchSlot {
    std::condition_variable appended;
    int64_t last_cursor = 0;  // highest cursor appended to the job while the slot existed
    int watchers = 0;
    std::map<uint64_t, std::function<void()>> wakers;  // Subscribe's, by handle
  };
  uint64_t next_waker_ = 1;

  std::mutex mu_;
  std::condition_variable changed_;  // any job or event change
  std::unordered_map<std::string, std::shared_ptr<WatchSlot>> watch_slots_;  // by job id
  std::map<offloadd::v1::JobState, int64_t> counts_;  // jobs by state, as in store_
  const Options options_;
  const PathPolicy paths_;                                   // options_.allowed_roots
  std::map<std::string, std::unique_ptr<Running>> running_;  // by job id; erased once joined
  std::map<std::string, std::vector<int>> host_parts_;       // ReserveHostPart's holds, by name
  int unrecorded_ends_ = 0;  // running jobs whose end the store refused so far: start nothing new
  // Those jobs as they ended (what GetJob shows until the store holds it), and why not recorded.
  std::map<std::string, std::pair<offloadd::v1::Job, std::string>> unrecorded_;
  HealthSink health_sink_;
  std::string health_problem_;  // as last told to the sink and logged
  bool shutting_down_ = false;
  std::thread scheduler_;
};

bool IsFinalState(offloadd::v1::JobState state);

}  // namespace offloadd::daemon
