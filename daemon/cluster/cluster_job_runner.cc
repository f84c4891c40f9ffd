#include "daemon/cluster/cluster_job_runner.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "daemon/cluster/cluster_credentials.h"
#include "ipc/event_fd.h"
#include "job/path_policy.h"
#include "offloadd/internal/peer.grpc.pb.h"

namespace offloadd::daemon {
namespace {

namespace pb = offloadd::internal;
namespace v1 = offloadd::v1;
constexpr const char* kLog = "cluster";
using Clock = std::chrono::steady_clock;

// A TCP port free now on this host, for rank 0's c10d store (bound and released: the store binds
// it again moments later, as torchrun's --master-port=0 does).
StatusOr<int> FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return ErrnoError(err, "picking the rendezvous port");
  return static_cast<int>(ntohs(addr.sin_port));
}

// One peer's part of the job: its stream, and what its reader thread learnt.
struct PeerLink {
  const PeerConfig* peer = nullptr;
  int index = 0;
  grpc::ClientContext context;
  std::unique_ptr<pb::PeerService::Stub> stub;
  std::unique_ptr<grpc::ClientReaderWriter<pb::CoordinatorMessage, pb::PeerMessage>> stream;
  std::mutex write_mu;
  std::thread reader;
  // Under Coordination::mu.
  bool reserved = false;
  bool finished = false;
  bool ended = false;  // the stream is over (Finish returned)
  Status result;       // `finished`'s, or why the stream ended without it

  std::string Name() const { return "host " + peer->name + " (" + peer->address + ")"; }
  bool Write(const pb::CoordinatorMessage& m) {
    std::lock_guard<std::mutex> lock(write_mu);
    return stream->Write(m);
  }
};

// What the job's threads share: the links' states, and whether a peer was lost.
struct Coordination {
  std::mutex mu;
  std::condition_variable changed;
  std::atomic<bool> peer_lost{false};
  std::string lost;  // the first lost peer, described
};

// The local rank's control: the job's own, plus a stop when a peer is lost (the local executor
// must not wait for a collective with a host that is gone).
class CoordinatorControl final : public JobControl {
 public:
  CoordinatorControl(JobControl& job, Coordination& c) : job_(job), c_(c) {}
  void ReportProgress(const v1::JobProgress& p) override { job_.ReportProgress(p); }
  void Log(v1::LogLevel level, const std::string& message) override { job_.Log(level, message); }
  void CheckpointSaved(const v1::Checkpoint& cp) override { job_.CheckpointSaved(cp); }
  void RecordMetrics(const v1::StepMetrics& row) override { job_.RecordMetrics(row); }
  StatusOr<std::vector<v1::StepMetrics>> RecordedMetrics() override {
    return job_.RecordedMetrics();
  }
  Stop stop_requested() const override {
    return c_.peer_lost ? Stop::kCancel : job_.stop_requested();
  }
  int stop_fd() const override { return job_.stop_fd(); }
  bool force_stop() const override { return c_.peer_lost || job_.force_stop(); }
  std::vector<int> gpus() const override { return job_.gpus(); }

