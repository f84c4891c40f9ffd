#include "daemon/server/job_service.h"

#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>

#include "common/file_identity.h"
#include "common/logging.h"
#include "common/message_text.h"
#include "common/units.h"
#include "daemon/server/rpc_recorder.h"
#include "daemon/server/token_auth.h"
#include "google/rpc/status.pb.h"
#include "job/job_validator.h"
#include "job/path_policy.h"

namespace offloadd::daemon {
namespace {
constexpr const char* kLog = "server";
}  // namespace

namespace v1 = offloadd::v1;

namespace {

// INVALID_ARGUMENT carrying every violation as google.rpc.BadRequest in the status details, and
// the first few in the message for clients that do not read details.
grpc::Status InvalidSpec(const std::vector<FieldViolation>& violations) {
  google::rpc::BadRequest bad;
  std::string message = std::to_string(violations.size()) + " problem" + (violations.size() == 1 ? "" : "s") +
                        " in the job spec";
  for (size_t i = 0; i < violations.size(); ++i) {
    auto* v = bad.add_field_violations();
    // Fields and descriptions echo the user's input: valid UTF-8 (protobuf strings must be) and
    // bounded, so that a megabyte-long value cannot hide the message.
    const std::string field = SafeMessageText(violations[i].field, 256);
    const std::string description = SafeMessageText(violations[i].description, 1024);
    v->set_field(field);
    v->set_description(description);
    if (i < 3) message += (i == 0 ? ": " : "; ") + field + ": " + description;
  }
  if (violations.size() > 3) message += "; ...";
  google::rpc::Status rich;
  rich.set_code(grpc::StatusCode::INVALID_ARGUMENT);
  rich.set_message(message);
  rich.add_details()->PackFrom(bad);
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message, rich.SerializeAsString());
}

// The client quota's limits for this server (client_quota.h).
ClientQuotaLimits LimitsOf(const ServerConfig& server, int validation_slots,
                           int validations_per_client) {
  ClientQuotaLimits l =
      QuotaLimitsFor(server.max_active_jobs_per_client, server.max_watchers_per_client,
                     server.max_threads, server.reserved_threads);
  l.validation_slots = static_cast<uint32_t>(validation_slots);
  l.validation_slots_per_client = static_cast<uint32_t>(validations_per_client);
  return l;
}

bool IsActive(v1::JobState st) {
  return st == v1::JOB_STATE_QUEUED || st == v1::JOB_STATE_RUNNING || st == v1::JOB_STATE_PAUSING ||
         st == v1::JOB_STATE_PAUSED;
}

// The client's active-job limit (ClientQuota::Reserve), as Submit holds it.
class ActiveJobQuota : public SubmitQuota {
 public:
  ActiveJobQuota(ClientQuota& quota, const std::string& client, JobManager& jobs)
      : quota_(quota), client_(client), jobs_(jobs) {}
  Status Reserve() override {
    return quota_.Reserve(client_, [this](const std::string& id) {
      auto j = jobs_.Get(id);
      return j.ok() && IsActive(j->state());
    });
  }
  void Commit(const std::string& job_id) override { quota_.Commit(client_, job_id); }
  void Release() override { quota_.Release(client_); }

 private:
  ClientQuota& quota_;
  const std::string client_;
  JobManager& jobs_;
};

}  // namespace

JobServiceImpl::JobServiceImpl(const DaemonConfig& config, JobManager* jobs, DaemonMetrics* metrics,
                               std::shared_ptr<const PeerCredentials> peers)
    : config_(config),
      jobs_(jobs),
      metrics_(metrics),
      quota_(LimitsOf(config.server, kMaxConcurrentValidations, kMaxValidationsPerClient)),
      peers_(std::move(peers)),
      watch_streams_(jobs, metrics) {
  // The per-client active-job counts survive a restart: every active job the store holds counts
  // for its submitter (they used to start at zero).
  if (jobs_ == nullptr) return;
  std::string token;
  int adopted = 0;
  do {
    auto page = jobs_->List(
        {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSING, v1::JOB_STATE_PAUSED},
        1000, token);
    if (!page.ok()) {
      OFFLOADD_LOG(kWarning, kLog)
          << "cannot count the active jobs per client: " << page.status().ToString();
      break;
    }
    for (const v1::Job& j : page->jobs) {
      if (j.submitted_by().empty()) continue;  // recorded before submitters were: nobody's quota
      quota_.Adopt(j.submitted_by(), j.id());
      ++adopted;
    }
    token = page->next_page_token;
  } while (!token.empty());
  if (adopted > 0)
    OFFLOADD_LOG(kInfo, kLog) << adopted << " active jobs counted against their clients' limits";
}

