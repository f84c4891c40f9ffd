#include "daemon/jobs/executor_job_runner.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include <google/protobuf/util/time_util.h>

#include "common/file.h"
#include "common/logging.h"
#include "ipc/child_process.h"
#include "ipc/event_fd.h"
#include "job/executor_protocol.h"
#include "job/path_policy.h"
#include "workers/cpu_topology.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
namespace pb = offloadd::internal;
using Clock = std::chrono::steady_clock;
constexpr const char* kLog = "jobs";

// One executor of the attempt running now.
struct Executor {
  int rank = 0;
  int gpu = -1;
  ipc::ChildProcess child;
  bool hello = false;     // its hello arrived and was accepted
  bool finished = false;  // it sent its final status
  Status result;          // that status
  bool socket_open = true;
  bool exited = false;
  int wait_status = 0;
  std::string problem;  // why it counts as failed while it may still run (garbled, lost socket)
  // Liveness: its last message (the launch before the first), whether a heartbeat came, and the
  // phase the last one named (daemon-side start time, expected duration; 0: unknown).
  Clock::time_point last_heard;
  bool heartbeat = false;
  std::string phase = "starting";
  Clock::time_point phase_since;
  double expected_seconds = 0;
};

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", s);
  return buf;
}

// How one attempt (one set of executors) ended.
struct Attempt {
  bool died = false;      // an executor died abnormally: the job may start again
  bool retryable = true;  // false: retrying cannot help (a protocol mismatch)
  Status status;          // the job's result; when `died`, the cause
};

// Runs one attempt: launches the job's executors, relays their events, forwards stop requests and
// supervises them until every one has exited.
class AttemptRunner {
 public:
  AttemptRunner(const ExecutorRunnerOptions& options, TrainMetrics* metrics, const v1::Job& job,
                JobControl& control, uint32_t restart, v1::JobProgress* last_progress,
                const HostRank& host)
      : options_(options),
        metrics_(metrics),
        job_(job),
        control_(control),
        restart_(restart),
        last_progress_(last_progress),
        host_(host) {}

  Attempt Run() {
    std::string rendezvous_path;
    const int world = JobWorldSize(job_);
    if (host_.hosts > 1) {  // this host's ranks of a group across hosts: they meet over TCP
      // Ranks numbered host by host (RANK = host x per_host + local, as torchrun's): this host's
      // ranks share its arena, local rank 0 leading it (docs/data_parallel.md).
      const int per_host = JobRanksPerHost(job_);
      const std::vector<int> gpus = control_.gpus();
      for (int local = 0; local < per_host; ++local) {
        int gpu = -1;
        if (static_cast<size_t>(local) < gpus.size()) {
          gpu = gpus[static_cast<size_t>(local)];
        } else if (options_.environment.has_gpu()) {
          gpu = local;
        }
        if (Status s = Launch(host_.index * per_host + local, host_.hosts * per_host, gpu,
                              host_.rendezvous);
            !s.ok()) {
          Fail(nullptr, s, /*died=*/false);
          break;
        }
      }
      Supervise();
      if (trigger_) return *trigger_;
      return {false, true,
              executors_.empty() ? InternalError("no executor ran") : executors_.front().result};
    }
    if (world > 1) {
      const std::string dir = options_.state_dir + "/jobs/" + job_.id();
      rendezvous_path = dir + "/rendezvous-" + std::to_string(restart_);
      if (Status s = MakeDirs(dir); !s.ok())
        return {false, false, s.WithContext("rendezvous directory")};
      if (Status s = RemoveTree(rendezvous_path); !s.ok())
        OFFLOADD_LOG(kWarning, kLog) << s.ToString();
    }
    const std::vector<int> gpus = control_.gpus();
    for (int rank = 0; rank < world; ++rank) {
      int gpu = -1;
      if (static_cast<size_t>(rank) < gpus.size()) {
        gpu = gpus[static_cast<size_t>(rank)];
      } else if (options_.environment.has_gpu()) {
        gpu = world == 1 && job_.spec().resources().gpu_index() >= 0 ? job_.spec().resources().gpu_index() : rank;
      }
      if (Status s =
              Launch(rank, world, gpu, rendezvous_path.empty() ? "" : "file://" + rendezvous_path);
          !s.ok()) {
        Fail(nullptr, s, /*died=*/false);
        break;
      }
    }
    Supervise();
    if (!rendezvous_path.empty()) {
      if (Status s = RemoveTree(rendezvous_path); !s.ok())
        OFFLOADD_LOG(kWarning, kLog) << s.ToString();
    }
    if (trigger_) return *trigger_;
    // Every executor sent its final status: rank 0's speaks for the job.
    return {false, true, executors_.empty() ? InternalError("no executor ran") : executors_.front().result};
  }