 private:
  JobControl& job_;
  Coordination& c_;
};

void ReadPeer(PeerLink& link, Coordination& c, JobControl& control) {
  pb::PeerMessage m;
  while (link.stream->Read(&m)) {
    if (m.has_log()) {
      control.Log(m.log().level(), "host " + link.peer->name + ": " + m.log().message());
      continue;
    }
    std::lock_guard<std::mutex> lock(c.mu);
    if (m.has_reserved()) {
      link.reserved = true;
    } else if (m.has_finished()) {
      link.finished = true;
      link.result = m.finished().code() == 0 ? OkStatus()
                                             : Status(static_cast<StatusCode>(m.finished().code()),
                                                      link.Name() + ": " + m.finished().message());
    }
    c.changed.notify_all();
  }
  const grpc::Status s = link.stream->Finish();
  std::lock_guard<std::mutex> lock(c.mu);
  link.ended = true;
  if (!link.finished) {
    const std::string why = s.ok() ? "its stream ended" : s.error_message();
    link.result = Status(s.ok() || !link.reserved ? StatusCode::kUnavailable
                                                  : static_cast<StatusCode>(s.error_code()),
                         link.Name() + ": " + why);
    if (link.reserved && !c.peer_lost) {
      c.lost = link.Name() + " was lost: " + why;
      c.peer_lost = true;
      if (control.stop_fd() >= 0) ipc::SignalEventFd(control.stop_fd());  // wake the local rank
    }
  }
  c.changed.notify_all();
}

pb::CoordinatorMessage CancelMessage(JobControl::Stop stop, bool force) {
  pb::CoordinatorMessage m;
  m.mutable_cancel()->set_force(force);
  m.mutable_cancel()->set_pause(stop == JobControl::Stop::kPause);
  return m;
}

std::string FormatSeconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// Waits until every peer has reserved its part, one refused, `timeout_seconds` passed or the job
// was stopped. Returns what kept the peers that did not reserve ("" when all did).
std::string AwaitReservations(std::vector<std::unique_ptr<PeerLink>>& links, Coordination& c,
                              const JobControl& control, double timeout_seconds) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  std::unique_lock<std::mutex> lock(c.mu);
  const auto settled = [&] {
    bool all = true;
    for (auto& l : links) {
      if (l->ended && !l->reserved) return true;  // one refused: no need to wait for the rest
      all &= l->reserved;
    }
    return all;
  };
  while (!settled() && Clock::now() < deadline &&
         control.stop_requested() == JobControl::Stop::kNone) {
    c.changed.wait_for(lock, std::chrono::milliseconds(200));
  }
  std::string refused;
  for (auto& l : links) {
    if (l->reserved && !l->ended) continue;
    refused += (refused.empty() ? "" : "; ") +
               (l->ended ? std::string(l->result.message())
                         : l->Name() + ": no answer within cluster.reserve_timeout_seconds (" +
                               FormatSeconds(timeout_seconds) + " s)");
  }
  return refused;
}

}  // namespace

Status ClusterJobRunner::Run(const v1::Job& job, JobControl& control) {
  const int hosts = static_cast<int>(std::max<uint32_t>(1, job.spec().resources().hosts()));
  if (hosts == 1) return local_->Run(job, control);
  return RunAcrossHosts(job, control, hosts);
}

