#include "daemon/server/job_service.h"

#include <string>

#include "daemon/jobs/job_validator.h"
#include "daemon/node/node_probe.h"
#include "daemon/server/rpc_recorder.h"
#include "google/rpc/status.pb.h"

namespace offloadd::daemon {

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
    v->set_field(violations[i].field);
    v->set_description(violations[i].description);
    if (i < 3) message += (i == 0 ? ": " : "; ") + violations[i].field + ": " + violations[i].description;
  }
  if (violations.size() > 3) message += "; ...";
  google::rpc::Status rich;
  rich.set_code(grpc::StatusCode::INVALID_ARGUMENT);
  rich.set_message(message);
  rich.add_details()->PackFrom(bad);
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message, rich.SerializeAsString());
}

}  // namespace

JobServiceImpl::JobServiceImpl(const DaemonConfig& config, DaemonMetrics* metrics)
    : config_(config), paths_(config.allowed_roots), metrics_(metrics) {}

grpc::Status JobServiceImpl::Missing(const char* method) {
  RpcRecorder rec(metrics_, method);
  return rec.Done(grpc::Status(
      grpc::StatusCode::UNIMPLEMENTED,
      std::string("JobService.") + method +
          " is not available in this build: the job queue, persistence and training pipeline are "
          "not implemented yet (offload pipeline: issue #6; job service: issue #7)"));
}

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext*, const v1::CreateJobRequest* request, v1::Job* job) {
  RpcRecorder rec(metrics_, "CreateJob");
  std::vector<StoreDirInput> dirs;
  for (const auto& d : config_.storage.directories) dirs.push_back({d.path, d.weight});
  const NodeFacts facts = ProbeNode(dirs);
  NodeBudget node;
  node.host_memory_bytes = facts.memory.total_bytes;
  node.host_memory_limit = config_.memory.host_memory_limit;
  node.gpu_memory_limit = config_.memory.gpu_memory_limit;
  node.gpus = facts.gpus;
  for (const auto& d : facts.store_dirs) {
    if (d.problem.empty()) node.store_dirs.push_back(d);
  }
  ValidationResult result = ValidateJobSpec(request->spec(), paths_, node);
  if (!result.ok()) return rec.Done(InvalidSpec(result.violations));
  if (!request->validate_only()) {
    return rec.Done(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "the job spec is valid, but this build cannot run jobs yet: the training pipeline "
                                 "(issue #6) and the job queue (issue #7) are not implemented; use validate_only"));
  }
  *job->mutable_spec() = std::move(result.resolved);
  job->set_state(v1::JOB_STATE_QUEUED);
  return rec.Done(grpc::Status::OK);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::Job*) {
  return Missing("GetJob");
}
grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse*) {
  return Missing("ListJobs");
}
grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*, v1::Job*) {
  return Missing("CancelJob");
}
grpc::Status JobServiceImpl::PauseJob(grpc::ServerContext*, const v1::PauseJobRequest*, v1::Job*) {
  return Missing("PauseJob");
}
grpc::Status JobServiceImpl::ResumeJob(grpc::ServerContext*, const v1::ResumeJobRequest*, v1::Job*) {
  return Missing("ResumeJob");
}
grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext*, const v1::WatchJobRequest*,
                                      grpc::ServerWriter<v1::JobEvent>*) {
  return Missing("WatchJob");
}
grpc::Status JobServiceImpl::ListCheckpoints(grpc::ServerContext*, const v1::ListCheckpointsRequest*,
                                             v1::ListCheckpointsResponse*) {
  return Missing("ListCheckpoints");
}

}  // namespace offloadd::daemon
