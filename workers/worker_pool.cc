#include "workers/worker_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>

#include "common/logging.h"
#include "ipc/child_process.h"
#include "ipc/event_fd.h"
#include "ipc/fd_passing.h"
#include "ipc/liveness.h"
#include "workers/cpu_topology.h"
#include "workers/shard_executor.h"

namespace offloadd::workers {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kLatencyBounds[] = {1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10};
constexpr size_t kNumLatencyBuckets = std::size(kLatencyBounds) + 1;

enum EventType : uint64_t { kWake = 0, kDeath = 1, kCompletionReady = 2, kCommandSpace = 3 };
uint64_t EventKey(uint32_t worker, EventType type) { return (uint64_t{worker} << 8) | type; }

using ipc::DescribeExit;

// The elements a command works on (each command struct starts with its num_elements).
uint64_t CommandElements(const ipc::CommandRecord& c) {
  switch (static_cast<CommandKind>(c.kind)) {
    case CommandKind::kAdamW:
    case CommandKind::kAdamWCorrect: return c.Unpack<AdamWCommand>().num_elements;
    case CommandKind::kAccumulate: return c.Unpack<AccumulateCommand>().num_elements;
    case CommandKind::kGradNorm: return c.Unpack<GradNormCommand>().num_elements;
    default: return 0;
  }
}

const char* CommandName(uint32_t kind) {
  switch (static_cast<CommandKind>(kind)) {
    case CommandKind::kAdamW: return "AdamW update";
    case CommandKind::kAdamWCorrect: return "AdamW correction";
    case CommandKind::kAccumulate: return "gradient accumulation";
    case CommandKind::kGradNorm: return "gradient norm";
    case CommandKind::kShutdown: return "shutdown";
    default: return "command";
  }
}

}  // namespace

struct WorkerPool::Pending {
  ipc::CommandRecord command;
  Clock::time_point submitted;
};

struct WorkerPool::Worker {
  uint32_t index = 0;
  std::vector<int> cpus;
  int numa_node = -1;
  pid_t pid = -1;
  ipc::UniqueFd pidfd, control;
  int death_fd = -1;  // pidfd, or the control socket when pidfd_open is unavailable
  ipc::UniqueFd cmd_ready, cmd_space, cpl_ready, cpl_space;
  ipc::Channel<ipc::CommandRecord> commands;
  ipc::Channel<WorkerCompletion> completions;
  uint64_t undo_offset = 0;
  std::deque<Pending> pending;    // not yet in the ring
  std::deque<Pending> in_flight;  // in the ring or executing
  uint32_t incarnation = 0;
  uint32_t crashes_without_progress = 0;  // reset by every completed command
  // Liveness: when the oldest in-flight command's clock started (its push into the ring, or the
  // last completion), and whether the watchdog has killed this incarnation.
  Clock::time_point progress_at{};
  bool watchdog_killed = false;
  bool failed = false;
  bool exited = false;  // after shutdown
  uint64_t commands_total = 0, params_total = 0;
  double busy_seconds = 0;
};

WorkerPool::WorkerPool(ipc::SharedSegment* segment, ipc::Arena* arena, WorkerPoolOptions options)
    : segment_(segment),
      arena_(arena),
      options_(std::move(options)),
      latency_counts_(kNumLatencyBuckets, 0) {}

StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::Start(ipc::SharedSegment* segment,
                                                        ipc::Arena* arena,
                                                        const WorkerPoolOptions& options) {
  std::unique_ptr<WorkerPool> pool(new WorkerPool(segment, arena, options));
  RETURN_IF_ERROR(pool->Init());
  pool->supervisor_ = std::thread([p = pool.get()] { p->Loop(); });
  std::unique_lock<std::mutex> lock(pool->mu_);
  pool->started_cv_.wait(lock, [&] { return pool->started_; });
  if (!pool->start_status_.ok()) {
    Status st = pool->start_status_;
    lock.unlock();
    pool->supervisor_.join();
    return st;
  }
  return pool;
}

