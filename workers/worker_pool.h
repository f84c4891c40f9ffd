#pragma once
// WorkerPool: the daemon-side owner of the offloadd-worker processes (N processes x T threads).
//
//   WorkerPoolOptions o{.worker_binary = ".../offloadd-worker", .processes = 2,
//   .threads_per_process = 8}; ASSIGN_OR_RETURN(std::unique_ptr<WorkerPool> pool,
//   WorkerPool::Start(&segment, &arena, o)); ipc::CommandRecord c{};  c.kind = kAdamW; c.id = ...;
//   c.Pack(AdamWCommand{...}); RETURN_IF_ERROR(pool->Submit(c, /*worker=*/layer % 2));   // or -1:
//   least loaded ASSIGN_OR_RETURN(WorkerCompletion done, pool->WaitCompletion());
//
// A supervisor thread owns the processes: it fork+execs them (PR_SET_PDEATHSIG=SIGKILL, so they
// die with the daemon; all forks happen on that one long-lived thread because the death signal
// follows the forking *thread*), hands each its segment and eventfds over a Unix socket
// (SCM_RIGHTS), moves commands from per-worker pending lists into the command rings, drains the
// completion rings, and sleeps in epoll on eventfds and pidfds (no polling). A worker that dies
// is seen at once through its pidfd; the supervisor reaps it, collects the completions it did
// publish, restarts it (the new process completes any chunk commit interrupted half-way)
// and replays its outstanding commands in order. Per-chunk step counters make the replay
// idempotent, so the final state is identical to a run without the crash. A worker that crashes
// more than max_restarts times in a row without completing a command (a crash loop, e.g. a command
// that kills it on every replay) is abandoned: its interrupted chunk commits are completed here and its commands complete
// UNAVAILABLE.
//
// Thread-safety: Submit/WaitCompletion/TryGetCompletion/Metrics/Shutdown may be called from any
// threads. The segment and arena must outlive the pool.

#include <sys/types.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "ipc/arena.h"
#include "ipc/ring_queue.h"
#include "ipc/shm_segment.h"
#include "workers/protocol.h"

namespace offloadd::workers {

struct WorkerPoolOptions {
  std::string worker_binary;  // path of offloadd-worker
  uint32_t processes = 1;
  uint32_t threads_per_process = 1;
  std::vector<int> cpus;  // cores to use; empty: this process's affinity mask, split by NUMA node
  bool pin_threads = true;
  // auto | avx512bf16 | avx512 | avx2 | portable; "auto" defers to OFFLOADD_ADAMW_KERNEL, then
  // the fastest path (workers::ResolveKernelPath).
  std::string kernel_path = "auto";
  uint32_t queue_capacity = 64;      // records per ring (power of two)
  uint32_t max_outstanding = 1024;   // per worker; Submit blocks beyond it (back-pressure)
  bool crash_consistent = true;      // redo slots: exact results across a worker crash
  uint32_t max_restarts = 3;         // per worker: consecutive crashes with no completion between
  int start_timeout_ms = 10000;      // a worker must attach within this
  int shutdown_timeout_ms = 10000;   // then it is SIGKILLed
  // Test seam: the first incarnation of worker `crash_worker` kills itself (protocol.h).
  CrashPoint crash_point = CrashPoint::kNone;
  uint64_t crash_after_chunks = 0;
  uint32_t crash_worker = 0;
};

// Counters and gauges for the daemon to export (offloadd_worker_* metrics).
struct WorkerPoolMetrics {
  struct Worker {
    pid_t pid = -1;
    uint32_t restarts = 0;
    bool failed = false;
    uint64_t commands_total = 0;        // completed, any status
    uint64_t params_updated_total = 0;  // elements of successful AdamW commands
    double busy_seconds_total = 0;      // time spent executing commands
    uint32_t queue_depth = 0;           // submitted, not yet completed
    std::vector<int> cpus;
    int numa_node = -1;
  };
  std::vector<Worker> workers;
  uint64_t restarts_total = 0;
  uint64_t replayed_commands_total = 0;
  uint64_t failed_commands_total = 0;
  // Submit-to-completion latency histogram: counts[i] is the number of commands with latency
  // <= bounds[i] and > bounds[i-1]; counts.back() is the +Inf bucket.
  std::vector<double> latency_bounds_seconds;
  std::vector<uint64_t> latency_counts;
  double latency_sum_seconds = 0;
  std::string kernel_path;
  std::string kernel_reason;  // why that path (KernelChoice::reason)
  bool cpus_oversubscribed = false;
};

class WorkerPool {
 public:
  static StatusOr<std::unique_ptr<WorkerPool>> Start(ipc::SharedSegment* segment, ipc::Arena* arena,
                                                     const WorkerPoolOptions& options);
  ~WorkerPool();  // Shutdown()
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues a command for `worker` (-1: the one with the fewest outstanding commands). Blocks while
  // that worker has max_outstanding commands outstanding. UNAVAILABLE after Shutdown or when the
  // worker was abandoned. Commands for one worker execute in submission order.
  Status Submit(const ipc::CommandRecord& command, int worker = -1);
  // Next completion (any worker), DEADLINE_EXCEEDED after timeout_ms (-1: wait forever).
  StatusOr<WorkerCompletion> WaitCompletion(int timeout_ms = -1);
  bool TryGetCompletion(WorkerCompletion* out);

  // Lets every worker finish what was submitted, then stops the processes (SIGKILL after
  // shutdown_timeout_ms). Idempotent.
  Status Shutdown();

  WorkerPoolMetrics Metrics() const;
  std::vector<pid_t> Pids() const;
  // The NUMA node id worker `worker`'s threads run on; -1 when threads are not pinned.
  int NumaNodeOf(uint32_t worker) const;
  // Number of distinct NUMA nodes the workers run on (1 on single-node machines).
  int NumaNodesUsed() const;
  uint32_t size() const { return static_cast<uint32_t>(workers_.size()); }

 private:
  struct Worker;
  struct Pending;
  WorkerPool(ipc::SharedSegment* segment, ipc::Arena* arena, WorkerPoolOptions options);
  Status Init();
  void Loop();
  Status Spawn(Worker* w);
  void PumpLocked();
  void CompleteLocked(Worker* w, const WorkerCompletion& c);
  void HandleDeath(Worker* w);
  void AbandonLocked(Worker* w, const Status& why);
  void WatchDeathFd(Worker* w, bool add);

  ipc::SharedSegment* segment_;
  ipc::Arena* arena_;
  WorkerPoolOptions options_;
  KernelPath path_{};
  std::string kernel_reason_;
  bool oversubscribed_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread supervisor_;

  mutable std::mutex mu_;
  std::condition_variable completion_cv_, space_cv_, started_cv_;
  std::deque<WorkerCompletion> completions_;
  bool started_ = false;
  Status start_status_;
  bool stopping_ = false;
  bool force_stop_ = false;  // shutdown timed out: workers were SIGKILLed, do not restart them
  bool stopped_ = false;
  uint64_t restarts_total_ = 0, replayed_total_ = 0, failed_total_ = 0;
  std::vector<uint64_t> latency_counts_;
  double latency_sum_ = 0;
};

}  // namespace offloadd::workers
