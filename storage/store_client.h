#pragma once
// StoreProcess: the daemon's handle on one offloadd-store child process (see store_protocol.h).
// Launch() creates the command and completion rings in the caller's arena, starts the binary,
// performs the handshake and returns once the store has opened its directories (or returns the
// error it reported). Submit()/NextCompletion() are thin wrappers over the ipc channels; both
// return UNAVAILABLE as soon as the store process is gone (watched through a pidfd), never hang.
//
// Thread-safety: Submit() from one thread at a time, NextCompletion() from one thread at a time
// (the rings are single-producer/single-consumer). Ownership: owns the child process, the
// eventfds and the socket; borrows the segment and arena, which must outlive it. Destruction
// closes the control socket (the store finishes in-flight work and exits), kills the child if it
// has not exited within 10 s, and reaps it.
//
// Liveness (ipc/liveness.h): Submit and NextCompletion with commands in flight wait at
// most the process's StoreLivenessPolicy deadline of their bytes without a completion; a store
// that misses it (stopped, wedged in the kernel) is SIGKILLed and the call returns UNAVAILABLE
// naming the store, the wait and kStoreDiedSign, which the daemon restarts the job after (as
// after the store's death).

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "ipc/arena.h"
#include "ipc/ring_queue.h"
#include "ipc/shm_segment.h"
#include "ipc/unique_fd.h"
#include "storage/store_protocol.h"

namespace offloadd::storage {

// "offloadd-store (pid N) died" / "... killed by the liveness watchdog": the words every error
// about a lost store process carries (daemon::IsRestartableFailure looks for them).
inline constexpr const char* kStoreDiedSign = "offloadd-store (pid ";

struct StoreProcessOptions {
  std::string binary;             // path of offloadd-store
  std::vector<std::string> args;  // e.g. {"--dir=/nvme0/store", "--queue-depth=32"}
  uint32_t queue_capacity = 256;  // records per ring (power of two)
  int ready_timeout_ms = 120000;  // opening a big store replays its manifest
};

struct Completion {
  uint64_t id = 0;
  StoreCompletion body;
  Status status() const {
    return body.code == 0 ? OkStatus()
                          : Status(static_cast<StatusCode>(body.code), std::string(body.text()));
  }
};

// The store as its client sees it: commands submitted and completed, completions that carried an
// error, commands in flight, and submit-to-completion latency (the daemon exports these per job;
// the store's own offloadd_store_* metrics are per process, on its --metrics-listen).
struct StoreClientStats {
  uint64_t submitted = 0, completed = 0, errors = 0;
  uint32_t in_flight = 0;
  uint64_t watchdog_kills = 0;  // 1 once the liveness watchdog killed the store
  // counts[i]: completions with latency <= bounds[i] and > bounds[i-1]; counts.back(): +Inf.
  std::vector<double> latency_bounds_seconds;
  std::vector<uint64_t> latency_counts;
  double latency_sum_seconds = 0;
};

class StoreProcess {
 public:
  static StatusOr<std::unique_ptr<StoreProcess>> Launch(const ipc::SharedSegment& segment,
                                                        ipc::Arena* arena,
                                                        const StoreProcessOptions& options);
  ~StoreProcess();

  // Pushes one command (blocks while the ring is full).
  Status Submit(StoreOp op, uint64_t id, const StoreCommand& command, int timeout_ms = -1);
  // Pops one completion; DEADLINE_EXCEEDED after timeout_ms (-1: wait until one comes or the
  // store dies).
  StatusOr<Completion> NextCompletion(int timeout_ms = -1);

  // kShutdown, wait for its completion (completions of earlier commands that arrive first are
  // discarded: collect them before) and for the process to exit 0. A store that does not answer
  // or exit within timeout_ms (per wait) is killed and reaped, and the error says so.
  Status Shutdown(int timeout_ms = 60000);
  pid_t pid() const { return pid_; }
  const std::string& engine() const { return engine_; }
  int metrics_port() const { return metrics_port_; }
  // Thread-safe snapshot.
  StoreClientStats Stats() const;
  // Waits for the child to exit after it was killed; returns its wait status (again on later
  // calls).
  int Reap();

 private:
  StoreProcess() = default;
  // `st` from a ring wait: when the store is gone, an UNAVAILABLE error saying how it ended.
  Status PeerError(Status st, const char* what);
  // A ring wait (`wait(ms)`: DEADLINE_EXCEEDED after ms, -1 forever) bounded by timeout_ms and
  // by the liveness deadline of the commands in flight; past the latter the store is killed.
  Status WaitWithDeadline(const std::function<Status(int)>& wait, int timeout_ms, const char* what);
  pid_t pid_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
  ipc::UniqueFd pidfd_, control_;
  ipc::UniqueFd cmd_ready_, cmd_space_, done_ready_, done_space_;
  ipc::Channel<ipc::CommandRecord> commands_, completions_;
  std::string engine_;
  int metrics_port_ = 0;
  mutable std::mutex stats_mu_;
  StoreClientStats stats_;  // guarded by stats_mu_
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> submitted_at_;  // by id
  // Liveness: bytes in flight by id, and when the wait for them started (the last completion, or
  // the submit that found nothing in flight). Guarded by stats_mu_.
  std::unordered_map<uint64_t, uint64_t> in_flight_bytes_;
  std::chrono::steady_clock::time_point progress_at_{};
};

}  // namespace offloadd::storage
