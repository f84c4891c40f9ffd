#include "daemon/jobs/job_manager.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <random>
#include <utility>

#include <google/protobuf/util/time_util.h>

#include "common/logging.h"
#include "common/message_text.h"
#include "ipc/event_fd.h"
#include "ipc/unique_fd.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
constexpr const char* kLog = "jobs";
// How often the scheduler tries again to record a state the store refused (a full state directory).
constexpr std::chrono::seconds kRecordRetry{2};

google::protobuf::Timestamp Now() { return google::protobuf::util::TimeUtil::GetCurrentTime(); }

std::string NewJobId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  char buf[40];
  std::snprintf(buf, sizeof buf, "job-%010lld-%06llx", static_cast<long long>(secs),
                static_cast<unsigned long long>(rng() & 0xffffff));
  return buf;
}

std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return n.rfind("JOB_STATE_", 0) == 0 ? n.substr(10) : n;
}

// Prometheus label values are lower case by convention.
std::string StateLabel(v1::JobState s) {
  std::string n = StateName(s);
  for (char& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return n;
}

// Across hosts, the coordinator's own part: resources.gpus_per_host (JobRanksPerHost).
int GpusNeeded(const v1::Job& job) {
  const auto& res = job.spec().resources();
  return std::max<int>(1, static_cast<int>(res.hosts() > 1 ? res.gpus_per_host() : res.gpus()));
}

std::string DescribeGpus(const std::vector<int>& gpus) {
  if (gpus.empty()) return "the CPU";
  std::string out = gpus.size() == 1 ? "GPU " : "GPUs ";
  for (size_t i = 0; i < gpus.size(); ++i) out += (i ? "," : "") + std::to_string(gpus[i]);
  return out;
}

// A cancelled job's error: CANCELLED with the reason the user gave (Job.error, the SDK's
// JobResult.error).
void SetCancelError(v1::Job* job, const std::string& reason) {
  job->mutable_error()->set_code(static_cast<int>(StatusCode::kCancelled));
  job->mutable_error()->set_message(SafeMessageText(reason, 8192));
}

}  // namespace

// A job running now: what its control reads, and its thread.
struct JobManager::Running {
  JobControl::Stop stop = JobControl::Stop::kNone;
  bool requeue_on_stop = false;  // stopped by Shutdown(): QUEUED again, not PAUSED
  bool force = false;            // CancelJob force: kill its processes now
  std::string cancel_reason;     // the first CancelJob's reason: the CANCELLED state's and error's
  std::vector<int> gpus;
  ipc::UniqueFd stop_fd;  // eventfd, signalled on every change of `stop`
  std::thread thread;
  bool done = false;  // its end is recorded (or given up on at shutdown): join the thread
};

