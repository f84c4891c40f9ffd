#pragma once
// PeerService: this daemon's side of jobs that another daemon (their coordinator) runs across
// hosts (proto/offloadd/internal/peer.proto, docs/data_parallel.md "The daemon coordinating peer
// daemons"). Each HostPart stream is one host's part of one job:
//   reserve -> the part holds N of this host's GPUs, all or none (JobManager::ReserveHostPart;
//              on a node without GPUs, the node) or the stream ends RESOURCE_EXHAUSTED naming
//              this host, busy;
//   start   -> resources.gpus_per_host executors run host host_index's ranks of the job's group
//              (ExecutorJobRunner::RunHostRank), their warnings and errors sent back as log
//              lines, and the part's result as `finished`;
//   cancel, or the stream lost (the coordinator gone, its keepalive unanswered) -> the executors
//              are stopped (SIGKILLed after jobs.cancel_grace_seconds, at once when forced or
//              lost).
// The hold ends with the stream. Served only on cluster.listen (PeerServer), behind mutual TLS and
// the cluster's token (cluster_credentials.h). Thread-safe: one gRPC thread per stream.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/config/config.h"
#include "daemon/jobs/executor_job_runner.h"
#include "daemon/jobs/job_manager.h"
#include "offloadd/internal/peer.grpc.pb.h"

namespace offloadd::daemon {

class PeerService final : public offloadd::internal::PeerService::Service {
 public:
  // `jobs` and `runner` must outlive the service. `host_name`: cluster.name, in replies and logs.
  PeerService(JobManager* jobs, ExecutorJobRunner* runner, std::string host_name)
      : jobs_(jobs), runner_(runner), host_name_(std::move(host_name)) {}

  grpc::Status HostPart(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<offloadd::internal::PeerMessage,
                               offloadd::internal::CoordinatorMessage>* stream) override;

 private:
  JobManager* const jobs_;
  ExecutorJobRunner* const runner_;
  const std::string host_name_;
};

// The gRPC server of cluster.listen: PeerService alone. Started only when cluster.listen is set.
class PeerServer {
 public:
  static StatusOr<std::unique_ptr<PeerServer>> Start(const ClusterConfig& cluster, JobManager* jobs,
                                                     ExecutorJobRunner* runner);
  ~PeerServer();
  int port() const { return port_; }
  // Ends every stream (their parts are stopped as if their coordinators were lost) and returns
  // once the server has stopped.
  void Shutdown();

 private:
  PeerServer() = default;
  std::unique_ptr<PeerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace offloadd::daemon