std::string JobServiceImpl::ClientOf(const grpc::ServerContextBase& context) const {
  if (const auto named = TokenClientOf(context.auth_context().get())) return "token:" + named->name;
  const std::string peer = context.peer();
  return peers_ ? peers_->ClientFor(peer) : ClientKey(peer);
}

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext* context, const v1::CreateJobRequest* request,
                                       v1::Job* job) {
  RpcRecorder rec(metrics_, "CreateJob");
  const std::string client = ClientOf(*context);
  // Counted while it waits and validates: a client cannot hold more than its share of the server's
  // threads with CreateJob calls.
  auto call = quota_.AcquireCreate(client);
  if (!call.ok()) return rec.Done(ToGrpcStatus(call.status()));
  // Nobody waits for the answer once the client cancelled or its deadline passed: the wait for a
  // slot and the validation itself stop then.
  const auto deadline = context->deadline();
  const auto stop = [context, deadline] {
    return context->IsCancelled() || std::chrono::system_clock::now() >= deadline;
  };
  const auto stopped_status = [&] {
    return std::chrono::system_clock::now() >= deadline
               ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              "the deadline passed during CreateJob's validation")
               : grpc::Status(grpc::StatusCode::CANCELLED,
                              "CreateJob was cancelled during its validation");
  };
  SubmitRequest submit;
  submit.spec = request->spec();
  submit.request_id = request->request_id();
  submit.submitted_by = client;
  submit.validate_only = request->validate_only();
  submit.stop = stop;
  // Every file is opened with the rights of the client's user (common/file_identity.h), as the
  // job will open it.
  std::map<std::string, std::string> token_user;
  if (const auto named = TokenClientOf(context->auth_context().get()))
    token_user[named->name] = named->user;
  auto identity = SubmitterFileIdentity(client, token_user);
  if (!identity.ok()) {
    return rec.Done(ToGrpcStatus(identity.status().WithContext("the rights of " + client)));
  }
  submit.identity = *identity;
  ActiveJobQuota active(quota_, client, *jobs_);
  submit.quota = &active;
  auto slot = quota_.AcquireValidation(
      client, stop,
      std::chrono::steady_clock::now() + std::chrono::seconds(kValidationWaitSeconds));
  if (!slot.ok()) {
    return rec.Done(slot.status().code() == StatusCode::kCancelled ? stopped_status()
                                                                   : ToGrpcStatus(slot.status()));
  }
  auto submitted = jobs_->Submit(submit);
  if (!submitted.ok()) return rec.Done(ToGrpcStatus(submitted.status()));
  const ValidationResult& result = submitted->validation;
  if (!result.stopped.ok()) {
    OFFLOADD_LOG(kInfo, kLog) << "CreateJob from " << client
                              << " stopped during validation: " << result.stopped.message();
    return rec.Done(stopped_status());
  }
  if (!result.ok()) return rec.Done(InvalidSpec(result.violations));
  if (!request->validate_only()) {
    OFFLOADD_LOG(kInfo, kLog) << "job " << submitted->job.id() << " created by " << client;
  }
  *job = std::move(submitted->job);
  return rec.Done(grpc::Status::OK);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::Job* job) {
  RpcRecorder rec(metrics_, "GetJob");
  auto j = jobs_->Get(request->job_id());
  if (!j.ok()) return rec.Done(ToGrpcStatus(j.status()));
  *job = std::move(*j);
  return rec.Done(grpc::Status::OK);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  RpcRecorder rec(metrics_, "ListJobs");
  std::vector<v1::JobState> states;
  for (int s : request->states()) states.push_back(static_cast<v1::JobState>(s));
  auto page = jobs_->List(states, request->page_size(), request->page_token());
  if (!page.ok()) return rec.Done(ToGrpcStatus(page.status()));
  for (auto& j : page->jobs) *response->add_jobs() = std::move(j);
  response->set_next_page_token(page->next_page_token);
  return rec.Done(grpc::Status::OK);
}

Status JobServiceImpl::MayControl(const grpc::ServerContext& context, const std::string& job_id,
                                  const char* action) const {
  // TCP: a client named in the token file controls its own jobs unless it is an operator; the
  // holders of a bare token are operators.
  if (const auto named = TokenClientOf(context.auth_context().get())) {
    if (named->is_operator) return OkStatus();
    ASSIGN_OR_RETURN(v1::Job job, jobs_->Get(job_id));
    const std::string caller = ClientOf(context);  // "token:<name>", as recorded at CreateJob
    if (job.submitted_by() == caller) return OkStatus();
    return PermissionDeniedError("job " + job_id + " was submitted by " +
                                 (job.submitted_by().empty() ? std::string("an unrecorded client") : job.submitted_by()) +
                                 "; " + caller + " may not " + action +
                                 " it (only its submitter, or a token file line marked 'operator')");
  }
  if (!peers_) return OkStatus();
  const auto cred = peers_->Lookup(context.peer());
  if (!cred || cred->uid == 0 || cred->uid == ::geteuid()) return OkStatus();
  ASSIGN_OR_RETURN(v1::Job job, jobs_->Get(job_id));
  const std::string caller = "unix:uid=" + std::to_string(cred->uid);
  if (job.submitted_by().empty() || job.submitted_by() == caller) return OkStatus();
  return PermissionDeniedError("job " + job_id + " was submitted by " + job.submitted_by() + "; " + caller +
                               " may not " + action + " it (only its submitter, root or the daemon's user, uid " +
                               std::to_string(::geteuid()) + ")");
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                                       v1::Job* job) {
  RpcRecorder rec(metrics_, "CancelJob");
  if (Status allowed = MayControl(*context, request->job_id(), "cancel"); !allowed.ok()) {
    return rec.Done(ToGrpcStatus(allowed));
  }
  auto j = jobs_->Cancel(request->job_id(), request->reason(), request->force());
  if (!j.ok()) return rec.Done(ToGrpcStatus(j.status()));
  OFFLOADD_LOG(kInfo, kLog) << "job " << request->job_id() << (request->force() ? " force-" : " ")
                            << "cancelled by " << ClientOf(*context);
  *job = std::move(*j);
  return rec.Done(grpc::Status::OK);
}

