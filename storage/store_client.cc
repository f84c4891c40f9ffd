#include "storage/store_client.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "common/logging.h"
#include "ipc/child_process.h"
#include "ipc/event_fd.h"
#include "ipc/fd_passing.h"
#include "ipc/liveness.h"

namespace offloadd::storage {
namespace {
std::atomic<uint32_t> g_generation{0};

// After the control socket closes the store finishes in-flight work and exits; one that does not
// within this bound (stopped, wedged in the kernel) is killed so that nobody waits on it forever.
constexpr int kExitTimeoutMs = 10000;

using ipc::DescribeExit;
}  // namespace

StatusOr<std::unique_ptr<StoreProcess>> StoreProcess::Launch(const ipc::SharedSegment& segment,
                                                             ipc::Arena* arena,
                                                             const StoreProcessOptions& options) {
  std::unique_ptr<StoreProcess> p(new StoreProcess);
  // Fresh ring names per launch: a restarted store never sees records of a dead one.
  const std::string tag =
      "store." + std::to_string(::getpid()) + "." + std::to_string(g_generation++);
  ASSIGN_OR_RETURN(auto cmd_q, ipc::RingQueue<ipc::CommandRecord>::Create(arena, tag + ".cmd",
                                                                          options.queue_capacity));
  ASSIGN_OR_RETURN(auto done_q, ipc::RingQueue<ipc::CommandRecord>::Create(arena, tag + ".done",
                                                                           options.queue_capacity));
  ASSIGN_OR_RETURN(p->cmd_ready_, ipc::MakeEventFd());
  ASSIGN_OR_RETURN(p->cmd_space_, ipc::MakeEventFd());
  ASSIGN_OR_RETURN(p->done_ready_, ipc::MakeEventFd());
  ASSIGN_OR_RETURN(p->done_space_, ipc::MakeEventFd());
  // The shared launcher: fd 3 the control socket, other fds closed, parent-death signal, pidfd.
  ASSIGN_OR_RETURN(ipc::ChildProcess child, ipc::LaunchChild(options.binary, options.args));
  p->pid_ = child.pid;
  p->control_ = std::move(child.control);
  if (!child.pidfd.valid()) {  // every wait on the store is tied to its pidfd
    ::kill(p->pid_, SIGKILL);
    p->Reap();
    return UnavailableError("pidfd_open of offloadd-store failed: offloadd needs Linux 5.3 or newer");
  }
  p->pidfd_ = std::move(child.pidfd);

  StoreHello hello;
  CopyName(hello.command_queue, tag + ".cmd");
  CopyName(hello.completion_queue, tag + ".done");
  const int fds[] = {segment.fd(), p->cmd_ready_.get(), p->cmd_space_.get(), p->done_ready_.get(),
                     p->done_space_.get()};
  auto exited_early = [&] {
    const int status = p->Reap();
    return UnavailableError(options.binary + " exited before it was ready (wait status " +
                            std::to_string(status) +
                            "; exit code 127 means it could not be executed)");
  };
  Status sent = ipc::SendFds(p->control_.get(), fds,
                             {reinterpret_cast<const uint8_t*>(&hello), sizeof hello});
  if (!sent.ok()) {
    // EPIPE/ECONNRESET: the child is already gone (e.g. exec failed).
    // (The socket closes as the child exits, a moment before its pidfd turns readable.)
    if (ipc::WaitReadable(p->pidfd_.get(), -1, 5000).ok()) return exited_early();
    return sent.WithContext("sending the hello to offloadd-store");
  }
  Status waited = ipc::WaitReadable(p->control_.get(), p->pidfd_.get(), options.ready_timeout_ms);
  // A store that fails to open answers and exits at once: read its answer even if the exit was
  // noticed first.
  if (waited.code() == StatusCode::kUnavailable &&
      ipc::WaitReadable(p->control_.get(), -1, 0).ok()) {
    waited = OkStatus();
  }
  if (!waited.ok()) {
    // A socket error (POLLERR: the child died with our hello unread) or the pidfd firing.
    if (ipc::WaitReadable(p->pidfd_.get(), -1, 5000).ok()) return exited_early();
    return waited.WithContext("waiting for offloadd-store to open its directories");
  }
  ASSIGN_OR_RETURN(ipc::ReceivedFds got, ipc::RecvFds(p->control_.get(), 0, sizeof(StoreReady)));
  StoreReady ready;
  if (got.payload.size() != sizeof ready)
    return InternalError("offloadd-store sent a malformed ready message");
  std::memcpy(&ready, got.payload.data(), sizeof ready);
  if (ready.magic != kStoreReadyMagic || ready.version != kStoreProtocolVersion) {
    return FailedPreconditionError("offloadd-store speaks another protocol version (" +
                                   std::to_string(ready.version) + ")");
  }
  if (ready.code != 0) {
    return Status(static_cast<StatusCode>(ready.code),
                  "offloadd-store: " +
                      std::string(ready.message, strnlen(ready.message, sizeof ready.message)));
  }
  p->engine_ = std::string(ready.engine, strnlen(ready.engine, sizeof ready.engine));
  p->metrics_port_ = static_cast<int>(ready.metrics_port);
  p->commands_ = ipc::Channel<ipc::CommandRecord>(cmd_q, p->cmd_ready_.get(), p->cmd_space_.get());
  p->completions_ =
      ipc::Channel<ipc::CommandRecord>(done_q, p->done_ready_.get(), p->done_space_.get());
  return p;
}

StoreProcess::~StoreProcess() {
  control_.reset();  // the store sees the hang-up, finishes in-flight work and exits
  if (pid_ > 0 && !reaped_ && pidfd_.valid() &&
      !ipc::WaitReadable(pidfd_.get(), -1, kExitTimeoutMs).ok()) {
    OFFLOADD_LOG(kWarning, "storage") << "offloadd-store (pid " << pid_ << ") did not exit within "
                                      << kExitTimeoutMs << " ms of its hang-up; killing it";
    ::kill(pid_, SIGKILL);
  }
  Reap();
}

int StoreProcess::Reap() {
  if (pid_ <= 0 || reaped_) return wait_status_;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  wait_status_ = status;
  return status;
}

Status StoreProcess::PeerError(Status st, const char* what) {
  if (st.code() != StatusCode::kUnavailable || !pidfd_.valid() ||
      !ipc::WaitReadable(pidfd_.get(), -1, 0).ok()) {
    return st.WithContext(what);
  }
  // The pidfd fired: the store is gone. Say how, once reaped (it is a zombie by now).
  return UnavailableError(std::string(kStoreDiedSign) + std::to_string(pid_) + ") died: " +
                          DescribeExit(Reap()) + " (" + what + ")");
}

Status StoreProcess::Submit(StoreOp op, uint64_t id, const StoreCommand& command, int timeout_ms) {
  ipc::CommandRecord r{};
  r.kind = static_cast<uint32_t>(op);
  r.id = id;
  r.Pack(command);
  RETURN_IF_ERROR(WaitWithDeadline([&](int ms) { return commands_.Push(r, ms, pidfd_.get()); }, timeout_ms,
                                   "offloadd-store command ring"));
  if (op != StoreOp::kShutdown) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.submitted;
    if (stats_.in_flight++ == 0) progress_at_ = std::chrono::steady_clock::now();
    submitted_at_[id] = std::chrono::steady_clock::now();
    in_flight_bytes_[id] = command.bytes;
  }
  return OkStatus();
}

