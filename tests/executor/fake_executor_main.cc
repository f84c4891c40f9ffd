// A stand-in for offloadd-executor that speaks its protocol without training (torch-free), for
// ExecutorJobRunner's tests. What it does is chosen by the job's display_name:
//   ok            progress for step 1, a checkpoint, then OK
//   die-once      progress, then SIGKILLs itself on the first attempt; OK after a restart
//   always-die    SIGKILLs itself after its hello
//   fail          finishes with INVALID_ARGUMENT ("bad record")
//   exit-3        exits with code 3 without a final status
//   wait-stop     waits for pause or cancel, then finishes CANCELLED
//   rank1-fails   rank 1 finishes with INTERNAL at once; rank 0 waits for cancel
//   old-version   says hello with protocol version 0
//   stop-once     a heartbeat ("step 3"), then SIGSTOPs itself on the first attempt; OK after a restart
//   overrun-once  heartbeats every 0.1 s in phase "step 3" (expected 0.1 s) that never ends, on the
//                 first attempt; OK after a restart
//   ignore-cancel heartbeats, then ignores pause and cancel (a wedged trainer)
//   store-died-once  finishes with the store's death on the first attempt; OK after a restart
// Every log line it sends names its placement, the group timeout included.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "job/executor_protocol.h"

namespace pb = offloadd::internal;
using namespace offloadd;
using namespace offloadd::daemon;

namespace {

void Send(int fd, const pb::ExecutorMessage& m) { (void)SendProto(fd, m); }

void Finish(int fd, const Status& s) {
  pb::ExecutorMessage m;
  *m.mutable_finished() = ToFinished(s);
  Send(fd, m);
}

void Heartbeat(int fd, const std::string& phase, double expected, double in_phase) {
  pb::ExecutorMessage m;
  m.mutable_heartbeat()->set_phase(phase);
  m.mutable_heartbeat()->set_expected_seconds(expected);
  m.mutable_heartbeat()->set_phase_seconds(in_phase);
  m.mutable_heartbeat()->set_interval_seconds(0.1);
  Send(fd, m);
}

// Alive (heartbeats every 0.1 s) but stuck in `phase` until killed.
[[noreturn]] void Stuck(int fd, const std::string& phase, double expected) {
  for (int i = 0;; ++i) {
    Heartbeat(fd, phase, expected, 0.1 * i);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void WaitForStop(int fd) {
  while (true) {
    pb::DaemonMessage m;
    if (!RecvProto(fd, &m).ok()) std::_Exit(5);
    if (m.has_control()) return;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int fd = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--control-fd=", 0) == 0) fd = std::atoi(a.c_str() + 13);
  }
  if (fd < 0) return 64;
  pb::DaemonMessage hello, start;
  if (!RecvProto(fd, &hello).ok() || !RecvProto(fd, &start).ok() || !start.has_start()) return 2;
  const std::string mode = start.start().job().spec().display_name();
  const int rank = start.start().placement().rank();
  pb::ExecutorMessage h;
  *h.mutable_hello() = MakeHello(kExecutorProgram);
  if (mode == "old-version") h.mutable_hello()->set_protocol_version(0);
  Send(fd, h);
  if (mode == "always-die" || (mode == "die-once" && start.start().restart() == 0 && rank == 0)) {
    pb::ExecutorMessage p;
    p.mutable_progress()->set_step(1);
    Send(fd, p);
    ::raise(SIGKILL);
  }
  if (mode == "exit-3") return 3;
  const bool first = start.start().restart() == 0 && rank == 0;
  if (mode == "stop-once" && first) {
    Heartbeat(fd, "step 3", 0, 0);
    ::raise(SIGSTOP);
  }
  if (mode == "overrun-once" && first) Stuck(fd, "step 3", 0.1);
  if (mode == "ignore-cancel") {
    Heartbeat(fd, "step 1", 0, 0);
    WaitForStop(fd);
    Stuck(fd, "step 2", 0);
  }
  if (mode == "store-died-once" && first) {
    Finish(fd, UnavailableError("NVMe store: offloadd-store (pid 42) died: killed by signal 9 (Killed) "
                                "(offloadd-store completion ring)"));
    return 0;
  }
  if (mode == "old-version") {
    WaitForStop(fd);
    return 0;
  }
  if (mode == "fail") {
    Finish(fd, InvalidArgumentError("bad record"));
    return 0;
  }
  if (mode == "cuda-error-once" && start.start().restart() == 0 && rank == 0) {
    Finish(fd, InternalError("training step: CUDA error: an illegal memory access was encountered"));
    return 0;
  }
  if (mode == "wait-stop" || (mode == "rank1-fails" && rank == 0)) {
    WaitForStop(fd);
    Finish(fd, CancelledError("stopped"));
    return 0;
  }
  if (mode == "rank1-fails") {
    Finish(fd, InternalError("rank 1 broke"));
    return 0;
  }
  if (rank == 0) {
    pb::ExecutorMessage p;
    p.mutable_progress()->set_step(start.start().restart() + 2);
    Send(fd, p);
    pb::ExecutorMessage c;
    c.mutable_checkpoint()->set_step(2);
    Send(fd, c);
    pb::ExecutorMessage st;
    st.mutable_step()->set_step(2);
    st.mutable_step()->set_loss(1.5);
    st.mutable_step()->set_tokens(100);
    st.mutable_step()->set_step_seconds(0.5);
    Send(fd, st);
    pb::ExecutorMessage ev;
    ev.mutable_eval()->set_step(2);
    ev.mutable_eval()->set_loss(1.25);
    Send(fd, ev);
    if (start.start().history_size() > 0) {
      pb::ExecutorMessage rows;
      rows.mutable_log()->set_message(
          "history rows " + std::to_string(start.start().history_size()) + " first step " +
          std::to_string(start.start().history(0).step()));
      Send(fd, rows);
    }
  }
  pb::ExecutorMessage l;
  l.mutable_log()->set_message("rank " + std::to_string(rank) + " restart " + std::to_string(start.start().restart()) +
                               " gpu " + std::to_string(start.start().placement().gpu_index()) + " world " +
                               std::to_string(start.start().placement().world_size()) + " rendezvous " +
                               start.start().placement().rendezvous() + " timeout " +
                               std::to_string(start.start().placement().timeout_seconds()));
  Send(fd, l);
  Finish(fd, OkStatus());
  return 0;
}
