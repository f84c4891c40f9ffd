#include "client/cpp/offloadd_client.h"

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>

#include "google/rpc/status.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "offloadd/v1/job_service.grpc.pb.h"
#include "offloadd/v1/node_service.grpc.pb.h"

namespace offloadd::client {

namespace v1 = offloadd::v1;

const char* HealthStatusName(HealthStatus s) {
  switch (s) {
    case HealthStatus::kServing: return "SERVING";
    case HealthStatus::kNotServing: return "NOT_SERVING";
    case HealthStatus::kServiceUnknown: return "SERVICE_UNKNOWN";
    case HealthStatus::kUnknown: break;
  }
  return "UNKNOWN";
}

namespace {

StatusOr<std::string> ReadWholeFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return ErrnoError(errno, std::string(what) + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool IsUnixTarget(const std::string& t) { return t.rfind("unix:", 0) == 0; }

// Attaches "authorization: Bearer <token>" to every call.
class TokenCredentials final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit TokenCredentials(std::string token) : header_("Bearer " + std::move(token)) {}
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({"authorization", header_});
    return grpc::Status::OK;
  }

 private:
  std::string header_;
};

}  // namespace

struct Client::Impl {
  ConnectOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  std::unique_ptr<v1::NodeService::Stub> node;
  std::unique_ptr<v1::JobService::Stub> jobs;
  mutable std::mutex mu;
  std::vector<FieldViolation> violations;

  void Prepare(grpc::ClientContext* ctx) const { ctx->set_deadline(std::chrono::system_clock::now() + options.timeout); }

  Status Convert(const grpc::Status& s) {
    if (s.ok()) return OkStatus();
    std::string message = s.error_message();
    std::vector<FieldViolation> found;
    google::rpc::Status rich;
    if (!s.error_details().empty() && rich.ParseFromString(s.error_details())) {
      for (const auto& any : rich.details()) {
        google::rpc::BadRequest bad;
        if (any.UnpackTo(&bad)) {
          for (const auto& v : bad.field_violations()) {
            found.push_back({v.field(), v.description()});
            message += "\n  " + v.field() + ": " + v.description();
          }
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      violations = std::move(found);
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      message = "cannot reach offloadd at " + options.target + ": " + message;
    }
    return Status(static_cast<StatusCode>(s.error_code()), message);
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

StatusOr<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  std::string target = options.target;
  if (target.empty()) return InvalidArgumentError("empty target; use unix:///path or host:port");
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (IsUnixTarget(target)) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    if (options.tls_ca_file.empty() || options.auth_token_file.empty()) {
      return InvalidArgumentError("TCP target " + target +
                                  " needs a CA file and a token file (offloadd serves TCP only with TLS and a bearer token)");
    }
    ASSIGN_OR_RETURN(std::string ca, ReadWholeFile(options.tls_ca_file, "CA file"));
    ASSIGN_OR_RETURN(std::string token, ReadWholeFile(options.auth_token_file, "token file"));
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca;
    auto call_creds = grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenCredentials>(token));
    creds = grpc::CompositeChannelCredentials(grpc::SslCredentials(ssl), call_creds);
  }
  grpc::ChannelArguments args;
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  impl->channel = grpc::CreateCustomChannel(target, creds, args);
  impl->health = grpc::health::v1::Health::NewStub(impl->channel);
  impl->node = v1::NodeService::NewStub(impl->channel);
  impl->jobs = v1::JobService::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

StatusOr<HealthStatus> Client::CheckHealth(const std::string& service) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  RETURN_IF_ERROR(impl_->Convert(impl_->health->Check(&ctx, req, &resp)));
  switch (resp.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING: return HealthStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING: return HealthStatus::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN: return HealthStatus::kServiceUnknown;
    default: return HealthStatus::kUnknown;
  }
}

// Every unary call has the same shape: context with deadline, call, convert.
#define OFFLOADD_UNARY(stub, method, request, Response)          \
  grpc::ClientContext ctx;                                        \
  impl_->Prepare(&ctx);                                           \
  Response resp;                                                  \
  RETURN_IF_ERROR(impl_->Convert(impl_->stub->method(&ctx, request, &resp))); \
  return resp

StatusOr<v1::NodeInfo> Client::GetNodeInfo() { OFFLOADD_UNARY(node, GetNodeInfo, v1::GetNodeInfoRequest(), v1::NodeInfo); }

StatusOr<v1::Job> Client::CreateJob(const v1::JobSpec& spec, bool validate_only) {
  v1::CreateJobRequest req;
  *req.mutable_spec() = spec;
  req.set_validate_only(validate_only);
  OFFLOADD_UNARY(jobs, CreateJob, req, v1::Job);
}

StatusOr<v1::Job> Client::GetJob(const std::string& job_id) {
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  OFFLOADD_UNARY(jobs, GetJob, req, v1::Job);
}

StatusOr<v1::ListJobsResponse> Client::ListJobs(const v1::ListJobsRequest& request) {
  OFFLOADD_UNARY(jobs, ListJobs, request, v1::ListJobsResponse);
}

StatusOr<v1::Job> Client::CancelJob(const std::string& job_id, const std::string& reason) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  OFFLOADD_UNARY(jobs, CancelJob, req, v1::Job);
}

StatusOr<v1::Job> Client::PauseJob(const std::string& job_id) {
  v1::PauseJobRequest req;
  req.set_job_id(job_id);
  OFFLOADD_UNARY(jobs, PauseJob, req, v1::Job);
}

StatusOr<v1::Job> Client::ResumeJob(const std::string& job_id) {
  v1::ResumeJobRequest req;
  req.set_job_id(job_id);
  OFFLOADD_UNARY(jobs, ResumeJob, req, v1::Job);
}

StatusOr<v1::ListCheckpointsResponse> Client::ListCheckpoints(const std::string& job_id) {
  v1::ListCheckpointsRequest req;
  req.set_job_id(job_id);
  OFFLOADD_UNARY(jobs, ListCheckpoints, req, v1::ListCheckpointsResponse);
}

#undef OFFLOADD_UNARY

Status Client::WatchJob(const v1::WatchJobRequest& request,
                        const std::function<bool(const v1::JobEvent&)>& on_event) {
  grpc::ClientContext ctx;  // no deadline: a watch lasts as long as the job
  auto reader = impl_->jobs->WatchJob(&ctx, request);
  v1::JobEvent event;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      ctx.TryCancel();
      break;
    }
  }
  const grpc::Status s = reader->Finish();
  if (s.error_code() == grpc::StatusCode::CANCELLED) return OkStatus();
  return impl_->Convert(s);
}

std::vector<FieldViolation> Client::last_field_violations() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->violations;
}

}  // namespace offloadd::client