namespace {
// Submit-to-completion latency buckets: a 4 KiB read on NVMe to a 1 GiB write on a slow disk.
const std::vector<double>& LatencyBounds() {
  static const std::vector<double> kBounds = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
                                              0.05, 0.1,    0.25,   0.5,  1,      2.5,    5,    10};
  return kBounds;
}
}  // namespace

StoreClientStats StoreProcess::Stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  StoreClientStats s = stats_;
  s.latency_bounds_seconds = LatencyBounds();
  s.latency_counts.resize(LatencyBounds().size() + 1, 0);
  return s;
}

StatusOr<Completion> StoreProcess::NextCompletion(int timeout_ms) {
  ipc::CommandRecord r;
  RETURN_IF_ERROR(WaitWithDeadline([&](int ms) { return completions_.Pop(&r, ms, pidfd_.get()); }, timeout_ms,
                                   "offloadd-store completion ring"));
  Completion c;
  c.id = r.id;
  c.body = r.Unpack<StoreCompletion>();
  std::lock_guard<std::mutex> lock(stats_mu_);
  auto it = submitted_at_.find(c.id);
  if (it != submitted_at_.end() && c.body.op != static_cast<uint32_t>(StoreOp::kShutdown)) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second).count();
    submitted_at_.erase(it);
    const std::vector<double>& bounds = LatencyBounds();
    stats_.latency_counts.resize(bounds.size() + 1, 0);
    ++stats_.latency_counts[std::lower_bound(bounds.begin(), bounds.end(), secs) - bounds.begin()];
    stats_.latency_sum_seconds += secs;
    ++stats_.completed;
    if (stats_.in_flight > 0) --stats_.in_flight;
    in_flight_bytes_.erase(c.id);
    progress_at_ = std::chrono::steady_clock::now();
    if (c.body.code != 0) ++stats_.errors;
  }
  return c;
}