bool IsFinalState(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// The JobControl handed to the runner for one running job.
class JobManager::Control final : public JobControl {
 public:
  Control(JobManager* m, std::string id, const Running* running) : m_(m), id_(std::move(id)), running_(running) {}

  void ReportProgress(const v1::JobProgress& progress) override {
    std::lock_guard<std::mutex> lock(m_->mu_);
    v1::JobEvent e;
    *e.mutable_progress() = progress;
    e.set_job_id(id_);
    *e.mutable_time() = Now();
    // The job's progress and its event in one transaction (a resumed run takes the steps it has
    // reported from the job's progress, so that must never be a step ahead of the log); only the
    // small progress row is written, not the record with the spec.
    auto cursor = m_->store_->SetProgressAndAppend(id_, progress, &e);
    if (cursor.ok()) m_->NotifyLocked(id_, *cursor);
    m_->RefreshHealthLocked();
    Warn(cursor.status());
  }
  void Log(v1::LogLevel level, const std::string& message) override {
    std::lock_guard<std::mutex> lock(m_->mu_);
    v1::JobEvent e;
    e.mutable_log()->set_level(level);
    e.mutable_log()->set_message(SafeMessageText(message, 8192));
    Warn(Append(std::move(e)));
  }
  void CheckpointSaved(const v1::Checkpoint& checkpoint) override {
    std::lock_guard<std::mutex> lock(m_->mu_);
    auto job = m_->store_->Get(id_);
    if (!job.ok()) {
      Warn(job.status());
      return;
    }
    job->set_latest_checkpoint_step(checkpoint.step());
    v1::JobEvent e;
    e.set_job_id(id_);
    *e.mutable_checkpoint_saved() = checkpoint;
    Warn(m_->CommitLocked(*job, std::move(e)));
  }
  void RecordMetrics(const v1::StepMetrics& row) override {
    std::lock_guard<std::mutex> lock(m_->mu_);
    const Status st = m_->store_->RecordMetrics(id_, row);
    m_->RefreshHealthLocked();
    if (st.ok()) return;
    Warn(st);
    // Once per run in the job's events: from which step on its history is incomplete, and why.
    if (std::exchange(metrics_refused_, true)) return;
    v1::JobEvent e;
    e.mutable_log()->set_level(v1::LOG_LEVEL_WARNING);
    e.mutable_log()->set_message(SafeMessageText("metrics history: " + st.message(), 8192));
    Warn(Append(std::move(e)));
  }
  StatusOr<std::vector<v1::StepMetrics>> RecordedMetrics() override {
    std::vector<v1::StepMetrics> rows;
    std::optional<int64_t> after;
    while (true) {  // the store reads under its own lock; a page at a time
      ASSIGN_OR_RETURN(JobStore::MetricsPage page, m_->store_->Metrics(id_, after, 10000));
      for (auto& r : page.rows) rows.push_back(std::move(r));
      if (!page.has_more || rows.empty()) return rows;
      after = rows.back().step();
    }
  }
  Stop stop_requested() const override {
    std::lock_guard<std::mutex> lock(m_->mu_);
    return running_->stop;
  }
  int stop_fd() const override { return running_->stop_fd.get(); }
  bool force_stop() const override {
    std::lock_guard<std::mutex> lock(m_->mu_);
    return running_->force;
  }
  std::vector<int> gpus() const override { return running_->gpus; }  // fixed while the job runs

 private:
  Status Append(v1::JobEvent e) {
    e.set_job_id(id_);
    return m_->AppendLocked(std::move(e));
  }
  static void Warn(const Status& s) {
    if (!s.ok()) OFFLOADD_LOG(kWarning, kLog) << s.ToString();
  }
  JobManager* m_;
  std::string id_;
  const Running* running_;
  bool metrics_refused_ = false;  // guarded by m_->mu_
};

JobManager::JobManager(std::unique_ptr<JobStore> store, std::unique_ptr<JobRunner> runner,
                       StateCountsSink on_counts, Options options)
    : store_(std::move(store)),
      runner_(std::move(runner)),
      on_counts_(std::move(on_counts)),
      options_(options),
      paths_(options_.allowed_roots) {}

StatusOr<std::unique_ptr<JobManager>> JobManager::Start(std::unique_ptr<JobStore> store,
                                                        std::unique_ptr<JobRunner> runner,
                                                        StateCountsSink on_counts, Options options) {
  std::unique_ptr<JobManager> m(
      new JobManager(std::move(store), std::move(runner), std::move(on_counts), options));
  RETURN_IF_ERROR(m->Recover());
  if (m->runner_) m->scheduler_ = std::thread([p = m.get()] { p->SchedulerLoop(); });
  return m;
}

JobManager::~JobManager() { Shutdown(); }

void JobManager::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    // Running jobs checkpoint and stop; unless a user had asked for a pause, they are queued
    // again, so they continue when the daemon restarts (README: jobs continue after a restart).
    for (auto& [id, r] : running_) {
      if (r->stop == JobControl::Stop::kNone) RequestStopLocked(id, JobControl::Stop::kPause, /*requeue=*/true);
    }
    for (auto& [id, slot] : watch_slots_) {
      slot->appended.notify_all();
      for (auto& [handle, wake] : slot->wakers) wake();
    }
  }
  changed_.notify_all();
  if (scheduler_.joinable()) scheduler_.join();
}

