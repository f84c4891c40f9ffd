#include "daemon/cluster/peer_service.h"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "daemon/cluster/cluster_credentials.h"
#include "ipc/event_fd.h"

namespace offloadd::daemon {
namespace {

namespace pb = offloadd::internal;
namespace v1 = offloadd::v1;
constexpr const char* kLog = "cluster";

using Stream = grpc::ServerReaderWriter<pb::PeerMessage, pb::CoordinatorMessage>;

// The JobControl of one host's part: stop requests come from the stream, log lines go back to
// the coordinator (which adds them to the job's events), progress and checkpoints are rank 0's.
class HostPartControl final : public JobControl {
 public:
  HostPartControl(Stream* stream, std::mutex* write_mu, std::vector<int> gpus, ipc::UniqueFd fd)
      : stream_(stream), write_mu_(write_mu), gpus_(std::move(gpus)), stop_fd_(std::move(fd)) {}

  void ReportProgress(const v1::JobProgress&) override {}
  void CheckpointSaved(const v1::Checkpoint&) override {}
  void Log(v1::LogLevel level, const std::string& message) override {
    pb::PeerMessage m;
    m.mutable_log()->set_level(level);
    m.mutable_log()->set_message(message);
    std::lock_guard<std::mutex> lock(*write_mu_);
    (void)stream_->Write(m);  // a lost coordinator shows through the reads
  }
  Stop stop_requested() const override { return stop_.load(); }
  int stop_fd() const override { return stop_fd_.get(); }
  bool force_stop() const override { return force_.load(); }
  std::vector<int> gpus() const override { return gpus_; }

  void RequestStop(Stop stop, bool force) {
    if (force) force_ = true;
    Stop none = Stop::kNone;
    stop_.compare_exchange_strong(none, stop);
    if (force && stop_.load() == Stop::kPause) stop_ = Stop::kCancel;
    ipc::SignalEventFd(stop_fd_.get());
  }