Status StoreProcess::WaitWithDeadline(const std::function<Status(int)>& wait, int timeout_ms, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto until =
      timeout_ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    double limit = 0;
    uint64_t bytes = 0;
    uint32_t in_flight = 0;
    Clock::time_point since;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      in_flight = stats_.in_flight;
      for (const auto& [id, b] : in_flight_bytes_) bytes += b;
      limit = in_flight > 0 ? ipc::StoreLivenessPolicy().DeadlineSeconds(static_cast<double>(bytes)) : 0;
      since = progress_at_;
    }
    const Clock::time_point deadline =
        limit > 0 ? since + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit))
                  : Clock::time_point::max();
    const Clock::time_point wake = std::min(until, deadline);
    int wait_ms = -1;
    if (wake != Clock::time_point::max()) {
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count() + 1, 0, INT32_MAX));
    }
    Status st = wait(wait_ms);
    if (st.ok()) return st;
    if (st.code() != StatusCode::kDeadlineExceeded) return PeerError(std::move(st), what);
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      // Stopped (SIGSTOP), wedged in the kernel or deadlocked: its pidfd never fires by itself.
      OFFLOADD_LOG(kError, "storage") << "liveness: offloadd-store (pid " << pid_ << ") completed nothing for "
                                      << limit << " s with " << in_flight << " command(s) (" << bytes
                                      << " bytes) in flight; killing it";
      ::kill(pid_, SIGKILL);
      const int status = Reap();
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_.watchdog_kills = 1;
      }
      ipc::CountWatchdogKill("store");
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", limit);
      return UnavailableError(std::string(kStoreDiedSign) + std::to_string(pid_) +
                              ") killed by the liveness watchdog: no I/O completed in " + secs + " s with " +
                              std::to_string(in_flight) + " command(s) (" + std::to_string(bytes) +
                              " bytes) in flight (" + what + "; " + DescribeExit(status) + ")");
    }
    if (now >= until) return st;
  }
}

Status StoreProcess::Shutdown(int timeout_ms) {
  Status st = [&]() -> Status {
    RETURN_IF_ERROR(Submit(StoreOp::kShutdown, 0, {}, timeout_ms));
    for (;;) {
      ASSIGN_OR_RETURN(Completion c, NextCompletion(timeout_ms));
      if (c.body.op == static_cast<uint32_t>(StoreOp::kShutdown)) break;
    }
    if (pidfd_.valid() && !ipc::WaitReadable(pidfd_.get(), -1, timeout_ms).ok()) {
      return Status(StatusCode::kDeadlineExceeded,
                    "offloadd-store answered its shutdown but did not exit within " +
                        std::to_string(timeout_ms) + " ms");
    }
    return OkStatus();
  }();
  if (!st.ok()) {
    // Dead (reaped already), wedged or stopped: in the last two cases it is killed, not waited on.
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      Reap();
      return st.WithContext("offloadd-store shutdown (killed it)");
    }
    return st.WithContext("offloadd-store shutdown");
  }
  const int status = Reap();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError("offloadd-store " + DescribeExit(status) + " after its shutdown");
  }
  return OkStatus();
}

}  // namespace offloadd::storage