Status JobManager::Recover() {
  std::unique_lock<std::mutex> lock(mu_);
  // Counted before the recovery below, whose transitions then move the counts.
  ASSIGN_OR_RETURN(counts_, store_->CountByState());
  ASSIGN_OR_RETURN(auto interrupted, store_->InStates({v1::JOB_STATE_VALIDATING, v1::JOB_STATE_RUNNING,
                                                       v1::JOB_STATE_PAUSING, v1::JOB_STATE_CANCELLING}));
  std::vector<v1::Job> cancelled;
  for (auto& job : interrupted) {
    const v1::JobState to = job.state() == v1::JOB_STATE_PAUSING      ? v1::JOB_STATE_PAUSED
                            : job.state() == v1::JOB_STATE_CANCELLING ? v1::JOB_STATE_CANCELLED
                            : job.state() == v1::JOB_STATE_VALIDATING ? v1::JOB_STATE_FAILED
                                                                      : v1::JOB_STATE_QUEUED;
    if (to == v1::JOB_STATE_FAILED) {
      job.mutable_error()->set_code(static_cast<int>(StatusCode::kAborted));
      job.mutable_error()->set_message("the daemon stopped while the job was being validated; submit it again");
    }
    // A cancel's own reason, from the CANCELLING transition, stays the job's.
    const std::string asked = job.transitions().empty() ? "" : job.transitions().rbegin()->reason();
    if (to == v1::JOB_STATE_CANCELLED) SetCancelError(&job, asked.empty() ? "cancelled" : asked);
    const std::string why = to == v1::JOB_STATE_CANCELLED ? job.error().message() : "daemon restarted";
    RETURN_IF_ERROR(TransitionLocked(&job, to, why));
    OFFLOADD_LOG(kInfo, kLog) << "job " << job.id() << ": " << StateName(to) << " after restart";
    if (to == v1::JOB_STATE_CANCELLED) cancelled.push_back(std::move(job));
  }
  PublishCountsLocked();
  lock.unlock();
  // A job cancelled while it ran, then interrupted: its run never reached the runner's cleanup.
  if (runner_) {
    for (const auto& job : cancelled) runner_->DiscardJobState(job);
  }
  return OkStatus();
}

void JobManager::CountLocked(v1::JobState from, v1::JobState to) {
  if (from != v1::JOB_STATE_UNSPECIFIED) --counts_[from];
  ++counts_[to];
  PublishCountsLocked();
}

void JobManager::PublishCountsLocked() {
  if (!on_counts_) return;
  StateCounts out;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (!v1::JobState_IsValid(s) || s == v1::JOB_STATE_UNSPECIFIED) continue;
    const auto state = static_cast<v1::JobState>(s);
    auto it = counts_.find(state);
    out[StateLabel(state)] = it == counts_.end() ? 0 : it->second;
  }
  on_counts_(out);
}

Status JobManager::AppendLocked(v1::JobEvent event) {
  *event.mutable_time() = Now();
  StatusOr<int64_t> cursor = store_->AppendEvent(&event);
  RefreshHealthLocked();
  RETURN_IF_ERROR(cursor.status());
  NotifyLocked(event.job_id(), *cursor);
  return OkStatus();
}

Status JobManager::CommitLocked(const v1::Job& job, v1::JobEvent event) {
  *event.mutable_time() = Now();
  StatusOr<int64_t> cursor = store_->UpdateAndAppend(job, &event);
  RefreshHealthLocked();
  RETURN_IF_ERROR(cursor.status());
  NotifyLocked(event.job_id(), *cursor);
  return OkStatus();
}

std::string JobManager::HealthProblem() {
  std::lock_guard<std::mutex> lock(mu_);
  return HealthProblemLocked();
}

std::string JobManager::HealthProblemLocked() {
  std::string problem = store_->problem();
  if (!unrecorded_.empty()) {
    const auto& [id, end] = *unrecorded_.begin();
    problem = "job " + id + " ended " + StateName(end.first.state()) + " but the state directory cannot record it (" +
              end.second + ")" + (unrecorded_.size() > 1 ? " (and " + std::to_string(unrecorded_.size() - 1) + " more)" : "") +
              "; no job starts until it is recorded";
  }
  return problem;
}

void JobManager::SetHealthSink(HealthSink sink) {
  std::lock_guard<std::mutex> lock(mu_);
  health_sink_ = std::move(sink);
  if (health_sink_) health_sink_(health_problem_);
}

