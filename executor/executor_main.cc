// offloadd-executor: one training process per job and GPU, started by the daemon through
// ipc::LaunchChild. Over the control socket (fd 3): the hellos, the job to run
// (offloadd.internal.StartJob), then pause / cancel requests in; events and one final status out
// (proto/offloadd/internal/executor.proto). Exits 0 once it has sent its final status, whatever
// that status is; any other exit tells the daemon the executor died.
//
//   offloadd-executor --control-fd=3 [--log-level=info]   (as the daemon runs it)
//   offloadd-executor --probe-gpus [--control-fd=3]       (the GPUs as JSON, on stdout or fd 3)
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common/logging.h"
#include "executor/executor_channel.h"
#include "executor/gpu_probe.h"
#include "executor/job_execution.h"
#include "ipc/message_channel.h"
#include "job/executor_protocol.h"

namespace offloadd::executor {
namespace {

namespace pb = offloadd::internal;
constexpr const char* kLog = "executor";

struct Flags {
  int control_fd = -1;
  bool probe_gpus = false;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--control-fd=", 0) == 0) {
      f->control_fd = std::atoi(a.c_str() + 13);
    } else if (a == "--probe-gpus") {
      f->probe_gpus = true;
    } else if (a.rfind("--log-level=", 0) == 0) {
      LogSeverity s;
      if (!ParseLogSeverity(a.substr(12), &s)) return false;
      SetMinLogSeverity(s);
    } else {
      return false;
    }
  }
  return true;
}

int ProbeGpus(const Flags& f) {
  const std::string json = ProbeGpusJson();
  if (f.control_fd < 0) {
    std::printf("%s\n", json.c_str());
    return 0;
  }
  return ipc::SendMessage(f.control_fd, json).ok() ? 0 : 1;
}

// Reads the daemon's control messages until the socket closes: pause and cancel requests. A
// closed socket means the daemon is gone (its death signal kills this process too): stop.
void ReadControl(ExecutorChannel& channel) {
  while (true) {
    pb::DaemonMessage m;
    const Status s = daemon::RecvProto(channel.fd(), &m);
    if (!s.ok()) {
      channel.RequestStop(StopRequest::kCancel);
      if (s.code() != StatusCode::kUnavailable) OFFLOADD_LOG(kWarning, kLog) << "control socket: " << s.ToString();
      return;
    }
    if (!m.has_control()) continue;
    if (m.control().action() == pb::Control::ACTION_PAUSE) channel.RequestStop(StopRequest::kPause);
    if (m.control().action() == pb::Control::ACTION_CANCEL) channel.RequestStop(StopRequest::kCancel);
  }
}

int Serve(int fd) {
  pb::ExecutorMessage hello;
  *hello.mutable_hello() = daemon::MakeHello(daemon::kExecutorProgram);
  if (Status s = daemon::SendProto(fd, hello); !s.ok()) {
    OFFLOADD_LOG(kError, kLog) << "hello: " << s.ToString();
    return 2;
  }
  pb::DaemonMessage m;
  Status s = daemon::RecvProto(fd, &m);
  if (s.ok() && !m.has_hello()) s = InvalidArgumentError("the daemon's first message is not a hello");
  if (s.ok()) s = daemon::CheckHello(m.hello(), daemon::kDaemonProgram);
  if (!s.ok()) {
    OFFLOADD_LOG(kError, kLog) << "hello: " << s.ToString();
    return 2;
  }
  pb::DaemonMessage start;
  s = daemon::RecvProto(fd, &start);
  if (s.ok() && !start.has_start()) s = InvalidArgumentError("expected the job to run after the hello");
  if (!s.ok()) {
    OFFLOADD_LOG(kError, kLog) << "start: " << s.ToString();
    return 2;
  }
  ExecutorChannel channel(fd);
  std::thread control([&channel] { ReadControl(channel); });
  const pb::Placement& p = start.start().placement();
  OFFLOADD_LOG(kInfo, kLog) << "job " << start.start().job().id() << ": rank " << p.rank() << " of "
                            << std::max(1, p.world_size()) << ", "
                            << (p.gpu_index() >= 0 ? "GPU " + std::to_string(p.gpu_index()) : std::string("CPU"));
  const Status result = ExecuteJob(start.start(), channel);
  pb::ExecutorMessage finished;
  *finished.mutable_finished() = daemon::ToFinished(result);
  channel.Send(finished);
  // Wakes the control reader (its recv returns 0) so that it can be joined.
  ::shutdown(fd, SHUT_RD);
  control.join();
  return 0;
}

}  // namespace
}  // namespace offloadd::executor

int main(int argc, char** argv) {
  using namespace offloadd::executor;
  signal(SIGPIPE, SIG_IGN);
  Flags f;
  if (!ParseFlags(argc, argv, &f) || (!f.probe_gpus && f.control_fd < 0)) {
    std::fprintf(stderr,
                 "usage: offloadd-executor --control-fd=N [--log-level=debug|info|warning|error]\n"
                 "       offloadd-executor --probe-gpus [--control-fd=N]\n"
                 "Started by offloadd: one executor per job and GPU.\n");
    return 64;
  }
  if (f.probe_gpus) return ProbeGpus(f);
  const int rc = Serve(f.control_fd);
  std::fflush(nullptr);
  return rc;
}
