#include "daemon/server/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/logging.h"
#include "daemon/cluster/cluster_credentials.h"
#include "daemon/metrics/metrics.h"
#include "daemon/openai/openai_api.h"
#include "daemon/server/job_service.h"
#include "daemon/server/token_auth.h"
#include "daemon/server/unix_socket.h"

namespace offloadd::daemon {
namespace {

StatusOr<std::string> ReadFile(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  if (!in) return ErrnoError(errno, key + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(const TcpConfig& tcp) {
  ASSIGN_OR_RETURN(std::string cert, ReadFile(tcp.tls_cert_file, "server.tcp.tls_cert_file"));
  ASSIGN_OR_RETURN(std::string key, ReadFile(tcp.tls_key_file, "server.tcp.tls_key_file"));
  ASSIGN_OR_RETURN(std::vector<ClientToken> tokens, ReadTokenFile(tcp.auth_token_file));
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({key, cert});
  auto creds = grpc::SslServerCredentials(opts);
  creds->SetAuthMetadataProcessor(MakeTokenAuthProcessor(std::move(tokens)));
  return creds;
}

}  // namespace

Status CheckStartup(const DaemonConfig& config, std::vector<std::string>* warnings) {
  if (!config.server.tcp.listen.empty()) RETURN_IF_ERROR(TcpCredentials(config.server.tcp).status());
  RETURN_IF_ERROR(openai::CheckOpenAiApi(config));
  RETURN_IF_ERROR(CheckClusterFiles(config.cluster));
  if (!config.server.unix_socket.empty() && (config.server.unix_socket_mode & 0002) != 0) {
    char mode[16];
    std::snprintf(mode, sizeof mode, "%04o", config.server.unix_socket_mode);
    warnings->push_back(std::string("server.unix_socket_mode ") + mode +
                        " lets every local user submit jobs that read and write under allowed_roots; "
                        "use 0660 and a group");
  }
  if (!config.server.tcp.listen.empty() && ::geteuid() == 0) {
    auto tokens = ReadTokenFile(config.server.tcp.auth_token_file);
    if (tokens.ok() && std::any_of(tokens->begin(), tokens->end(),
                                   [](const ClientToken& t) { return t.user.empty(); })) {
      warnings->push_back(
          "server.tcp.auth_token_file has lines without user=<local user>: the daemon runs as "
          "root, so their jobs read and write under allowed_roots with root's rights");
    }
  }
  if (std::string w = MetricsListenWarning(config.metrics.listen); !w.empty())
    warnings->push_back(w);
  for (const std::string& root : config.allowed_roots) {
    if (root == "/") {
      warnings->push_back("allowed_roots includes /: jobs may read and write any file the daemon's user can");
    }
  }
  // A store directory that is missing (an unmounted NVMe) is said so, with its path, not taken
  // for "none configured"; jobs offloading to NVMe are refused, naming it, until it is back.
  std::vector<StoreDirInput> dirs;
  for (const auto& d : config.storage.directories) dirs.push_back({d.path, d.weight});
  const std::vector<StoreDirFacts> probed = ProbeNodeResources(dirs).store_dirs;
  for (size_t i = 0; i < probed.size(); ++i) {
    const StoreDirFacts& d = probed[i];
    if (!d.problem.empty()) {
      warnings->push_back("storage.directories[" + std::to_string(i) + "].path " + d.path + " is unusable (" +
                          d.problem + "); jobs offloading to NVMe are refused until it is usable");
    }
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const DaemonConfig& config, const BuildFacts& build,
                                                        JobManager* jobs, DaemonMetrics* metrics) {
  std::unique_ptr<GrpcServer> s(new GrpcServer());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::vector<StoreDirInput> dirs;
  for (const auto& d : config.storage.directories) dirs.push_back({d.path, d.weight});
  auto peers = std::make_shared<PeerCredentials>();
  s->job_service_ = std::make_unique<JobServiceImpl>(config, jobs, metrics, peers);
  auto node = std::make_unique<NodeServiceImpl>(build, dirs, metrics);
  node->set_adamw_kernel(config.workers.adamw_kernel);
  node->set_profile_dir(config.state_dir + "/profiles");  // where jobs cache the node profile
  node->set_host_memory_limit(config.memory.host_memory_limit);
  if (jobs != nullptr) {
    node->set_gpu_jobs([jobs] { return jobs->GpuAssignments(); });
    node->set_serving_problem([jobs] { return jobs->HealthProblem(); });
  }
  s->node_service_ = std::move(node);

  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.server.max_request_bytes));
  // The global cap on call-handling threads (server.max_threads): a call that finds none free gets
  // RESOURCE_EXHAUSTED instead of a new thread, whatever the per-client limits allow.
  grpc::ResourceQuota quota("offloadd-server");
  quota.SetMaxThreads(static_cast<int>(config.server.max_threads));
  builder.SetResourceQuota(quota);
  // The socket is bound inside a fresh 0700 directory, given its mode there, and only then renamed
  // to its configured path: no client can connect while it has the umask's mode (0777 under umask
  // 000 before, until the chmod after the bind). The daemon accepts its connections itself, to
  // read each client's user (SO_PEERCRED), and hands them to the gRPC server.
  std::unique_ptr<PrivateSocketBinding> binding;
  if (!config.server.unix_socket.empty()) {
    RETURN_IF_ERROR(PrepareUnixSocketPath(config.server.unix_socket));
    ASSIGN_OR_RETURN(binding, PrivateSocketBinding::Create(config.server.unix_socket));
    ASSIGN_OR_RETURN(s->unix_listener_, UnixPeerListener::Bind(binding->bind_path(), peers));
    s->unix_socket_ = config.server.unix_socket;
  }
  if (!config.server.tcp.listen.empty()) {
    ASSIGN_OR_RETURN(auto creds, TcpCredentials(config.server.tcp));
    builder.AddListeningPort(config.server.tcp.listen, creds, &s->tcp_port_);
  }
  builder.RegisterService(s->job_service_.get());
  builder.RegisterService(s->node_service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_) {
    return UnavailableError("gRPC server failed to start" +
                            (config.server.tcp.listen.empty() ? std::string()
                                                              : ": cannot bind " + config.server.tcp.listen) +
                            " (see the gRPC error above)");
  }
  if (!config.server.tcp.listen.empty() && s->tcp_port_ == 0) {
    s->server_->Shutdown();
    return UnavailableError("cannot bind server.tcp.listen=" + config.server.tcp.listen);
  }
  if (s->unix_listener_) s->unix_listener_->Start(s->server_.get());
  if (binding) {
    if (Status st = binding->Publish(config.server.unix_socket_mode); !st.ok()) {
      s->unix_listener_->Stop();
      s->server_->Shutdown();
      return st;
    }
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  return s;
}

void GrpcServer::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (server_ && !health_shut_down_) server_->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcServer::Shutdown(double grace_seconds) {
  if (!server_) return;
  // Health first, so load balancers and clients polling health stop sending work.
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    health_shut_down_ = true;
    server_->GetHealthCheckService()->Shutdown();
  }
  if (unix_listener_) unix_listener_->Stop();  // no new connections
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(grace_seconds * 1000));
  server_->Shutdown(deadline);
  server_->Wait();
  server_.reset();
  if (!unix_socket_.empty()) unlink(unix_socket_.c_str());
}

GrpcServer::~GrpcServer() { Shutdown(0); }

}  // namespace offloadd::daemon