 private:
  Status Launch(int rank, int world, int gpu, const std::string& rendezvous) {
    // The submitter's rights for the job's files (a token's user= may be gone since CreateJob).
    ASSIGN_OR_RETURN(std::optional<FileIdentity> identity,
                     SubmitterFileIdentity(job_.submitted_by(), options_.token_users));
    ASSIGN_OR_RETURN(ipc::ChildProcess child,
                     ipc::LaunchChild(options_.executor_binary, {"--log-level=" + options_.log_level}));
    Executor& e = executors_.emplace_back();
    e.rank = rank;
    e.gpu = gpu;
    e.child = std::move(child);
    e.last_heard = e.phase_since = Clock::now();
    control_.Log(v1::LOG_LEVEL_INFO, "executor started: pid " + std::to_string(e.child.pid) + " rank " +
                                         std::to_string(rank) + " gpu " + (gpu >= 0 ? std::to_string(gpu) : "cpu"));
    pb::DaemonMessage hello;
    *hello.mutable_hello() = MakeHello(kDaemonProgram);
    pb::DaemonMessage start;
    pb::StartJob& s = *start.mutable_start();
    *s.mutable_job() = job_;
    *s.mutable_environment() = options_.environment;
    pb::Placement& p = *s.mutable_placement();
    p.set_world_size(world);
    p.set_rank(rank);
    p.set_rendezvous(rendezvous);
    p.set_gpu_index(gpu);
    p.set_hosts(host_.hosts);
    p.set_timeout_seconds(static_cast<int64_t>(std::ceil(options_.group_timeout_seconds)));
    s.set_restart(restart_);
    if (rank == 0) {
      // trainer_state.json's log_history covers the earlier runs too; without them (the store
      // failing) it has this run's steps, and the job's events say why.
      auto history = control_.RecordedMetrics();
      if (history.ok()) {
        for (auto& row : *history) *s.add_history() = std::move(row);
      } else {
        control_.Log(v1::LOG_LEVEL_WARNING, "trainer_state.json will hold this run's steps only: " +
                                                history.status().ToString());
      }
    }
    if (identity) {
      pb::FileIdentity& f = *s.mutable_file_identity();
      f.set_uid(identity->uid);
      f.set_gid(identity->gid);
      for (gid_t g : identity->groups) f.add_groups(g);
      f.set_user(identity->user);
    }
    // An executor that cannot read them (it failed to start) shows through its pidfd: its exit
    // status says why.
    Status sent = SendProto(e.child.control.get(), hello);
    if (sent.ok()) sent = SendProto(e.child.control.get(), start);
    if (!sent.ok()) OFFLOADD_LOG(kDebug, kLog) << "job " << job_.id() << " rank " << rank << ": " << sent.ToString();
    return OkStatus();
  }

  std::string Name(const Executor& e) const {
    return "executor rank " + std::to_string(e.rank) + " (pid " + std::to_string(e.child.pid) + ")";
  }

