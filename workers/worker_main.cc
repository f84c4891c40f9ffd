#include "workers/worker_main.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "common/logging.h"
#include "ipc/arena.h"
#include "ipc/fd_passing.h"
#include "ipc/ring_queue.h"
#include "workers/protocol.h"
#include "workers/shard_executor.h"

namespace offloadd::workers {
namespace {

void Reply(int sock, const Status& st, uint32_t recovered) {
  WorkerReady ready{};
  ready.status_code = static_cast<int32_t>(st.code());
  ready.recovered_chunks = recovered;
  std::strncpy(ready.message, st.message().c_str(), sizeof(ready.message) - 1);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&ready);
  (void)ipc::SendFds(sock, {}, std::span<const uint8_t>(bytes, sizeof(ready)));
}

struct Attached {
  WorkerHello hello{};
  ipc::SharedSegment segment;
  ipc::Arena arena;
  std::vector<ipc::UniqueFd> fds;  // cmd ready, cmd space, cpl ready, cpl space
  ipc::Channel<ipc::CommandRecord> commands;
  ipc::Channel<WorkerCompletion> completions;
  uint64_t undo_offset = 0;
};

Status Attach(int sock, Attached* a) {
  ASSIGN_OR_RETURN(ipc::ReceivedFds got, ipc::RecvFds(sock, 5, sizeof(WorkerHello)));
  if (got.payload.size() != sizeof(WorkerHello) || got.fds.size() != 5) {
    return InvalidArgumentError("malformed hello on the control socket");
  }
  std::memcpy(&a->hello, got.payload.data(), sizeof(WorkerHello));
  const WorkerHello& h = a->hello;
  if (h.magic != kHelloMagic || h.version != kHelloVersion) {
    return InvalidArgumentError("hello version " + std::to_string(h.version) + ", expected " +
                                std::to_string(kHelloVersion) +
                                ": offloadd-worker and the daemon come from different builds");
  }
  if (h.parent_pid != ::getppid()) return AbortedError("parent exited before the worker started");
  if (h.threads == 0 || h.threads > 1024 || h.num_cpus > kMaxCpusPerWorker ||
      !PathSupported(static_cast<KernelPath>(h.kernel_path))) {
    return InvalidArgumentError("hello has out-of-range threads/cpus/kernel path");
  }
  ASSIGN_OR_RETURN(a->segment, ipc::SharedSegment::Attach(got.fds[0].get()));
  ASSIGN_OR_RETURN(a->arena, ipc::Arena::Open(&a->segment));
  for (size_t i = 1; i < 5; ++i) a->fds.push_back(std::move(got.fds[i]));
  ASSIGN_OR_RETURN(
      auto cmd_q, ipc::RingQueue<ipc::CommandRecord>::Attach(a->arena, CommandQueueName(h.worker)));
  ASSIGN_OR_RETURN(auto cpl_q, ipc::RingQueue<WorkerCompletion>::Attach(
                                   a->arena, CompletionQueueName(h.worker)));
  a->commands = ipc::Channel<ipc::CommandRecord>(cmd_q, a->fds[0].get(), a->fds[1].get());
  a->completions = ipc::Channel<WorkerCompletion>(cpl_q, a->fds[2].get(), a->fds[3].get());
  if (h.crash_consistent) {
    ASSIGN_OR_RETURN(ipc::Region undo, a->arena.Find(UndoRegionName(h.worker)));
    if (undo.size < UndoRegionBytes(h.threads))
      return InvalidArgumentError("undo region too small");
    a->undo_offset = undo.offset;
  }
  return OkStatus();
}

}  // namespace

int WorkerMain(int argc, char** argv) {
  // Die with the daemon even if it is SIGKILLed (the pool also sets this before exec).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  int sock = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--control-fd=", 13) == 0) sock = std::atoi(argv[i] + 13);
  }
  if (sock < 0) {
    std::fprintf(stderr,
                 "usage: offloadd-worker --control-fd=N (started by the offloadd daemon)\n");
    return 2;
  }
  Attached a;
  Status st = Attach(sock, &a);
  if (!st.ok()) {
    OFFLOADD_LOG(kError, "workers") << "offloadd-worker: " << st.ToString();
    Reply(sock, st, 0);
    return 1;
  }
  const WorkerHello& h = a.hello;
  uint32_t recovered = 0;
  if (h.crash_consistent) {
    StatusOr<uint32_t> r = RecoverUndoSlots(a.arena, a.undo_offset, h.threads);
    if (!r.ok()) {
      Reply(sock, r.status(), 0);
      return 1;
    }
    recovered = *r;
  }
  ExecutorOptions opts;
  opts.worker = h.worker;
  opts.threads = h.threads;
  opts.path = static_cast<KernelPath>(h.kernel_path);
  opts.crash_consistent = h.crash_consistent != 0;
  opts.undo_offset = a.undo_offset;
  for (uint32_t i = 0; i < h.num_cpus; ++i) opts.cpus.push_back(h.cpus[i]);
  if (h.incarnation == 0) {
    opts.crash_point = static_cast<CrashPoint>(h.crash_point);
    opts.crash_after_chunks = h.crash_after_chunks;
  }
  ShardExecutor executor(&a.arena, opts);
  st = executor.Start();
  Reply(sock, st, recovered);
  if (!st.ok()) return 1;
  if (recovered > 0) {
    OFFLOADD_LOG(kInfo, "workers")
        << "worker " << h.worker << " completed " << recovered << " interrupted chunk commit(s)";
  }
  for (;;) {
    ipc::CommandRecord cmd;
    st = a.commands.Pop(&cmd, -1, sock);  // UNAVAILABLE when the daemon closes the socket
    if (!st.ok()) return st.code() == StatusCode::kUnavailable ? 0 : 1;
    if (cmd.kind == static_cast<uint32_t>(CommandKind::kShutdown)) return 0;
    const WorkerCompletion done = executor.Execute(cmd);
    st = a.completions.Push(done, -1, sock);
    if (!st.ok()) return st.code() == StatusCode::kUnavailable ? 0 : 1;
  }
}

}  // namespace offloadd::workers