void JobManager::RefreshHealthLocked() {
  std::string problem = HealthProblemLocked();
  if (problem == health_problem_) return;
  if (problem.empty()) {
    OFFLOADD_LOG(kWarning, kLog) << "health SERVING again: jobs are durable (was: " << health_problem_ << ")";
  } else {
    OFFLOADD_LOG(kError, kLog) << "health NOT_SERVING: " << problem;
  }
  health_problem_ = std::move(problem);
  if (health_sink_) health_sink_(health_problem_);
}

void JobManager::OverlayUnrecordedLocked(v1::Job* job) const {
  if (auto it = unrecorded_.find(job->id()); it != unrecorded_.end()) {
    v1::Job ended = it->second.first;
    *ended.mutable_progress() = job->progress();  // progress reports may have landed meanwhile
    *job = std::move(ended);
  }
}

void JobManager::NotifyLocked(const std::string& job_id, int64_t cursor) {
  if (auto it = watch_slots_.find(job_id); it != watch_slots_.end()) {
    it->second->last_cursor = cursor;
    it->second->appended.notify_all();
    for (auto& [handle, wake] : it->second->wakers) wake();
  }
  changed_.notify_all();
}

uint64_t JobManager::Subscribe(const std::string& id, std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& s = watch_slots_[id];
  if (!s) s = std::make_shared<WatchSlot>();
  ++s->watchers;
  const uint64_t handle = next_waker_++;
  s->wakers.emplace(handle, std::move(wake));
  return handle;
}

void JobManager::Unsubscribe(const std::string& id, uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = watch_slots_.find(id);
  if (it == watch_slots_.end() || it->second->wakers.erase(handle) == 0) return;
  if (--it->second->watchers == 0) watch_slots_.erase(it);
}

StatusOr<std::vector<v1::JobEvent>> JobManager::ReadWatch(const std::string& id,
                                                          int64_t after_cursor, int limit,
                                                          bool* complete) {
  *complete = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) {
      return UnavailableError(
          "the daemon is shutting down; watch again after it restarts with after_cursor=" +
          std::to_string(after_cursor));
    }
  }
  ASSIGN_OR_RETURN(auto events, store_->Events(id, after_cursor, limit));
  if (!events.empty()) return events;
  // As in Watch: the state read under mu_ has its event in the store already.
  ASSIGN_OR_RETURN(v1::Job job, [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return store_->Get(id);
  }());
  if (!IsFinalState(job.state())) return events;
  ASSIGN_OR_RETURN(events, store_->Events(id, after_cursor, limit));
  *complete = events.empty();
  return events;
}

Status JobManager::TransitionLocked(v1::Job* job, v1::JobState state, const std::string& reason) {
  const auto now = Now();
  const v1::JobState from = job->state();
  job->set_state(state);
  *job->mutable_update_time() = now;
  if (state == v1::JOB_STATE_RUNNING && !job->has_start_time()) *job->mutable_start_time() = now;
  if (IsFinalState(state)) *job->mutable_end_time() = now;
  auto* t = job->add_transitions();
  t->set_state(state);
  *t->mutable_time() = now;
  t->set_reason(reason);
  // The record keeps the latest transitions only (the event log keeps all): a job paused and
  // resumed without end would otherwise grow its record, and every write of it, for ever.
  if (job->transitions_size() > kMaxTransitionsKept) {
    job->mutable_transitions()->DeleteSubrange(0, job->transitions_size() - kMaxTransitionsKept);
  }
  v1::JobEvent e;
  e.set_job_id(job->id());
  *e.mutable_state_change() = *t;
  RETURN_IF_ERROR(CommitLocked(*job, std::move(e)));  // the new state and its event, or neither
  CountLocked(from, state);
  return OkStatus();
}