  // The first failure of the attempt decides its outcome; the other executors are asked to stop and
  // killed after the grace period.
  void Fail(Executor* e, const Status& why, bool died, bool retryable = true) {
    if (!trigger_) {
      trigger_ = Attempt{died, retryable, why};
      if (e != nullptr) OFFLOADD_LOG(kWarning, kLog) << "job " << job_.id() << ": " << why.message();
      Broadcast(pb::Control::ACTION_CANCEL);
      kill_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(options_.kill_grace_seconds * 1000));
    }
  }

  void Broadcast(pb::Control::Action action) {
    pb::DaemonMessage m;
    m.mutable_control()->set_action(action);
    for (Executor& e : executors_) {
      if (e.socket_open && !e.exited) (void)SendProto(e.child.control.get(), m);
    }
  }

  void Kill(Executor& e) {
    if (!e.exited) ::kill(e.child.pid, SIGKILL);
  }

  void Supervise() {
    const int stop_fd = control_.stop_fd();
    JobControl::Stop forwarded = JobControl::Stop::kNone;
    if (stop_fd < 0 || control_.stop_requested() != JobControl::Stop::kNone) forwarded = ForwardStop(forwarded);
    while (std::any_of(executors_.begin(), executors_.end(), [](const Executor& e) { return !e.exited; })) {
      std::vector<pollfd> fds;
      std::vector<std::pair<Executor*, bool>> owners;  // (executor, is its pidfd)
      bool no_pidfd = false;
      for (Executor& e : executors_) {
        if (e.socket_open) {
          fds.push_back({e.child.control.get(), POLLIN, 0});
          owners.emplace_back(&e, false);
        }
        if (!e.exited && e.child.pidfd.valid()) {
          fds.push_back({e.child.pidfd.get(), POLLIN, 0});
          owners.emplace_back(&e, true);
        }
        no_pidfd |= !e.exited && !e.child.pidfd.valid();
      }
      if (stop_fd >= 0) fds.push_back({stop_fd, POLLIN, 0});
      int timeout_ms = stop_fd < 0 || no_pidfd ? 200 : -1;  // no fd to wake on: look again soon
      std::optional<Clock::time_point> wake = kill_deadline_;
      const auto earliest = [&wake](std::optional<Clock::time_point> t) {
        if (t && (!wake || *t < *wake)) wake = t;
      };
      earliest(cancel_deadline_);
      earliest(NextLivenessDeadline());
      if (wake) {
        // Rounded up: waking a millisecond early would only loop once more.
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*wake - Clock::now()).count() + 1;
        const int ms = static_cast<int>(std::clamp<int64_t>(left, 0, 3600 * 1000));
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
      const int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        OFFLOADD_LOG(kError, kLog) << "poll: " << ErrnoError(errno, "poll").ToString();
        for (Executor& e : executors_) Kill(e);
      }
      for (size_t i = 0; n > 0 && i < owners.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Executor& e = *owners[i].first;
        if (owners[i].second) {
          Reap(e);
        } else if (e.socket_open) {
          ReadOne(e);
        }
      }
      if (stop_fd >= 0 && n > 0 && fds.back().revents != 0) ipc::DrainEventFd(stop_fd);
      if (stop_fd < 0 || (n > 0 && fds.back().revents != 0)) forwarded = ForwardStop(forwarded);
      for (Executor& e : executors_) {
        if (no_pidfd && !e.exited && e.child.pidfd.valid() == false) ReapIfExited(e);
      }
      if (kill_deadline_ && Clock::now() >= *kill_deadline_) {
        for (Executor& e : executors_) Kill(e);
        kill_deadline_.reset();
      }
      if (cancel_deadline_ && Clock::now() >= *cancel_deadline_) {
        cancel_deadline_.reset();
        KillAll("did not stop within jobs.cancel_grace_seconds (" + FormatSeconds(options_.cancel_grace_seconds) +
                " s) of the cancel request: killed");
      }
      EnforceLiveness();
    }
  }

  // Kills every executor still running, `why` becoming its cause.
  void KillAll(const std::string& why) {
    for (Executor& e : executors_) {
      if (e.exited) continue;
      if (e.problem.empty()) e.problem = why;
      OFFLOADD_LOG(kWarning, kLog) << "job " << job_.id() << ": " << Name(e) << " " << why;
      Kill(e);
    }
  }

  // The executors' liveness deadlines (class comment in executor_job_runner.h): silence, then the
  // phase. None for an executor that finished, exited or lost its socket (its death shows).
  struct Deadline {
    Clock::time_point at;
    bool phase;  // the phase's deadline, not the heartbeat's
  };
  std::optional<Deadline> LivenessDeadline(const Executor& e) const {
    if (options_.heartbeat_seconds <= 0 || e.exited || e.finished || !e.socket_open) return std::nullopt;
    // Before its first heartbeat the process is still loading its libraries and the job.
    const double silence = std::max(e.heartbeat ? 1.0 : 60.0, 6 * options_.heartbeat_seconds);
    Deadline d{e.last_heard + Seconds(silence), false};
    if (options_.liveness_floor_seconds > 0 && e.expected_seconds > 0) {
      const Clock::time_point phase_end = e.phase_since + Seconds(PhaseLimit(e));
      if (phase_end < d.at) d = {phase_end, true};
    }
    return d;
  }
  // One floor more than a worker's or the store's own deadline: those run inside the step and,
  // started later, act first (a replay in place beats a restart from the checkpoint).
  double PhaseLimit(const Executor& e) const {
    return options_.liveness_floor_seconds +
           std::max(options_.liveness_floor_seconds, options_.liveness_factor * e.expected_seconds);
  }
  std::optional<Clock::time_point> NextLivenessDeadline() const {
    std::optional<Clock::time_point> next;
    for (const Executor& e : executors_) {
      if (auto d = LivenessDeadline(e); d && (!next || d->at < *next)) next = d->at;
    }
    return next;
  }

  // Kills the executors past a liveness deadline: their deaths then restart the job (or fail it
  // naming them and their phase once the restarts are spent).
  void EnforceLiveness() {
    const Clock::time_point now = Clock::now();
    for (Executor& e : executors_) {
      const std::optional<Deadline> d = LivenessDeadline(e);
      if (!d || now < d->at) continue;
      const double in_phase = std::chrono::duration<double>(now - e.phase_since).count();
      std::string why = "killed by the liveness watchdog: ";
      if (d->phase) {
        why += "'" + e.phase + "' ran " + FormatSeconds(in_phase) + " s, over its deadline of " +
               FormatSeconds(PhaseLimit(e)) + " s (jobs.liveness.floor_seconds + max(floor, factor " +
               FormatSeconds(options_.liveness_factor) + " x expected " + FormatSeconds(e.expected_seconds) + " s))";
      } else {
        why += "no heartbeat for " + FormatSeconds(std::chrono::duration<double>(now - e.last_heard).count()) +
               " s (jobs.liveness.heartbeat_seconds " + FormatSeconds(options_.heartbeat_seconds) +
               "), while in '" + e.phase + "' for " + FormatSeconds(in_phase) + " s";
      }
      if (metrics_ != nullptr) metrics_->CountWatchdogKill("executor");
      e.problem = why;
      OFFLOADD_LOG(kError, kLog) << "job " << job_.id() << ": " << Name(e) << " " << why;
      Kill(e);
      e.socket_open = false;  // nothing more is read from it; its pidfd reports the death
      e.child.control.reset();
    }
  }

  JobControl::Stop ForwardStop(JobControl::Stop forwarded) {
    const JobControl::Stop now = control_.stop_requested();
    if (now == JobControl::Stop::kCancel && !forced_ && control_.force_stop()) {
      forced_ = true;
      cancel_deadline_.reset();
      control_.Log(v1::LOG_LEVEL_WARNING, "cancel --force: killing the job's executors");
      KillAll("killed by a forced cancel");
    }
    if (now == forwarded || now == JobControl::Stop::kNone) return forwarded;
    Broadcast(now == JobControl::Stop::kPause ? pb::Control::ACTION_PAUSE : pb::Control::ACTION_CANCEL);
    // A cancelled executor that does not stop (stopped, wedged) is killed after the grace period.
    if (now == JobControl::Stop::kCancel && !forced_) {
      cancel_deadline_ = Clock::now() + Seconds(options_.cancel_grace_seconds);
    }
    return now;
  }

  // One message from `e`, or the end of its socket.
  void ReadOne(Executor& e) {
    pb::ExecutorMessage m;
    const Status s = RecvProto(e.child.control.get(), &m);
    if (s.ok()) {
      e.last_heard = Clock::now();
      Relay(e, m);
      return;
    }
    e.socket_open = false;
    e.child.control.reset();
    if (s.code() == StatusCode::kUnavailable) {
      // After its final status the executor exits; before it, a closed socket is a lost executor.
      if (!e.finished && !e.exited) {
        // A cause found before (the cancel's grace period, a forced cancel) stays the cause.
        if (e.problem.empty()) e.problem = "closed its control socket without a final status";
        Kill(e);
      }
      return;
    }
    e.problem = "sent a garbled message (" + std::string(s.message()) + ")";
    Kill(e);
  }

  void Relay(Executor& e, const pb::ExecutorMessage& m) {
    if (!e.hello) {
      Status s = m.has_hello() ? CheckHello(m.hello(), kExecutorProgram)
                               : DataLossError("its first message is not a hello");
      if (!s.ok()) {
        e.problem = s.message();
        Fail(&e, FailedPreconditionError(Name(e) + ": " + std::string(s.message())), false, false);
        Kill(e);
        return;
      }
      e.hello = true;
      return;
    }
    if (m.has_heartbeat()) {
      const pb::Heartbeat& h = m.heartbeat();
      e.heartbeat = true;
      e.phase = h.phase().substr(0, 200);
      e.expected_seconds = std::isfinite(h.expected_seconds()) ? std::max(0.0, h.expected_seconds()) : 0;
      const double in_phase = std::isfinite(h.phase_seconds()) ? std::clamp(h.phase_seconds(), 0.0, 1e7) : 0;
      e.phase_since = Clock::now() - Seconds(in_phase);
      return;
    }
    if (m.has_finished()) {
      e.finished = true;
      e.result = FromFinished(m.finished());
      // A training error ends the job (no retry); CANCELLED is the answer to a stop request. A
      // failure of the device (a CUDA error, the GPU out of memory, the NCCL group) is not the
      // job's: like an executor's death, it restarts the job from its last checkpoint.
      if (!e.result.ok() && !(e.result.code() == StatusCode::kCancelled &&
                              control_.stop_requested() != JobControl::Stop::kNone)) {
        const bool restartable = IsRestartableFailure(e.result);
        if (restartable && metrics_ != nullptr &&
            e.result.message().find("killed by the liveness watchdog") != std::string::npos) {
          metrics_->CountWatchdogKill("store");  // the store's watchdog runs in the executor
        }
        Fail(&e, e.result, /*died=*/restartable);
      }
      return;
    }
    if (m.has_log()) {
      control_.Log(m.log().level(), m.log().message());
      return;
    }
    if (e.rank != 0) return;  // rank 0 speaks for the job
    if (m.has_progress()) {
      *last_progress_ = m.progress();
      control_.ReportProgress(m.progress());
    } else if (m.has_checkpoint()) {
      control_.CheckpointSaved(m.checkpoint());
    } else if (m.has_step()) {
      control_.RecordMetrics(
          MetricsRow(m.step(), google::protobuf::util::TimeUtil::GetCurrentTime()));
      if (metrics_ != nullptr) metrics_->Observe(job_.id(), FromProto(m.step()));
    } else if (m.has_eval()) {
      control_.RecordMetrics(
          MetricsRow(m.eval(), google::protobuf::util::TimeUtil::GetCurrentTime()));
      if (metrics_ != nullptr) metrics_->ObserveEval(job_.id(), FromProto(m.eval()));
    } else if (metrics_ != nullptr && m.has_projector_check()) {
      metrics_->ObserveProjectorCheck(job_.id(), FromProto(m.projector_check()));
    } else if (metrics_ != nullptr && m.has_runtime()) {
      metrics_->ObserveRuntime(job_.id(), FromProto(m.runtime()));
      metrics_->ObserveWorkerWatchdogKills(job_.id(), m.runtime().worker_watchdog_kills());
    }
  }

  // `e` exited: collect its status, read what it sent before, and judge the ending.
  void Reap(Executor& e) {
    int status = 0;
    pid_t r;
    do {
      r = ::waitpid(e.child.pid, &status, 0);
    } while (r < 0 && errno == EINTR);
    Exited(e, r == e.child.pid ? status : 0);
  }
  void ReapIfExited(Executor& e) {
    int status = 0;
    if (::waitpid(e.child.pid, &status, WNOHANG) == e.child.pid) Exited(e, status);
  }
  void Exited(Executor& e, int status) {
    e.exited = true;
    e.wait_status = status;
    e.child.pidfd.reset();
    // Its messages are still in the socket (the process is gone: reading does not block).
    while (e.socket_open) {
      pollfd p{e.child.control.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      ReadOne(e);
    }
    e.socket_open = false;
    e.child.control.reset();
    if (e.finished) return;
    std::string cause = ipc::DescribeExit(status);
    if (!e.problem.empty()) cause = e.problem + "; " + cause;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) cause += " without a final status";
    Fail(&e, AbortedError(Name(e) + " " + cause), /*died=*/true);
  }

  const ExecutorRunnerOptions& options_;
  TrainMetrics* metrics_;
  const v1::Job& job_;
  JobControl& control_;
  const uint32_t restart_;
  v1::JobProgress* last_progress_;
  const HostRank& host_;  // hosts 1: a job of this host alone
  std::vector<Executor> executors_;
  std::optional<Attempt> trigger_;
  std::optional<Clock::time_point> kill_deadline_;
  std::optional<Clock::time_point> cancel_deadline_;  // a cancel's grace period ends
  bool forced_ = false;                               // a forced cancel killed the executors
};

}  // namespace

