#include "client/cpp/offloadd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

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

bool IsFinal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

// Codes of a watch stream that broke rather than failed: the daemon restarting or draining
// (UNAVAILABLE, or CANCELLED once its shutdown grace ends), a dropped connection, an aborted call.
bool IsBrokenStream(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::ABORTED ||
         code == grpc::StatusCode::CANCELLED;
}

std::string StateShortName(v1::JobState s) {
  const std::string n = v1::JobState_Name(s);
  return n.rfind("JOB_STATE_", 0) == 0 ? n.substr(10) : n;
}

std::string SecondsText(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

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
          for (const auto& v : bad.field_violations()) found.push_back({v.field(), v.description()});
        }
      }
    }
    if (!found.empty()) {
      // The message's head ("2 problems in the job spec") and each violation once, on a line of
      // its own: the daemon's message also inlines the first few, for clients that do not read
      // the details, and those would show twice.
      const size_t inline_at = message.find(": " + found.front().field + ": ");
      if (inline_at != std::string::npos) message.resize(inline_at);
      message += ":";
      for (const FieldViolation& v : found) message += "\n  " + v.field + ": " + v.description;
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

StatusOr<v1::Job> Client::CancelJob(const std::string& job_id, const std::string& reason, bool force) {
  v1::CancelJobRequest req;
  req.set_job_id(job_id);
  req.set_reason(reason);
  req.set_force(force);
  OFFLOADD_UNARY(jobs, CancelJob, req, v1::Job);
}

StatusOr<v1::Job> Client::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest req;
  req.set_job_id(job_id);
  OFFLOADD_UNARY(jobs, DeleteJob, req, v1::Job);
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

StatusOr<v1::ListJobMetricsResponse> Client::ListJobMetrics(const v1::ListJobMetricsRequest& req) {
  OFFLOADD_UNARY(jobs, ListJobMetrics, req, v1::ListJobMetricsResponse);
}

StatusOr<v1::ListJobEventsResponse> Client::ListJobEvents(const v1::ListJobEventsRequest& req) {
  OFFLOADD_UNARY(jobs, ListJobEvents, req, v1::ListJobEventsResponse);
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

StatusOr<v1::Job> Client::Wait(const std::string& job_id, const std::function<void(const v1::JobEvent&)>& on_event,
                               std::chrono::milliseconds timeout) {
  using Clock = std::chrono::system_clock;
  constexpr std::chrono::milliseconds kFirstRetry{100}, kMaxRetry{5000};
  const bool bounded = timeout > std::chrono::milliseconds::zero();
  const Clock::time_point deadline = Clock::now() + timeout;
  int64_t cursor = 0;
  v1::JobState last_state = v1::JOB_STATE_UNSPECIFIED;
  const auto timed_out = [&] {
    return Status(StatusCode::kDeadlineExceeded,
                  "job " + job_id + " did not finish within " + SecondsText(timeout) + " (last seen " +
                      (last_state == v1::JOB_STATE_UNSPECIFIED ? std::string("no state") : StateShortName(last_state)) +
                      ", cursor " + std::to_string(cursor) + ")");
  };
  Clock::time_point news = Clock::now();  // last time the watch made progress
  std::chrono::milliseconds retry = kFirstRetry;
  while (true) {
    grpc::ClientContext ctx;
    if (bounded) ctx.set_deadline(deadline);
    v1::WatchJobRequest req;
    req.set_job_id(job_id);
    req.set_after_cursor(cursor);
    auto reader = impl_->jobs->WatchJob(&ctx, req);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      if (event.cursor() <= cursor) continue;  // never twice, whatever the server resends
      cursor = event.cursor();
      if (event.has_state_change()) last_state = event.state_change().state();
      news = Clock::now();
      retry = kFirstRetry;
      if (on_event) on_event(event);
    }
    const grpc::Status s = reader->Finish();
    Status broken;
    if (s.ok()) {
      // The daemon ends a watch once the job is final and every event is out; confirm, since a
      // stream can also end early (a proxy, an older daemon).
      auto job = GetJob(job_id);
      if (job.ok() && IsFinal(job->state())) return job;
      if (!job.ok() && !IsBrokenStream(static_cast<grpc::StatusCode>(job.status().code()))) return job.status();
      broken = job.ok() ? UnavailableError("the watch stream ended while the job was " + StateShortName(job->state()))
                        : job.status();
    } else if (bounded && (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || Clock::now() >= deadline)) {
      return timed_out();
    } else if (!IsBrokenStream(s.error_code())) {
      return impl_->Convert(s);
    } else {
      broken = impl_->Convert(s);
    }
    const Clock::time_point now = Clock::now();
    if (now - news >= impl_->options.reconnect_window) {
      return Status(broken.code(), "lost the watch of job " + job_id + " and could not resume it for " +
                                       SecondsText(impl_->options.reconnect_window) +
                                       " (watch again with after_cursor=" + std::to_string(cursor) +
                                       "): " + broken.message());
    }
    auto pause = std::min(retry, std::chrono::duration_cast<std::chrono::milliseconds>(
                                     news + impl_->options.reconnect_window - now));
    if (bounded) {
      if (now >= deadline) return timed_out();
      pause = std::min(pause, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    }
    std::this_thread::sleep_for(pause);
    retry = std::min(retry * 2, kMaxRetry);
  }
}

std::vector<FieldViolation> Client::last_field_violations() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->violations;
}

}  // namespace offloadd::client