 private:
  Stream* const stream_;
  std::mutex* const write_mu_;
  const std::vector<int> gpus_;
  const ipc::UniqueFd stop_fd_;
  std::atomic<Stop> stop_{Stop::kNone};
  std::atomic<bool> force_{false};
};

// What a reserve must hold before this host holds anything for it.
Status CheckReserve(const pb::ReserveHost& r) {
  if (r.job().id().empty()) return InvalidArgumentError("reserve: the job has no id");
  if (r.hosts() < 2 || r.host_index() < 1 || r.host_index() >= r.hosts()) {
    return InvalidArgumentError("reserve: host_index " + std::to_string(r.host_index()) + " of " +
                                std::to_string(r.hosts()) +
                                " hosts (a peer is rank 1..hosts-1; the coordinator is 0)");
  }
  if (r.rendezvous().rfind("tcp://", 0) != 0) {
    return InvalidArgumentError("reserve: rendezvous must be tcp://host:port, got '" +
                                r.rendezvous() + "'");
  }
  if (static_cast<int>(std::max<uint32_t>(1, r.job().spec().resources().hosts())) != r.hosts()) {
    return InvalidArgumentError("reserve: the job's resources.hosts is " +
                                std::to_string(r.job().spec().resources().hosts()) + ", not " +
                                std::to_string(r.hosts()));
  }
  return OkStatus();
}

std::string GpuList(const std::vector<int>& gpus) {
  std::string out = gpus.size() == 1 ? "GPU " : "GPUs ";
  for (size_t i = 0; i < gpus.size(); ++i) out += (i ? "," : "") + std::to_string(gpus[i]);
  return out;
}

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

}  // namespace

grpc::Status PeerService::HostPart(grpc::ServerContext* context, Stream* stream) {
  pb::CoordinatorMessage m;
  if (!stream->Read(&m)) return grpc::Status(grpc::StatusCode::CANCELLED, "no reserve");
  if (!m.has_reserve()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected reserve first");
  }
  const pb::ReserveHost reserve = m.reserve();
  if (Status s = CheckReserve(reserve); !s.ok()) return ToGrpc(s);
  const v1::Job& job = reserve.job();
  const std::string part = "job " + job.id() + " host " + std::to_string(reserve.host_index());
  const int gpus_needed =
      static_cast<int>(std::max<uint32_t>(1, job.spec().resources().gpus_per_host()));
  std::optional<std::vector<int>> gpus = jobs_->ReserveHostPart(part, gpus_needed);
  if (!gpus) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "host " + host_name_ + " is busy: its " +
                            (gpus_needed > 0 ? std::to_string(gpus_needed) + " GPU(s)" : "") +
                            " are not free now (on a node without GPUs: it runs another job)");
  }
  struct Release {
    JobManager* jobs;
    std::string part;
    ~Release() { jobs->ReleaseHostPart(part); }
  } release{jobs_, part};
  OFFLOADD_LOG(kInfo, kLog) << part << " reserved for " << reserve.coordinator() << " on "
                            << (gpus->empty() ? std::string("the CPU") : GpuList(*gpus));
  std::mutex write_mu;
  {
    pb::PeerMessage reserved;
    reserved.mutable_reserved()->set_host(host_name_);
    std::lock_guard<std::mutex> lock(write_mu);
    if (!stream->Write(reserved))
      return grpc::Status(grpc::StatusCode::CANCELLED, "coordinator lost");
  }
  if (!stream->Read(&m) || m.has_cancel()) {
    OFFLOADD_LOG(kInfo, kLog) << part << ": released before it started";
    return grpc::Status::OK;
  }
  if (!m.has_start()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "expected start");
  auto fd = ipc::MakeEventFd();
  if (!fd.ok()) return ToGrpc(fd.status());
  HostPartControl control(stream, &write_mu, *gpus, std::move(*fd));
  // The executors' death signal follows the thread that launched them: this one, joined below.
  std::thread run([&] {
    const Status result = runner_->RunHostRank(
        job, control, HostRank{reserve.host_index(), reserve.hosts(), reserve.rendezvous()});
    OFFLOADD_LOG(kInfo, kLog) << part << " ended: " << result.ToString();
    pb::PeerMessage finished;
    finished.mutable_finished()->set_code(static_cast<int>(result.code()));
    finished.mutable_finished()->set_message(result.message());
    std::lock_guard<std::mutex> lock(write_mu);
    (void)stream->Write(finished);
  });
  // Read until the coordinator half-closes (after `finished`) or is lost; a cancel meanwhile
  // stops the part.
  while (stream->Read(&m)) {
    if (m.has_cancel()) {
      control.RequestStop(m.cancel().pause() ? JobControl::Stop::kPause : JobControl::Stop::kCancel,
                          m.cancel().force());
    }
  }
  // The coordinator is done with this part, or gone: nothing of it may keep running.
  control.RequestStop(JobControl::Stop::kCancel, /*force=*/context->IsCancelled());
  run.join();
  return grpc::Status::OK;
}

StatusOr<std::unique_ptr<PeerServer>> PeerServer::Start(const ClusterConfig& cluster,
                                                        JobManager* jobs,
                                                        ExecutorJobRunner* runner) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                   ClusterServerCredentials(cluster));
  std::unique_ptr<PeerServer> s(new PeerServer());
  s->service_ = std::make_unique<PeerService>(jobs, runner, cluster.name);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(cluster.listen, creds, &s->port_);
  builder.RegisterService(s->service_.get());
  // The coordinators' keepalive pings (cluster_credentials.cc) must not be taken for abuse.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(cluster.lost_host_seconds * 1000));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return UnavailableError("cluster.listen " + cluster.listen + ": cannot listen there");
  }
  return s;
}

PeerServer::~PeerServer() { Shutdown(); }

void PeerServer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now());  // cancels every stream at once
  server_->Wait();
  server_.reset();
}

}  // namespace offloadd::daemon