bool IsDeviceFailure(const Status& s) {
  if (s.ok() || (s.code() != StatusCode::kInternal && s.code() != StatusCode::kResourceExhausted &&
                 s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kAborted)) {
    return false;
  }
  const std::string& m = s.message();
  for (const char* sign : {"CUDA error", "CUDA out of memory", "cudaError", "CUBLAS_STATUS_", "CUDNN_STATUS_",
                           "NCCL", "data-parallel"}) {
    if (m.find(sign) != std::string::npos) return true;
  }
  return false;
}

bool IsRestartableFailure(const Status& s) {
  if (IsDeviceFailure(s)) return true;
  // storage::kStoreDiedSign (the daemon does not link the store client): "offloadd-store (pid N)
  // died: ..." or "... killed by the liveness watchdog". Its I/O errors (ENOSPC, EIO, a checksum
  // mismatch) say neither and still fail the job.
  return !s.ok() && s.code() != StatusCode::kCancelled &&
         s.message().find("offloadd-store (pid ") != std::string::npos &&
         (s.message().find(") died: ") != std::string::npos ||
          s.message().find("killed by the liveness watchdog") != std::string::npos);
}

int JobWorldSize(const v1::Job& job) { return std::max<int>(1, static_cast<int>(job.spec().resources().gpus())); }

