#pragma once
// gRPC JobService: translates between protobuf requests and the job core (JobManager,
// ValidateJobSpec). CreateJob validates the whole spec and answers INVALID_ARGUMENT with a
// google.rpc.BadRequest listing every problem by field path; validate_only returns the job as it
// would run (defaults filled, paths canonical). A JobManager started without a JobRunner refuses
// to queue jobs (FAILED_PRECONDITION): nothing is accepted that could not run.

#include "daemon/config/config.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/client_quota.h"
#include "daemon/server/unix_peer_listener.h"
#include "daemon/server/watch_stream.h"
#include "job/path_policy.h"
#include "offloadd/v1/job_service.grpc.pb.h"

namespace offloadd::daemon {

// WatchJob uses gRPC's callback API (watch_stream.h): a stream holds no server thread while it
// waits, and ends as soon as its client cancels. The other methods are synchronous.
class JobServiceImpl final : public offloadd::v1::JobService::WithCallbackMethod_WatchJob<
                                 offloadd::v1::JobService::Service> {
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
  grpc::Status DeleteJob(grpc::ServerContext*, const offloadd::v1::DeleteJobRequest*, offloadd::v1::Job*) override;
  grpc::Status ResumeJob(grpc::ServerContext*, const offloadd::v1::ResumeJobRequest*, offloadd::v1::Job*) override;
  grpc::ServerWriteReactor<offloadd::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext*, const offloadd::v1::WatchJobRequest*) override;
  grpc::Status ListCheckpoints(grpc::ServerContext*, const offloadd::v1::ListCheckpointsRequest*,
                               offloadd::v1::ListCheckpointsResponse*) override;
  grpc::Status ListJobMetrics(grpc::ServerContext*, const offloadd::v1::ListJobMetricsRequest*,
                              offloadd::v1::ListJobMetricsResponse*) override;
  grpc::Status ListJobEvents(grpc::ServerContext*, const offloadd::v1::ListJobEventsRequest*,
                             offloadd::v1::ListJobEventsResponse*) override;

 private:
  const DaemonConfig config_;
  JobManager* jobs_;
  DaemonMetrics* metrics_;
  // Validation reads model configs, tokenizers and dataset heads (up to 64 MiB for a JSON array):
  // at most this many at once, so a burst of CreateJob calls cannot multiply that memory, and one
  // client at most kMaxValidationsPerClient of them (ClientQuota::AcquireValidation). A call
  // waits at most kValidationWaitSeconds for a slot, less when its deadline comes first (it stops
  // waiting as soon as its client cancels; one client's waiting calls are bounded by its share of
  // the server's threads, so a long wait cannot pile up threads).
  static constexpr int kMaxConcurrentValidations = 4;
  static constexpr int kMaxValidationsPerClient = 2;
  static constexpr int kValidationWaitSeconds = 120;
  // The client a call comes from, for the per-client limits and the log.
  std::string ClientOf(const grpc::ServerContextBase& context) const;
  // Whether the caller may cancel, pause or resume the job: a local user only its own jobs
  // (Job.submitted_by), unless it is root or the daemon's user; TCP clients (token holders) and
  // jobs without a recorded submitter, any. PERMISSION_DENIED naming the owner otherwise.
  Status MayControl(const grpc::ServerContext& context, const std::string& job_id, const char* action) const;

  // server.max_active_jobs_per_client, server.max_watchers_per_client, the threads CreateJob and
  // WatchJob may hold (server.max_threads, server.reserved_threads) and the validation slots.
  // The active jobs are counted from the job store when the service starts.
  ClientQuota quota_;
  std::shared_ptr<const PeerCredentials> peers_;
  // After quota_: its streams hold quota_'s slots (all have ended before it is destroyed).
  WatchStreams watch_streams_;
};

}  // namespace offloadd::daemon