Status WorkerPool::Init() {
  const WorkerPoolOptions& o = options_;
  if (o.processes == 0 || o.processes > 1024)
    return InvalidArgumentError("workers.processes must be 1..1024");
  if (o.threads_per_process == 0 || o.threads_per_process > kMaxCpusPerWorker) {
    return InvalidArgumentError("workers.threads_per_process must be 1.." +
                                std::to_string(kMaxCpusPerWorker));
  }
  if (o.max_outstanding == 0) return InvalidArgumentError("workers.max_outstanding must be > 0");
  if (::access(o.worker_binary.c_str(), X_OK) != 0) {
    return ErrnoError(errno, "worker binary '" + o.worker_binary + "' is not executable");
  }
  ASSIGN_OR_RETURN(const KernelChoice kernel, ResolveKernelPath(o.kernel_path));
  path_ = kernel.path;
  kernel_reason_ = kernel.reason;
  OFFLOADD_LOG(kInfo, "workers") << "CPU AdamW kernel: " << kernel.Describe();
  CpuPlan plan;
  std::vector<int> node_ids;
  if (o.pin_threads) {
    const std::vector<int> allowed = o.cpus.empty() ? AllowedCpus() : o.cpus;
    std::vector<std::vector<int>> nodes = NumaNodes(allowed);
    node_ids = NumaNodeIds(allowed);
    plan = PlanWorkerCpus(o.processes, o.threads_per_process, nodes);
    oversubscribed_ = plan.oversubscribed;
    if (plan.oversubscribed) {
      OFFLOADD_LOG(kWarning, "workers") << o.processes << " x " << o.threads_per_process
                                        << " worker threads share fewer cores; expect contention";
    }
  }
  ASSIGN_OR_RETURN(ipc::UniqueFd wake, ipc::MakeEventFd());
  wake_fd_ = wake.release();
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return ErrnoError(errno, "epoll_create1");
  epoll_event ev{EPOLLIN, {.u64 = EventKey(0, kWake)}};
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);

  for (uint32_t i = 0; i < o.processes; ++i) {
    auto w = std::make_unique<Worker>();
    w->index = i;
    if (o.pin_threads) {
      w->cpus = plan.cpus[i];
      if (!node_ids.empty()) w->numa_node = node_ids[plan.node[i]];
    }
    // Rings and redo slots survive a pool restart in the same arena: reuse them if present.
    StatusOr<ipc::RingQueue<ipc::CommandRecord>> cmd = Status(StatusCode::kUnknown, "unset");
    auto region = arena_->Find(CommandQueueName(i));
    if (region.ok()) {
      ASSIGN_OR_RETURN(cmd, ipc::RingQueue<ipc::CommandRecord>::Format(
                                arena_->At<void>(region->offset), region->size, o.queue_capacity));
    } else {
      ASSIGN_OR_RETURN(cmd, ipc::RingQueue<ipc::CommandRecord>::Create(arena_, CommandQueueName(i),
                                                                       o.queue_capacity));
    }
    StatusOr<ipc::RingQueue<WorkerCompletion>> cpl = Status(StatusCode::kUnknown, "unset");
    region = arena_->Find(CompletionQueueName(i));
    if (region.ok()) {
      cpl = ipc::RingQueue<WorkerCompletion>::Format(arena_->At<void>(region->offset), region->size,
                                                     o.queue_capacity);
    } else {
      cpl = ipc::RingQueue<WorkerCompletion>::Create(arena_, CompletionQueueName(i),
                                                     o.queue_capacity);
    }
    if (!cpl.ok()) return cpl.status();
    region = arena_->Find(UndoRegionName(i));
    if (region.ok()) {
      // A previous pool's worker may have died mid-commit: finish those commits now, whatever
      // thread count that pool had.
      ASSIGN_OR_RETURN(uint32_t done, RecoverUndoSlots(*arena_, region->offset,
                                                       region->size / UndoRegionBytes(1)));
      if (done > 0) {
        OFFLOADD_LOG(kInfo, "workers") << "completed " << done << " chunk commit(s) left by a "
                                       << "previous pool's worker " << i;
      }
      if (region->size < UndoRegionBytes(o.threads_per_process)) {
        return FailedPreconditionError(
            "this arena was set up for workers with fewer threads than " +
            std::to_string(o.threads_per_process) + "; format a new arena for the new pool");
      }
    } else {
      ASSIGN_OR_RETURN(region, arena_->Allocate(UndoRegionName(i), ipc::RegionKind::kControl,
                                                UndoRegionBytes(o.threads_per_process)));
    }
    w->undo_offset = region->offset;
    ASSIGN_OR_RETURN(w->cmd_ready, ipc::MakeEventFd());
    ASSIGN_OR_RETURN(w->cmd_space, ipc::MakeEventFd());
    ASSIGN_OR_RETURN(w->cpl_ready, ipc::MakeEventFd());
    ASSIGN_OR_RETURN(w->cpl_space, ipc::MakeEventFd());
    w->commands = ipc::Channel<ipc::CommandRecord>(*cmd, w->cmd_ready.get(), w->cmd_space.get());
    w->completions = ipc::Channel<WorkerCompletion>(*cpl, w->cpl_ready.get(), w->cpl_space.get());
    epoll_event cev{EPOLLIN, {.u64 = EventKey(i, kCompletionReady)}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w->cpl_ready.get(), &cev);
    epoll_event sev{EPOLLIN, {.u64 = EventKey(i, kCommandSpace)}};
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, w->cmd_space.get(), &sev);
    workers_.push_back(std::move(w));
  }
  return OkStatus();
}

