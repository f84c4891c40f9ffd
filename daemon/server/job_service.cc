#include "daemon/server/job_service.h"

#include <string>

#include "daemon/server/rpc_recorder.h"

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

grpc::Status JobServiceImpl::Missing(const char* method) {
  RpcRecorder rec(metrics_, method);
  return rec.Done(grpc::Status(
      grpc::StatusCode::UNIMPLEMENTED,
      std::string("JobService.") + method +
          " is not available in this build: the job queue, persistence and training pipeline are "
          "not implemented yet (offload pipeline: issue #6; job service: issue #7)"));
}

grpc::Status JobServiceImpl::CreateJob(grpc::ServerContext*, const v1::CreateJobRequest*, v1::Job*) {
  return Missing("CreateJob");
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