StatusOr<v1::Job> JobManager::Create(const v1::JobSpec& resolved_spec, const std::string& request_id,
                                     const std::string& submitted_by) {
  if (!runner_) {
    return FailedPreconditionError("this build cannot run jobs: the daemon has no job runner");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return UnavailableError("the daemon is shutting down; submit the job again after it restarts");
  if (!request_id.empty()) {  // under mu_: two concurrent retries create one job
    auto prior = JobForRequestLocked(submitted_by, request_id);
    if (prior.ok()) {
      if (prior->spec().SerializeAsString() != resolved_spec.SerializeAsString()) {
        return AlreadyExistsError("request_id '" + request_id + "' was used for job " +
                                  prior->id() +
                                  " with a different spec; use a new request_id for a new job");
      }
      return prior;
    }
    if (prior.status().code() != StatusCode::kNotFound) return prior.status();
  }
  // The whole record stays small (ValidateJobSpec bounds the spec as sent; this the resolved one).
  if (const size_t bytes = resolved_spec.ByteSizeLong() + request_id.size() + submitted_by.size();
      bytes > kMaxJobSpecBytes) {
    return InvalidArgumentError("the job spec is " + std::to_string(bytes) + " bytes serialized, more than the " +
                                std::to_string(kMaxJobSpecBytes) + " (256 KiB) a job record may hold; use fewer or " +
                                "shorter dataset paths, labels and names");
  }
  v1::Job job;
  job.set_request_id(request_id);
  job.set_submitted_by(submitted_by);
  *job.mutable_spec() = resolved_spec;
  job.set_state(v1::JOB_STATE_VALIDATING);
  *job.mutable_create_time() = Now();
  // An id is the second plus 24 random bits: a thousand submissions within one second collide
  // with a few percent probability, so a taken id is drawn again instead of refusing the job.
  Status inserted;
  for (int attempt = 0; attempt < 8; ++attempt) {
    job.set_id(NewJobId());
    inserted = store_->Insert(job);
    if (inserted.code() != StatusCode::kAlreadyExists) break;
  }
  RefreshHealthLocked();
  RETURN_IF_ERROR(inserted);
  CountLocked(v1::JOB_STATE_UNSPECIFIED, job.state());
  RETURN_IF_ERROR(TransitionLocked(&job, v1::JOB_STATE_QUEUED, "validated"));
  return job;
}

StatusOr<v1::Job> JobManager::Get(const std::string& id) {
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  std::lock_guard<std::mutex> lock(mu_);
  OverlayUnrecordedLocked(&job);
  return job;
}

StatusOr<JobStore::Page> JobManager::List(const std::vector<v1::JobState>& states, int page_size,
                                          const std::string& page_token) {
  if (page_size < 0) return InvalidArgumentError("page_size must not be negative");
  if (page_size == 0) page_size = 50;
  if (page_size > 1000) page_size = 1000;
  ASSIGN_OR_RETURN(JobStore::Page page, store_->List(states, page_size, page_token, kListPageBytes));
  std::lock_guard<std::mutex> lock(mu_);
  for (v1::Job& job : page.jobs) OverlayUnrecordedLocked(&job);
  return page;
}

StatusOr<v1::Job> JobManager::Cancel(const std::string& id, const std::string& reason, bool force) {
  std::unique_lock<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  const std::string why = reason.empty() ? "cancelled by request" : reason;
  switch (job.state()) {
    case v1::JOB_STATE_QUEUED:
    case v1::JOB_STATE_PAUSED:
    case v1::JOB_STATE_VALIDATING:
      SetCancelError(&job, why);
      RETURN_IF_ERROR(TransitionLocked(&job, v1::JOB_STATE_CANCELLED, why));
      lock.unlock();
      // A queued or paused job may hold NVMe states of a run a crash interrupted.
      if (runner_) runner_->DiscardJobState(job);
      return job;
    case v1::JOB_STATE_RUNNING:
    case v1::JOB_STATE_PAUSING:
      RequestStopLocked(id, JobControl::Stop::kCancel, /*requeue=*/false, force);
      if (auto it = running_.find(id); it != running_.end() && it->second->cancel_reason.empty()) {
        it->second->cancel_reason = why;
      }
      RETURN_IF_ERROR(TransitionLocked(&job, v1::JOB_STATE_CANCELLING, why));
      return job;
    case v1::JOB_STATE_CANCELLING:
      if (force) RequestStopLocked(id, JobControl::Stop::kCancel, /*requeue=*/false, force);
      return job;
    default:
      return FailedPreconditionError("job " + id + " is already " + StateName(job.state()));
  }
}

StatusOr<v1::Job> JobManager::Delete(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  if (!IsFinalState(job.state()) || running_.count(id) > 0 || unrecorded_.count(id) > 0) {
    return FailedPreconditionError("job " + id + " is " + StateName(job.state()) +
                                   ": only a job that ended can be deleted; cancel it first");
  }
  RETURN_IF_ERROR(store_->Delete(id));
  --counts_[job.state()];
  PublishCountsLocked();
  return job;
}

StatusOr<v1::Job> JobManager::Pause(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  switch (job.state()) {
    case v1::JOB_STATE_QUEUED:
      RETURN_IF_ERROR(TransitionLocked(&job, v1::JOB_STATE_PAUSED, "paused by request while queued"));
      return job;
    case v1::JOB_STATE_RUNNING:
      RequestStopLocked(id, JobControl::Stop::kPause);
      RETURN_IF_ERROR(TransitionLocked(&job, v1::JOB_STATE_PAUSING, "pausing: writing a checkpoint"));
      return job;
    case v1::JOB_STATE_PAUSING:
    case v1::JOB_STATE_PAUSED:
      return job;
    default:
      return FailedPreconditionError("job " + id + " is " + StateName(job.state()) + " and cannot be paused");
  }
}

StatusOr<v1::Job> JobManager::Resume(const std::string& id) {
  std::unique_lock<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(v1::Job job, store_->Get(id));
  if (job.state() == v1::JOB_STATE_PAUSED) {
    RETURN_IF_ERROR(TransitionLocked(&job, v1::JOB_STATE_QUEUED, "resumed by request"));
    return job;
  }
  if (job.state() != v1::JOB_STATE_FAILED || !runner_) {
    return FailedPreconditionError("job " + id + " is " + StateName(job.state()) +
                                   ", only PAUSED and FAILED jobs resume");
  }
  // A failed job goes on from its newest intact checkpoint. Finding it reads the checkpoints
  // (their checksums): not under mu_.
  lock.unlock();
  ASSIGN_OR_RETURN(const std::string checkpoint, runner_->CheckpointForResume(job));
  lock.lock();
  ASSIGN_OR_RETURN(job, store_->Get(id));
  if (job.state() != v1::JOB_STATE_FAILED) return job;  // a concurrent ResumeJob won
  job.clear_error();
  job.clear_end_time();
  RETURN_IF_ERROR(TransitionLocked(&job, v1::JOB_STATE_QUEUED,
                                   "resumed by request after failing; continues from " + checkpoint));
  return job;
}

void JobManager::RequestStopLocked(const std::string& id, JobControl::Stop stop, bool requeue, bool force) {
  auto it = running_.find(id);
  if (it == running_.end()) return;
  it->second->stop = stop;
  it->second->requeue_on_stop = requeue;
  it->second->force = it->second->force || force;
  if (it->second->stop_fd.valid()) ipc::SignalEventFd(it->second->stop_fd.get());
}

std::map<int, std::string> JobManager::GpuAssignments() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, std::string> out;
  for (const auto& [id, r] : running_) {
    if (r->done) continue;
    for (int g : r->gpus) out[g] = id;
  }
  return out;
}

