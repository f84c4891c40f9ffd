#pragma once
// gRPC JobService. Until the job service core lands (training pipeline: issue #6; queue,
// persistence and checkpoints: issue #7) every method answers UNIMPLEMENTED naming what is missing.

#include "daemon/metrics/metrics.h"
#include "offloadd/v1/job_service.grpc.pb.h"

namespace offloadd::daemon {

class JobServiceImpl final : public offloadd::v1::JobService::Service {
 public:
  explicit JobServiceImpl(DaemonMetrics* metrics) : metrics_(metrics) {}

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

  DaemonMetrics* metrics_;
};

}  // namespace offloadd::daemon
