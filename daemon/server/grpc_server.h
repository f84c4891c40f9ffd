#pragma once
// The daemon's gRPC server: JobService, NodeService, grpc.health.v1 and server reflection on the
// Unix socket (and TCP with TLS + bearer token when configured). Owns the service objects.
// Thread-safe: Shutdown() may be called from any thread once.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/config/config.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/node_service.h"
#include "daemon/server/unix_peer_listener.h"

namespace offloadd::daemon {

// Everything startup checks beyond the config file's own syntax and ranges: the TLS files and the
// token file (exists, mode 0600, long enough) can be read. Warnings (a socket mode others may
// write to, allowed_roots that include "/") go to `warnings`. `offloadd --validate-config` runs
// the same checks as startup, so a config it accepts starts.
Status CheckStartup(const DaemonConfig& config, std::vector<std::string>* warnings);

class GrpcServer {
 public:
  // `jobs` and `metrics` must outlive the server.
  static StatusOr<std::unique_ptr<GrpcServer>> Start(const DaemonConfig& config, const BuildFacts& build,
                                                     JobManager* jobs, DaemonMetrics* metrics);
  ~GrpcServer();

  // The TCP port actually bound (0 when TCP is off).
  int tcp_port() const { return tcp_port_; }

  // Sets grpc.health.v1's answer (NOT_SERVING while jobs are not durable); ignored once Shutdown
  // began. Thread-safe.
  void SetServing(bool serving);

  // Health goes NOT_SERVING at once, new calls are refused, in-flight calls get `grace_seconds`
  // to finish and are then cancelled. Returns when the server has stopped.
  void Shutdown(double grace_seconds);

 private:
  GrpcServer() = default;

  std::unique_ptr<grpc::Service> job_service_;
  std::unique_ptr<grpc::Service> node_service_;
  std::unique_ptr<grpc::Server> server_;
  // Accepts the Unix socket's connections (their SO_PEERCRED names the client) and hands them to
  // server_; stopped before it.
  std::unique_ptr<UnixPeerListener> unix_listener_;
  std::string unix_socket_;
  std::mutex health_mu_;  // SetServing against Shutdown
  bool health_shut_down_ = false;
  int tcp_port_ = 0;
};

}  // namespace offloadd::daemon