std::optional<std::vector<int>> JobManager::ReserveHostPart(const std::string& name, int gpus) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_ || host_parts_.count(name) > 0) return std::nullopt;
  v1::Job shape;
  shape.mutable_spec()->mutable_resources()->set_gpus(static_cast<uint32_t>(std::max(1, gpus)));
  std::optional<std::vector<int>> picked = PickGpusLocked(shape);
  if (picked) host_parts_[name] = *picked;
  return picked;
}

void JobManager::ReleaseHostPart(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (host_parts_.erase(name) > 0) changed_.notify_all();  // the queue may start what waited
}

std::optional<std::vector<int>> JobManager::PickGpusLocked(const v1::Job& job) const {
  if (options_.gpus <= 0) {
    return running_.empty() && host_parts_.empty()
               ? std::optional<std::vector<int>>(std::vector<int>{})
               : std::nullopt;
  }
  std::vector<bool> busy(static_cast<size_t>(options_.gpus), false);
  for (const auto& [name, gpus] : host_parts_) {
    for (int g : gpus) busy[static_cast<size_t>(g)] = true;
  }
  for (const auto& [id, r] : running_) {
    for (int g : r->gpus) {
      if (g >= 0 && g < options_.gpus) busy[static_cast<size_t>(g)] = true;
    }
  }
  const int need = GpusNeeded(job);
  // Unset (or -1): any free GPU.
  const int pinned = job.spec().resources().has_gpu_index() ? job.spec().resources().gpu_index() : -1;
  if (need == 1 && pinned >= 0 && pinned < options_.gpus) {
    if (busy[static_cast<size_t>(pinned)]) return std::nullopt;
    return std::vector<int>{pinned};
  }
  std::vector<int> picked;
  for (int g = 0; g < options_.gpus && static_cast<int>(picked.size()) < need; ++g) {
    if (!busy[static_cast<size_t>(g)]) picked.push_back(g);
  }
  if (static_cast<int>(picked.size()) < need) return std::nullopt;
  return picked;
}