WorkerPool::~WorkerPool() {
  (void)Shutdown();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void WorkerPool::WatchDeathFd(Worker* w, bool add) {
  epoll_event ev{EPOLLIN | EPOLLHUP | EPOLLRDHUP, {.u64 = EventKey(w->index, kDeath)}};
  ::epoll_ctl(epoll_fd_, add ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, w->death_fd, &ev);
}

Status WorkerPool::Spawn(Worker* w) {
  // The shared launcher: fd 3 the control socket, other fds closed, parent-death signal, pidfd.
  ASSIGN_OR_RETURN(ipc::ChildProcess child, ipc::LaunchChild(options_.worker_binary, {}));
  const pid_t parent = ::getpid();
  const pid_t pid = child.pid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    w->pid = pid;
  }
  w->control = std::move(child.control);
  w->pidfd = std::move(child.pidfd);
  w->death_fd = w->pidfd.valid() ? w->pidfd.get() : w->control.get();

  WorkerHello hello{};
  hello.magic = kHelloMagic;
  hello.version = kHelloVersion;
  hello.worker = w->index;
  hello.threads = options_.threads_per_process;
  hello.kernel_path = static_cast<uint32_t>(path_);
  hello.crash_consistent = options_.crash_consistent;
  hello.incarnation = w->incarnation;
  if (w->index == options_.crash_worker) {
    hello.crash_point = static_cast<uint32_t>(options_.crash_point);
    hello.crash_after_chunks = options_.crash_after_chunks;
  }
  hello.parent_pid = parent;
  hello.num_cpus = static_cast<uint32_t>(w->cpus.size());
  for (size_t i = 0; i < w->cpus.size(); ++i) hello.cpus[i] = static_cast<uint16_t>(w->cpus[i]);
  const int fds[] = {segment_->fd(), w->cmd_ready.get(), w->cmd_space.get(), w->cpl_ready.get(),
                     w->cpl_space.get()};
  Status st = ipc::SendFds(
      w->control.get(), fds,
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&hello), sizeof(hello)));
  if (st.ok()) {
    pollfd pfd{w->control.get(), POLLIN, 0};
    const int rc = ::poll(&pfd, 1, options_.start_timeout_ms);
    if (rc == 0)
      st = Status(StatusCode::kDeadlineExceeded, "offloadd-worker did not attach in time");
  }
  StatusOr<ipc::ReceivedFds> reply = st.ok()
                                         ? ipc::RecvFds(w->control.get(), 0, sizeof(WorkerReady))
                                         : StatusOr<ipc::ReceivedFds>(st);
  if (reply.ok() && reply->payload.size() == sizeof(WorkerReady)) {
    WorkerReady ready;
    std::memcpy(&ready, reply->payload.data(), sizeof(ready));
    ready.message[sizeof(ready.message) - 1] = 0;
    if (ready.status_code == 0) {
      WatchDeathFd(w, true);
      OFFLOADD_LOG(kInfo, "workers")
          << "worker " << w->index << " pid " << pid << " started"
          << (ready.recovered_chunks ? ", completed " + std::to_string(ready.recovered_chunks) +
                                           " interrupted chunk commit(s)"
                                     : std::string());
      return OkStatus();
    }
    st = Status(static_cast<StatusCode>(ready.status_code), ready.message);
  } else if (st.ok()) {
    st = UnavailableError("worker closed its control socket during startup");
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    w->pid = -1;
  }
  return st.WithContext("starting offloadd-worker " + std::to_string(w->index) + " (" + options_.worker_binary + " " +
                        DescribeExit(status) + ")");
}