grpc::Status JobServiceImpl::DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                                       v1::Job* job) {
  RpcRecorder rec(metrics_, "DeleteJob");
  if (Status allowed = MayControl(*context, request->job_id(), "delete"); !allowed.ok()) {
    return rec.Done(ToGrpcStatus(allowed));
  }
  auto j = jobs_->Delete(request->job_id());
  if (!j.ok()) return rec.Done(ToGrpcStatus(j.status()));
  OFFLOADD_LOG(kInfo, kLog) << "job " << request->job_id() << " deleted by " << ClientOf(*context);
  *job = std::move(*j);
  return rec.Done(grpc::Status::OK);
}

grpc::Status JobServiceImpl::PauseJob(grpc::ServerContext* context, const v1::PauseJobRequest* request,
                                      v1::Job* job) {
  RpcRecorder rec(metrics_, "PauseJob");
  if (Status allowed = MayControl(*context, request->job_id(), "pause"); !allowed.ok()) {
    return rec.Done(ToGrpcStatus(allowed));
  }
  auto j = jobs_->Pause(request->job_id());
  if (!j.ok()) return rec.Done(ToGrpcStatus(j.status()));
  *job = std::move(*j);
  return rec.Done(grpc::Status::OK);
}

grpc::Status JobServiceImpl::ResumeJob(grpc::ServerContext* context, const v1::ResumeJobRequest* request,
                                       v1::Job* job) {
  RpcRecorder rec(metrics_, "ResumeJob");
  if (Status allowed = MayControl(*context, request->job_id(), "resume"); !allowed.ok()) {
    return rec.Done(ToGrpcStatus(allowed));
  }
  auto j = jobs_->Resume(request->job_id());
  if (!j.ok()) return rec.Done(ToGrpcStatus(j.status()));
  *job = std::move(*j);
  return rec.Done(grpc::Status::OK);
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  return watch_streams_.Start(context, *request, quota_.AcquireWatcher(ClientOf(*context)));
}

grpc::Status JobServiceImpl::ListCheckpoints(grpc::ServerContext*, const v1::ListCheckpointsRequest* request,
                                             v1::ListCheckpointsResponse* response) {
  RpcRecorder rec(metrics_, "ListCheckpoints");
  auto checkpoints = jobs_->Checkpoints(request->job_id());
  if (!checkpoints.ok()) return rec.Done(ToGrpcStatus(checkpoints.status()));
  for (auto& c : *checkpoints) *response->add_checkpoints() = std::move(c);
  return rec.Done(grpc::Status::OK);
}

// Reads, like GetJob and WatchJob: open to every client that can connect (docs/security.md).
grpc::Status JobServiceImpl::ListJobMetrics(grpc::ServerContext*,
                                            const v1::ListJobMetricsRequest* request,
                                            v1::ListJobMetricsResponse* response) {
  RpcRecorder rec(metrics_, "ListJobMetrics");
  std::optional<int64_t> after;
  if (request->has_after_step()) after = request->after_step();
  auto page = jobs_->Metrics(request->job_id(), after, request->limit());
  if (!page.ok()) return rec.Done(ToGrpcStatus(page.status()));
  for (auto& row : page->rows) *response->add_metrics() = std::move(row);
  response->set_has_more(page->has_more);
  response->set_capped(page->capped);
  return rec.Done(grpc::Status::OK);
}

grpc::Status JobServiceImpl::ListJobEvents(grpc::ServerContext*,
                                           const v1::ListJobEventsRequest* request,
                                           v1::ListJobEventsResponse* response) {
  RpcRecorder rec(metrics_, "ListJobEvents");
  auto page = jobs_->Events(request->job_id(), request->after(), request->limit(),
                            !request->has_include_progress() || request->include_progress(),
                            !request->has_include_logs() || request->include_logs());
  if (!page.ok()) return rec.Done(ToGrpcStatus(page.status()));
  for (auto& e : page->events) *response->add_events() = std::move(e);
  response->set_has_more(page->has_more);
  response->set_next_after(page->next_after);
  return rec.Done(grpc::Status::OK);
}

}  // namespace offloadd::daemon
