#pragma once
// gRPC JobService: translates between protobuf requests and the job core (JobManager,
// ValidateJobSpec). CreateJob validates the whole spec and answers INVALID_ARGUMENT with a
// google.rpc.BadRequest listing every problem by field path; validate_only returns the job as it
// would run (defaults filled, paths canonical). A JobManager started without a JobRunner refuses
// to queue jobs (FAILED_PRECONDITION): nothing is accepted that could not run.

#include <semaphore>

#include "daemon/config/config.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/jobs/path_policy.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/client_quota.h"
#include "daemon/server/unix_peer_listener.h"
#include "offloadd/v1/job_service.grpc.pb.h"

namespace offloadd::daemon {

class JobServiceImpl final : public offloadd::v1::JobService::Service {
 public:
  // `jobs` must outlive the service. `peers` names the Unix-socket clients by user (null: every
  // Unix-socket client is the one client "unix").
  JobServiceImpl(const DaemonConfig& config, JobManager* jobs, DaemonMetrics* metrics,
                 std::shared_ptr<const PeerCredentials> peers = nullptr);

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
  const DaemonConfig config_;
  PathPolicy paths_;
  JobManager* jobs_;
  DaemonMetrics* metrics_;
  // Validation reads model configs, tokenizers and dataset heads (up to 64 MiB for a JSON array):
  // at most this many at once, so a burst of CreateJob calls cannot multiply that memory.
  static constexpr int kMaxConcurrentValidations = 4;
  std::counting_semaphore<kMaxConcurrentValidations> validations_{kMaxConcurrentValidations};
  // The client a call comes from, for the per-client limits and the log.
  std::string ClientOf(const grpc::ServerContext& context) const;
  // Whether the caller may cancel, pause or resume the job: a local user only its own jobs
  // (Job.submitted_by), unless it is root or the daemon's user; TCP clients (token holders) and
  // jobs without a recorded submitter, any. PERMISSION_DENIED naming the owner otherwise.
  Status MayControl(const grpc::ServerContext& context, const std::string& job_id, const char* action) const;

  // server.max_active_jobs_per_client and server.max_watchers_per_client.
  ClientQuota quota_;
  std::shared_ptr<const PeerCredentials> peers_;
};

}  // namespace offloadd::daemon