Status WorkerPool::Submit(const ipc::CommandRecord& command, int worker) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) return UnavailableError("worker pool is shutting down");
  if (worker >= static_cast<int>(workers_.size())) {
    return InvalidArgumentError("worker " + std::to_string(worker) + " does not exist (pool has " +
                                std::to_string(workers_.size()) + ")");
  }
  const auto outstanding = [](const Worker& w) { return w.pending.size() + w.in_flight.size(); };
  Worker* w = nullptr;
  if (worker >= 0) {
    w = workers_[worker].get();
  } else {
    for (auto& cand : workers_) {
      if (!cand->failed && (w == nullptr || outstanding(*cand) < outstanding(*w))) w = cand.get();
    }
  }
  if (w == nullptr || w->failed)
    return UnavailableError("worker was abandoned after repeated crashes");
  space_cv_.wait(
      lock, [&] { return stopping_ || w->failed || outstanding(*w) < options_.max_outstanding; });
  if (stopping_ || w->failed) return UnavailableError("worker pool is shutting down");
  w->pending.push_back({command, Clock::now()});
  ipc::SignalEventFd(wake_fd_);
  return OkStatus();
}

StatusOr<WorkerCompletion> WorkerPool::WaitCompletion(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [&] { return !completions_.empty() || stopped_; };
  if (timeout_ms < 0) {
    completion_cv_.wait(lock, ready);
  } else if (!completion_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
    return Status(StatusCode::kDeadlineExceeded,
                  "no completion within " + std::to_string(timeout_ms) + " ms");
  }
  if (completions_.empty()) return UnavailableError("worker pool stopped");
  WorkerCompletion c = completions_.front();
  completions_.pop_front();
  return c;
}

bool WorkerPool::TryGetCompletion(WorkerCompletion* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (completions_.empty()) return false;
  *out = completions_.front();
  completions_.pop_front();
  return true;
}

void WorkerPool::CompleteLocked(Worker* w, const WorkerCompletion& c) {
  auto it = std::find_if(w->in_flight.begin(), w->in_flight.end(),
                         [&](const Pending& p) { return p.command.id == c.id; });
  if (it != w->in_flight.end()) {
    const double latency = std::chrono::duration<double>(Clock::now() - it->submitted).count();
    size_t b = 0;
    while (b < std::size(kLatencyBounds) && latency > kLatencyBounds[b]) ++b;
    ++latency_counts_[b];
    latency_sum_ += latency;
    w->in_flight.erase(it);
  }
  w->crashes_without_progress = 0;
  w->progress_at = Clock::now();
  ++w->commands_total;
  w->busy_seconds += static_cast<double>(c.busy_ns) * 1e-9;
  if (c.status_code == 0 && c.kind == static_cast<uint32_t>(CommandKind::kAdamW))
    w->params_total += c.elements;
  if (c.status_code != 0) ++failed_total_;
  completions_.push_back(c);
  completion_cv_.notify_all();
  space_cv_.notify_all();
}