void JobManager::StartQueuedLocked(std::unique_lock<std::mutex>& lock) {
  auto queued = store_->InStates({v1::JOB_STATE_QUEUED});
  if (!queued.ok()) {
    OFFLOADD_LOG(kError, kLog) << queued.status().ToString();
    return;
  }
  for (v1::Job& job : *queued) {
    // Paused and resumed before its thread was joined: it starts once the thread is gone.
    if (running_.count(job.id()) > 0) break;
    if (options_.gpus > 0 && GpusNeeded(job) > options_.gpus) {
      const std::string why =
          "the job needs " + std::to_string(GpusNeeded(job)) +
          (job.spec().resources().hosts() > 1 ? " GPUs (resources.gpus_per_host)"
                                              : " GPUs (resources.gpus)") +
          "; this node has " + std::to_string(options_.gpus);
      job.mutable_error()->set_code(static_cast<int>(StatusCode::kFailedPrecondition));
      job.mutable_error()->set_message(why);
      if (Status s = TransitionLocked(&job, v1::JOB_STATE_FAILED, why); !s.ok()) OFFLOADD_LOG(kError, kLog) << s.ToString();
      continue;
    }
    std::optional<std::vector<int>> gpus = PickGpusLocked(job);
    if (!gpus) break;  // strictly FIFO: the head of the queue waits for its GPUs, the rest behind it
    auto running = std::make_unique<Running>();
    running->gpus = std::move(*gpus);
    if (auto fd = ipc::MakeEventFd(); fd.ok()) running->stop_fd = std::move(*fd);
    if (Status s = TransitionLocked(&job, v1::JOB_STATE_RUNNING, "started on " + DescribeGpus(running->gpus)); !s.ok()) {
      OFFLOADD_LOG(kError, kLog) << "job " << job.id() << " not started: its state cannot be recorded ("
                                 << s.ToString() << "); trying again in " << kRecordRetry.count() << " s";
      changed_.wait_for(lock, kRecordRetry);  // not a busy loop on a full state directory
      return;
    }
    Running* r = running.get();
    running_[job.id()] = std::move(running);
    r->thread = std::thread([this, job, r] { RunJob(job, r); });
  }
}

void JobManager::SchedulerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Join the threads of jobs whose end is recorded; their GPUs are free again.
    for (auto it = running_.begin(); it != running_.end();) {
      if (!it->second->done) {
        ++it;
        continue;
      }
      std::unique_ptr<Running> r = std::move(it->second);
      running_.erase(it);
      lock.unlock();
      r->thread.join();
      lock.lock();
      it = running_.begin();
    }
    if (shutting_down_) {
      if (running_.empty()) return;
    } else if (unrecorded_ends_ == 0) {
      StartQueuedLocked(lock);
    }
    // The database file is checked at every write and here, so an idle daemon notices too.
    (void)store_->CheckFile();  // logged and reported by the store
    RefreshHealthLocked();
    changed_.wait_for(lock, std::chrono::seconds(5));
  }
}