int JobRanksPerHost(const v1::Job& job) {
  const auto& res = job.spec().resources();
  return res.hosts() > 1 ? std::max<int>(1, static_cast<int>(res.gpus_per_host()))
                         : JobWorldSize(job);
}

Status ExecutorJobRunner::Run(const v1::Job& job, JobControl& control) {
  return RunHostRank(job, control, HostRank{});
}

Status ExecutorJobRunner::RunHostRank(const v1::Job& job, JobControl& control,
                                      const HostRank& host) {
  const uint32_t max_restarts = host.hosts > 1 ? 0 : options_.max_restarts;
  if (metrics_ != nullptr) {
    std::string gpus;
    for (int g : control.gpus()) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
    metrics_->StartJob(job.id(), gpus);  // no display name or path: /metrics is unauthenticated
  }
  v1::Job current = job;
  Status result;
  for (uint32_t restart = 0;; ++restart) {
    v1::JobProgress last = current.progress();
    const Attempt a =
        AttemptRunner(options_, metrics_, current, control, restart, &last, host).Run();
    // Steps reported so far are not reported again by the next attempt.
    if (last.step() > current.progress().step()) *current.mutable_progress() = last;
    if (!a.died) {
      result = a.status;
      break;
    }
    if (control.stop_requested() != JobControl::Stop::kNone) {
      result = CancelledError("stopped on request; " + std::string(a.status.message()));
      break;
    }
    if (!a.retryable || restart >= max_restarts) {
      result = AbortedError(
          std::string(a.status.message()) +
          (max_restarts == 0 ? std::string(host.hosts > 1 ? " (a job across hosts is not restarted)"
                                                          : " (jobs.max_executor_restarts is 0)")
                             : "; the job was restarted " + std::to_string(restart) +
                                   " time(s) (jobs.max_executor_restarts: " +
                                   std::to_string(max_restarts) + ")"));
      break;
    }
    control.Log(v1::LOG_LEVEL_WARNING,
                std::string(a.status.message()) +
                    "; restarting the job from its last checkpoint (restart " +
                    std::to_string(restart + 1) + " of " + std::to_string(max_restarts) + ")");
  }
  if (metrics_ != nullptr) metrics_->EndJob(job.id());  // kept for the retention, then removed
  return result;
}