void WorkerPool::PumpLocked() {
  for (auto& wp : workers_) {
    Worker* w = wp.get();
    if (w->failed || w->pid < 0) continue;
    WorkerCompletion c;
    while (w->completions.TryPop(&c)) CompleteLocked(w, c);
    while (!w->pending.empty() && w->commands.TryPush(w->pending.front().command)) {
      if (w->in_flight.empty()) w->progress_at = Clock::now();
      w->in_flight.push_back(w->pending.front());
      w->pending.pop_front();
    }
  }
}

void WorkerPool::AbandonLocked(Worker* w, const Status& why) {
  w->failed = true;
  OFFLOADD_LOG(kError, "workers") << "abandoning worker " << w->index << ": " << why.ToString();
  if (options_.crash_consistent) {
    auto restored = RecoverUndoSlots(*arena_, w->undo_offset, options_.threads_per_process);
    if (!restored.ok()) {
      OFFLOADD_LOG(kError, "workers") << restored.status().ToString();
    }
  }
  for (auto* list : {&w->in_flight, &w->pending}) {
    for (const Pending& p : *list) {
      WorkerCompletion c{};
      c.id = p.command.id;
      c.kind = p.command.kind;
      c.worker = w->index;
      c.status_code = static_cast<int32_t>(StatusCode::kUnavailable);
      std::snprintf(c.message, sizeof(c.message), "offloadd-worker %u abandoned (%s): %s", w->index,
                    CommandName(p.command.kind), why.message().c_str());
      ++failed_total_;
      completions_.push_back(c);
    }
    list->clear();
  }
  completion_cv_.notify_all();
  space_cv_.notify_all();
}

void WorkerPool::HandleDeath(Worker* w) {
  int status = 0;
  ::waitpid(w->pid, &status, 0);
  WatchDeathFd(w, false);
  w->pidfd.reset();
  w->control.reset();
  std::unique_lock<std::mutex> lock(mu_);  // pid is read by Pids()/Metrics()
  const pid_t old_pid = w->pid;
  w->pid = -1;
  const bool watchdog = w->watchdog_killed;
  w->watchdog_killed = false;
  // Completions it published before dying are real; everything else it had is replayed.
  WorkerCompletion c;
  while (w->completions.TryPop(&c)) CompleteLocked(w, c);
  w->commands.queue().ResetAfterPeerDeath();
  w->completions.queue().ResetAfterPeerDeath();
  bool had_shutdown = false;
  for (auto* list : {&w->in_flight, &w->pending}) {
    const auto is_bye = [](const Pending& p) {
      return p.command.kind == static_cast<uint32_t>(CommandKind::kShutdown);
    };
    had_shutdown = had_shutdown || std::any_of(list->begin(), list->end(), is_bye);
    list->erase(std::remove_if(list->begin(), list->end(), is_bye), list->end());
  }
  if (stopping_ && w->in_flight.empty() && w->pending.empty()) {
    w->exited = true;
    return;
  }
  if (force_stop_) {
    AbandonLocked(w, CancelledError("shutdown timed out; outstanding commands cancelled"));
    w->exited = true;
    return;
  }
  OFFLOADD_LOG(kWarning, "workers")
      << "worker " << w->index << " (pid " << old_pid << ") "
      << (watchdog ? "killed by the liveness watchdog" : DescribeExit(status)) << "; replaying "
      << w->in_flight.size() << " command(s)";
  replayed_total_ += w->in_flight.size();
  while (!w->in_flight.empty()) {
    w->pending.push_front(w->in_flight.back());
    w->in_flight.pop_back();
  }
  if (had_shutdown) {  // it died during a graceful shutdown: finish its work, then stop again
    ipc::CommandRecord bye{};
    bye.kind = static_cast<uint32_t>(CommandKind::kShutdown);
    w->pending.push_back({bye, Clock::now()});
  }
  // A restart that dies or is refused during its startup is one more crash without progress.
  Status why;
  while (true) {
    ++restarts_total_;
    ++w->incarnation;
    if (++w->crashes_without_progress > options_.max_restarts) {
      std::string msg = "crashed " + std::to_string(w->crashes_without_progress) +
                        " times in a row without completing a command";
      if (watchdog) msg += " (the last one killed by the liveness watchdog: no command completed in time)";
      if (!why.ok()) msg += " (last restart: " + why.message() + ")";
      AbandonLocked(w, UnavailableError(msg));
      w->exited = true;
      return;
    }
    lock.unlock();
    why = Spawn(w);
    lock.lock();
    if (why.ok()) return;
    OFFLOADD_LOG(kWarning, "workers") << "restart of worker " << w->index << " failed: " << why.ToString();
  }
}