void JobManager::RunJob(v1::Job job, Running* running) {
  OFFLOADD_LOG(kInfo, kLog) << "job " << job.id() << " running on " << DescribeGpus(running->gpus);
  Control control(this, job.id(), running);
  const Status result = runner_->Run(job, control);
  std::unique_lock<std::mutex> lock(mu_);
  RunEnd end{v1::JOB_STATE_SUCCEEDED, "finished", OkStatus()};
  if (!result.ok() && result.code() == StatusCode::kCancelled && running->stop == JobControl::Stop::kCancel) {
    // The user's reason stays the job's: in its last transition and in its error.
    const std::string why = running->cancel_reason.empty() ? "cancelled" : running->cancel_reason;
    end = {v1::JOB_STATE_CANCELLED, why, CancelledError(why)};
  } else if (!result.ok() && result.code() == StatusCode::kCancelled && running->stop == JobControl::Stop::kPause) {
    end.state = running->requeue_on_stop ? v1::JOB_STATE_QUEUED : v1::JOB_STATE_PAUSED;
    end.reason = running->requeue_on_stop ? "checkpointed and queued again: the daemon is shutting down; it continues "
                                            "when the daemon restarts"
                 : shutting_down_ ? "paused: the daemon is shutting down"
                                  : "paused";
  } else if (!result.ok()) {
    end = {v1::JOB_STATE_FAILED, SafeMessageText(result.message(), 8192), result};
  }
  // The end of a run must reach the store, or the job shows RUNNING until a restart. A full or
  // failing state directory refuses it: say so, and try again until it is recorded (any other
  // job would fail the same way meanwhile, so none starts) or the daemon stops.
  for (int attempt = 1;; ++attempt) {
    const Status s = RecordEndLocked(job.id(), end);
    if (s.ok()) {
      if (attempt > 1) {
        --unrecorded_ends_;
        unrecorded_.erase(job.id());
        RefreshHealthLocked();
        OFFLOADD_LOG(kWarning, kLog) << "job " << job.id() << ": " << StateName(end.state)
                                     << " recorded at attempt " << attempt;
      }
      break;
    }
    if (attempt == 1) ++unrecorded_ends_;
    if (unrecorded_.count(job.id()) > 0) unrecorded_[job.id()].second = s.message();
    RefreshHealthLocked();
    if (shutting_down_) {
      --unrecorded_ends_;
      unrecorded_.erase(job.id());
      OFFLOADD_LOG(kError, kLog) << "job " << job.id() << " ended " << StateName(end.state)
                                 << " but the state directory could not record it (" << s.ToString()
                                 << "); after a restart the job runs again from its last checkpoint";
      break;
    }
    if (attempt == 1 || attempt % 30 == 0) {
      OFFLOADD_LOG(kError, kLog) << "job " << job.id() << " ended " << StateName(end.state)
                                 << " but the state directory cannot record it (" << s.ToString()
                                 << "); it is not durable until it can. Retrying every " << kRecordRetry.count()
                                 << " s (attempt " << attempt << "): free space in the state directory "
                                 << "(GetJob shows " << StateName(end.state) << " meanwhile)";
    }
    changed_.wait_for(lock, kRecordRetry);
  }
  OFFLOADD_LOG(kInfo, kLog) << "job " << job.id() << " " << StateName(end.state) << ": " << end.reason;
  running->done = true;
  changed_.notify_all();
}

Status JobManager::RecordEndLocked(const std::string& id, const RunEnd& end) {
  ASSIGN_OR_RETURN(v1::Job current, store_->Get(id));
  if (current.state() == end.state && current.transitions_size() > 0) {
    // The job is RUNNING, PAUSING or CANCELLING while it runs, never in an end state: an earlier
    // attempt recorded the state but not its event. Append only the event.
    v1::JobEvent e;
    e.set_job_id(id);
    *e.mutable_state_change() = current.transitions(current.transitions_size() - 1);
    return AppendLocked(std::move(e));
  }
  if (!end.error.ok()) {
    current.mutable_error()->set_code(static_cast<int>(end.error.code()));
    current.mutable_error()->set_message(SafeMessageText(end.error.message(), 8192));
  }
  const Status recorded = TransitionLocked(&current, end.state, end.reason);
  // Until the store holds it, GetJob and ListJobs show the job as it ended.
  if (!recorded.ok()) unrecorded_[id] = {current, recorded.message()};
  return recorded;
}

}  // namespace offloadd::daemon