void ExecutorJobRunner::DiscardJobState(const v1::Job& job) {
  auto config = MakeTrainConfig(job, options_.environment);
  if (!config.ok()) return;  // nothing was created
  for (const auto& d : config->offload.nvme_dirs) {
    if (access(d.c_str(), F_OK) != 0) continue;
    if (Status s = RemoveTree(d); !s.ok()) {
      OFFLOADD_LOG(kWarning, kLog) << "job " << job.id() << ": " << s.ToString();
    } else {
      OFFLOADD_LOG(kInfo, kLog) << "job " << job.id() << ": removed its NVMe states " << d;
    }
  }
}

StatusOr<std::string> ExecutorJobRunner::CheckpointForResume(const v1::Job& job) { return CheckpointForFailedJob(job); }

TrainerEnvironment DaemonTrainerEnvironment(const DaemonConfig& config, bool has_gpu) {
  TrainerEnvironment env = DefaultTrainerEnvironment();
  env.set_has_gpu(has_gpu);
  env.set_worker_binary(FindSiblingBinary("offloadd-worker", "workers"));
  env.set_store_binary(FindSiblingBinary("offloadd-store", "storage"));
  uint32_t processes = config.workers.processes;
  if (processes == 0) {
    processes = static_cast<uint32_t>(
        std::max<size_t>(1, workers::NumaNodes(workers::AllowedCpus()).size()));
  }
  env.set_worker_processes(processes);
  env.set_worker_threads(config.workers.threads_per_process);
  env.set_adamw_kernel(config.workers.adamw_kernel);
  env.set_profile_dir(config.state_dir + "/profiles");
  env.set_progress_interval_seconds(config.metrics.progress_interval_seconds);
  env.set_host_memory_limit(config.memory.host_memory_limit);
  env.set_gpu_memory_limit(config.memory.gpu_memory_limit);
  for (const auto& d : config.storage.directories) env.add_store_dirs(d.path);
  for (const auto& r : config.allowed_roots) env.add_allowed_roots(r);
  env.set_liveness_floor_seconds(config.jobs.liveness.floor_seconds);
  env.set_liveness_factor(config.jobs.liveness.factor);
  env.set_heartbeat_seconds(config.jobs.liveness.heartbeat_seconds);
  return env;
}

}  // namespace offloadd::daemon