void WorkerPool::Loop() {
  Status st;
  for (auto& w : workers_) {
    st = Spawn(w.get());
    if (!st.ok()) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    start_status_ = st;
    if (!st.ok()) stopping_ = stopped_ = true;
  }
  started_cv_.notify_all();
  if (!st.ok()) {
    for (auto& w : workers_) {
      if (w->pid > 0) {
        ::kill(w->pid, SIGKILL);
        ::waitpid(w->pid, nullptr, 0);
      }
    }
    return;
  }
  bool shutdown_sent = false;
  Clock::time_point kill_deadline{};
  // Liveness (ipc/liveness.h): kills the workers whose oldest command is past its deadline (their
  // deaths then take the crash path: restart, replay); returns the next deadline. Caller holds mu_.
  const auto enforce_deadlines = [this]() -> Clock::time_point {
    Clock::time_point next = Clock::time_point::max();
    const ipc::LivenessPolicy policy = ipc::WorkerLivenessPolicy();
    if (policy.floor_seconds <= 0 || force_stop_) return next;
    const Clock::time_point now = Clock::now();
    for (auto& wp : workers_) {
      Worker* w = wp.get();
      if (w->failed || w->pid < 0 || w->in_flight.empty() || w->watchdog_killed) continue;
      const Pending& oldest = w->in_flight.front();
      const uint64_t elements = CommandElements(oldest.command);
      const double limit = policy.DeadlineSeconds(static_cast<double>(elements));
      const Clock::time_point deadline =
          w->progress_at + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
      if (now < deadline) {
        next = std::min(next, deadline);
        continue;
      }
      // Stopped (SIGSTOP), wedged in the kernel (D state) or deadlocked: nothing shows on its pidfd.
      ipc::CountWatchdogKill("worker");
      w->watchdog_killed = true;
      OFFLOADD_LOG(kError, "workers") << "liveness: worker " << w->index << " (pid " << w->pid
                                      << ") completed nothing for " << limit << " s while running a "
                                      << CommandName(oldest.command.kind) << " of " << elements << " elements ("
                                      << w->in_flight.size() << " command(s) in flight; deadline max(floor "
                                      << policy.floor_seconds << " s, " << policy.factor
                                      << " x expected)); killing it";
      ::kill(w->pid, SIGKILL);  // seen through its pidfd like any death
    }
    return next;
  };
  for (;;) {
    bool sleep = true;
    Clock::time_point liveness_deadline = Clock::time_point::max();
    {
      std::lock_guard<std::mutex> lock(mu_);
      PumpLocked();
      bool all_exited = true;
      for (auto& w : workers_) all_exited = all_exited && (w->exited || w->failed);
      if (all_exited) break;
      if (stopping_ && !shutdown_sent) {
        ipc::CommandRecord bye{};
        bye.kind = static_cast<uint32_t>(CommandKind::kShutdown);
        for (auto& w : workers_) {
          if (!w->failed) w->pending.push_back({bye, Clock::now()});
        }
        shutdown_sent = true;
        kill_deadline = Clock::now() + std::chrono::milliseconds(options_.shutdown_timeout_ms);
        continue;
      }
      for (auto& w : workers_) {
        if (w->failed || w->pid < 0) continue;
        if (!w->completions.ArmConsumerWait()) sleep = false;
        if (!w->pending.empty() && !w->commands.ArmProducerWait()) sleep = false;
      }
      liveness_deadline = enforce_deadlines();
    }
    epoll_event events[64];
    int timeout = -1;
    if (shutdown_sent) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(kill_deadline - Clock::now())
              .count();
      timeout = static_cast<int>(std::max<int64_t>(left, 0));
    }
    if (liveness_deadline != Clock::time_point::max()) {
      // Rounded up: waking a millisecond early would only loop once more.
      const int64_t left =
          std::chrono::duration_cast<std::chrono::milliseconds>(liveness_deadline - Clock::now()).count() + 1;
      const int ms = static_cast<int>(std::clamp<int64_t>(left, 0, 24 * 3600 * 1000));
      timeout = timeout < 0 ? ms : std::min(timeout, ms);
    }
    const int n = sleep ? ::epoll_wait(epoll_fd_, events, 64, timeout) : 0;
    if (sleep && n == 0 && shutdown_sent && Clock::now() >= kill_deadline) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        force_stop_ = true;
      }
      OFFLOADD_LOG(kWarning, "workers")
          << "workers did not stop within " << options_.shutdown_timeout_ms << " ms; killing them";
      for (auto& w : workers_) {
        if (w->pid > 0) ::kill(w->pid, SIGKILL);  // did not exit in time; reaped via its pidfd
      }
      kill_deadline = Clock::now() + std::chrono::hours(1);
    }
    for (int i = 0; i < n; ++i) {
      const uint32_t index = static_cast<uint32_t>(events[i].data.u64 >> 8);
      if ((events[i].data.u64 & 0xff) == kDeath && index < workers_.size() &&
          workers_[index]->pid > 0) {
        HandleDeath(workers_[index].get());
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    ipc::DrainEventFd(wake_fd_);
    for (auto& w : workers_) {
      w->completions.DisarmConsumerWait();
      w->commands.DisarmProducerWait();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  completion_cv_.notify_all();
  space_cv_.notify_all();
}

Status WorkerPool::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  space_cv_.notify_all();
  if (wake_fd_ >= 0) ipc::SignalEventFd(wake_fd_);
  if (supervisor_.joinable()) supervisor_.join();
  return OkStatus();
}

WorkerPoolMetrics WorkerPool::Metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerPoolMetrics m;
  for (const auto& w : workers_) {
    WorkerPoolMetrics::Worker x;
    x.pid = w->pid;
    x.restarts = w->incarnation;
    x.failed = w->failed;
    x.commands_total = w->commands_total;
    x.params_updated_total = w->params_total;
    x.busy_seconds_total = w->busy_seconds;
    x.queue_depth = static_cast<uint32_t>(w->pending.size() + w->in_flight.size());
    x.cpus = w->cpus;
    x.numa_node = w->numa_node;
    m.workers.push_back(std::move(x));
  }
  m.restarts_total = restarts_total_;
  m.replayed_commands_total = replayed_total_;
  m.failed_commands_total = failed_total_;
  m.latency_bounds_seconds.assign(std::begin(kLatencyBounds), std::end(kLatencyBounds));
  m.latency_counts = latency_counts_;
  m.latency_sum_seconds = latency_sum_;
  m.kernel_path = std::string(KernelPathName(path_));
  m.kernel_reason = kernel_reason_;
  m.cpus_oversubscribed = oversubscribed_;
  return m;
}

int WorkerPool::NumaNodeOf(uint32_t worker) const {
  return worker < workers_.size() ? workers_[worker]->numa_node : -1;
}

int WorkerPool::NumaNodesUsed() const {
  std::vector<int> nodes;
  for (const auto& w : workers_) {
    if (w->numa_node >= 0 && std::find(nodes.begin(), nodes.end(), w->numa_node) == nodes.end()) {
      nodes.push_back(w->numa_node);
    }
  }
  return std::max<int>(1, static_cast<int>(nodes.size()));
}

std::vector<pid_t> WorkerPool::Pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<pid_t> out;
  for (const auto& w : workers_) out.push_back(w->pid);
  return out;
}

}  // namespace offloadd::workers