Status ClusterJobRunner::RunAcrossHosts(const v1::Job& job, JobControl& control, int hosts) {
  if (hosts - 1 > static_cast<int>(cluster_.peers.size())) {
    return FailedPreconditionError("resources.hosts: the job asks for " + std::to_string(hosts) +
                                   " hosts; this daemon's cluster.peers lists " +
                                   std::to_string(cluster_.peers.size()) + " besides itself");
  }
  ASSIGN_OR_RETURN(int port, FreePort());
  const std::string rendezvous = "tcp://" + cluster_.advertise_address + ":" + std::to_string(port);
  // The peers open the job's files with the rights its submitter has here: a local uid.
  v1::Job shared = job;
  ASSIGN_OR_RETURN(std::optional<FileIdentity> identity,
                   SubmitterFileIdentity(job.submitted_by(), local_->options().token_users));
  if (identity) shared.set_submitted_by("unix:uid=" + std::to_string(identity->uid));

  // Every channel first: a credential file that cannot be read now fails the job before any
  // stream (and its reader thread) exists.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 1; i < hosts; ++i) {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     ClusterChannel(cluster_, cluster_.peers[static_cast<size_t>(i - 1)]));
    channels.push_back(std::move(channel));
  }
  Coordination c;
  std::vector<std::unique_ptr<PeerLink>> links;
  for (int i = 1; i < hosts; ++i) {
    auto link = std::make_unique<PeerLink>();
    link->peer = &cluster_.peers[static_cast<size_t>(i - 1)];
    link->index = i;
    link->stub = pb::PeerService::NewStub(channels[static_cast<size_t>(i - 1)]);
    link->stream = link->stub->HostPart(&link->context);
    pb::CoordinatorMessage m;
    pb::ReserveHost& r = *m.mutable_reserve();
    *r.mutable_job() = shared;
    r.set_host_index(i);
    r.set_hosts(hosts);
    r.set_rendezvous(rendezvous);
    r.set_coordinator(cluster_.name);
    (void)link->Write(m);  // a failure shows as the stream's end, read below
    PeerLink* l = link.get();
    link->reader = std::thread([l, &c, &control] { ReadPeer(*l, c, control); });
    links.push_back(std::move(link));
  }
  const auto end_all = [&links](bool cancel) {
    for (auto& l : links) {
      if (cancel) l->context.TryCancel();
      l->reader.join();
    }
  };

  // All or nothing: every peer reserves its part, or none starts.
  const std::string refused =
      AwaitReservations(links, c, control, cluster_.reserve_timeout_seconds);
  if (!refused.empty() || control.stop_requested() != JobControl::Stop::kNone) {
    end_all(/*cancel=*/true);
    if (refused.empty()) return CancelledError("stopped before the job's hosts started");
    return UnavailableError("not every host of the job reserved its part, so none started: " +
                            refused);
  }
  control.Log(v1::LOG_LEVEL_INFO, "every host reserved its part (" + std::to_string(hosts) +
                                      " hosts); rendezvous " + rendezvous);
  pb::CoordinatorMessage start;
  start.mutable_start();
  for (auto& l : links) (void)l->Write(start);

  // Cancel and pause reach every peer; the local rank follows `control` itself.
  std::atomic<bool> local_done{false};
  std::thread forward([&] {
    JobControl::Stop sent = JobControl::Stop::kNone;
    bool forced = false;
    std::unique_lock<std::mutex> lock(c.mu);
    while (!local_done) {
      const JobControl::Stop stop = control.stop_requested();
      const bool force = control.force_stop();
      if ((stop != JobControl::Stop::kNone && stop != sent) || (force && !forced)) {
        lock.unlock();
        for (auto& l : links) (void)l->Write(CancelMessage(stop, force));
        lock.lock();
        sent = stop;
        forced = force;
      }
      c.changed.wait_for(lock, std::chrono::milliseconds(100));
    }
  });
  CoordinatorControl local_control(control, c);
  Status local = local_->RunHostRank(job, local_control, HostRank{0, hosts, rendezvous});
  {
    std::lock_guard<std::mutex> lock(c.mu);
    local_done = true;
    c.changed.notify_all();
  }
  forward.join();
  // The peers end with the group: at once when this rank failed (theirs cannot go on), within
  // the keepalive bound otherwise.
  if (!local.ok()) {
    for (auto& l : links) (void)l->Write(CancelMessage(JobControl::Stop::kCancel, true));
  }
  {
    std::unique_lock<std::mutex> lock(c.mu);
    const auto wait_until =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(
                           (cluster_.lost_host_seconds + local_->options().cancel_grace_seconds +
                            local_->options().kill_grace_seconds) *
                           1000));
    c.changed.wait_until(lock, wait_until, [&] {
      for (auto& l : links) {
        if (!l->finished && !l->ended) return false;
      }
      return true;
    });
  }
  for (auto& l : links) {
    std::lock_guard<std::mutex> lock(l->write_mu);
    l->stream->WritesDone();
  }
  // A peer that has not finished by now is cancelled (its daemon stops its part).
  bool all_finished = true;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (auto& l : links) all_finished &= l->finished || l->ended;
  }
  end_all(/*cancel=*/!all_finished);

  const bool stopped = control.stop_requested() != JobControl::Stop::kNone;
  if (c.peer_lost && !stopped) {
    const std::string lost = c.lost;
    OFFLOADD_LOG(kWarning, kLog) << "job " << job.id() << ": " << lost;
    return UnavailableError(lost + (local.ok() ? "" : "; rank 0: " + std::string(local.message())));
  }
  if (!local.ok()) return local;
  for (auto& l : links) {
    if (!l->finished) return UnavailableError(l->Name() + ": did not finish its part");
    if (!l->result.ok()) return l->result;
  }
  return OkStatus();
}

}  // namespace offloadd::daemon
