#pragma once
// gRPC JobService. CreateJob validates the whole spec (daemon/jobs/job_validator.h) and answers
// INVALID_ARGUMENT with a google.rpc.BadRequest listing every problem by field path;
// validate_only returns the job as it would run (defaults filled, paths canonical).
// Until the training pipeline (issue #6) and the job queue and persistence (issue #7) land, a
// valid non-dry-run CreateJob is refused with FAILED_PRECONDITION and the other methods answer
// UNIMPLEMENTED naming what is missing: nothing is accepted that could not run.

#include "daemon/config/config.h"
#include "daemon/jobs/path_policy.h"
#include "daemon/metrics/metrics.h"
#include "offloadd/v1/job_service.grpc.pb.h"

namespace offloadd::daemon {

class JobServiceImpl final : public offloadd::v1::JobService::Service {
 public:
  JobServiceImpl(const DaemonConfig& config, DaemonMetrics* metrics);

  grpc::Status CreateJob(grpc::ServerContext*, const offloadd::v1::CreateJobRequest*, offloadd::v1::Job*) override;
  grpc::Status GetJob(grpc::ServerContext*, const offloadd::v1::GetJobRequest*, offloadd::v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const offloadd::v1::ListJobsRequest*,
                        offloadd::v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const offloadd::v1::CancelJobRequest*, offloadd::v1::Job*) override;
  grpc::Status PauseJob(grpc::ServerContext*, const offloadd::v1::PauseJobRequest*, offloadd::v1::Job*) override;
  grpc::Status ResumeJob(grpc::ServerContext*, const offloadd::v1::ResumeJobRequest*, offloadd::v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const offloadd::v1::WatchJobRequest*,
                        grpc::ServerWriter<offloadd::v1::JobEvent>*) override;
  grpc::Status ListCheckpoints(grpc::ServerContext*, const offloadd::v1::ListCheckpointsRequest*,
                               offloadd::v1::ListCheckpointsResponse*) override;

 private:
  grpc::Status Missing(const char* method);

  const DaemonConfig config_;
  PathPolicy paths_;
  DaemonMetrics* metrics_;
};

}  // namespace offloadd::daemon
