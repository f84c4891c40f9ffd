#include "storage/store_client.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "ipc/event_fd.h"
#include "ipc/fd_passing.h"

namespace offloadd::storage {
namespace {
std::atomic<uint32_t> g_generation{0};
}

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
  ASSIGN_OR_RETURN(ipc::SocketPair sockets, ipc::MakeSocketPair());

  std::vector<std::string> argv_s = {options.binary};
  argv_s.insert(argv_s.end(), options.args.begin(), options.args.end());
  argv_s.push_back("--control-fd=3");
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  const int child_end = sockets.second.get();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoError(errno, "fork for " + options.binary);
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    if (child_end == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else {
      ::dup2(child_end, 3);  // dup2 clears close-on-exec
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  p->pid_ = pid;
  sockets.second.reset();
  p->control_ = std::move(sockets.first);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return ErrnoError(errno, "pidfd_open of offloadd-store");
  p->pidfd_.reset(pidfd);

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
  Reap();
}

int StoreProcess::Reap() {
  if (pid_ <= 0 || reaped_) return 0;
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return status;
}

Status StoreProcess::Submit(StoreOp op, uint64_t id, const StoreCommand& command, int timeout_ms) {
  ipc::CommandRecord r{};
  r.kind = static_cast<uint32_t>(op);
  r.id = id;
  r.Pack(command);
  return commands_.Push(r, timeout_ms, pidfd_.get()).WithContext("offloadd-store command ring");
}

StatusOr<Completion> StoreProcess::NextCompletion(int timeout_ms) {
  ipc::CommandRecord r;
  Status st = completions_.Pop(&r, timeout_ms, pidfd_.get());
  if (!st.ok()) return st.WithContext("offloadd-store completion ring");
  Completion c;
  c.id = r.id;
  c.body = r.Unpack<StoreCompletion>();
  return c;
}

Status StoreProcess::Shutdown(int timeout_ms) {
  RETURN_IF_ERROR(Submit(StoreOp::kShutdown, 0, {}, timeout_ms));
  for (;;) {
    ASSIGN_OR_RETURN(Completion c, NextCompletion(timeout_ms));
    if (c.body.op == static_cast<uint32_t>(StoreOp::kShutdown)) break;
  }
  const int status = Reap();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return InternalError("offloadd-store exited with wait status " + std::to_string(status));
  }
  return OkStatus();
}

}  // namespace offloadd::storage
