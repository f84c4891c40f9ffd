#pragma once
// ClusterJobRunner: the JobRunner of a daemon that coordinates jobs across hosts
// (resources.hosts > 1; docs/data_parallel.md, "The daemon coordinating peer daemons"). A job of
// one host goes to the ExecutorJobRunner unchanged. A job of H hosts of N ranks
// (resources.gpus_per_host) runs on this daemon (host 0: ranks 0..N-1, on the GPUs its scheduler
// gave it) and on the first H-1 of cluster.peers (host h: ranks hN..hN+N-1, in that order), one
// HostPart stream each (proto/offloadd/internal/peer.proto):
//   - admission is all-or-nothing: every peer must reserve its part (N GPUs) within
//     cluster.reserve_timeout_seconds, or none starts and the job fails naming the hosts that
//     did not (busy, unreachable, refused);
//   - rank 0 serves the group's c10d store on cluster.advertise_address at a port free when the
//     job starts; the peers' executors meet it there (tcp://), and each host's arena holds 1/H of
//     the optimizer states (ZeRO-1 across hosts, the trainer's);
//   - the job's progress, checkpoints and metrics are rank 0's, so this daemon's; the peers'
//     log lines join the job's events as "host <name>: ...";
//   - cancel and pause reach every peer; a peer that is lost (its stream broken, its keepalive
//     unanswered for cluster.lost_host_seconds) or whose part fails fails the job, naming it; a
//     job across hosts is never restarted (jobs.wait_for_lost_host_seconds is not built).
// Thread-safe as ExecutorJobRunner: Run may be called for several jobs at once.

#include <memory>
#include <string>

#include "daemon/config/config.h"
#include "daemon/jobs/executor_job_runner.h"
#include "daemon/jobs/job_manager.h"

namespace offloadd::daemon {

class ClusterJobRunner final : public JobRunner {
 public:
  ClusterJobRunner(ClusterConfig cluster, std::unique_ptr<ExecutorJobRunner> local)
      : cluster_(std::move(cluster)), local_(std::move(local)) {}

  Status Run(const offloadd::v1::Job& job, JobControl& control) override;
  void DiscardJobState(const offloadd::v1::Job& job) override { local_->DiscardJobState(job); }
  StatusOr<std::string> CheckpointForResume(const offloadd::v1::Job& job) override {
    return local_->CheckpointForResume(job);
  }

  // This host's executors (PeerService runs the peers' parts through it).
  ExecutorJobRunner* local() { return local_.get(); }

 private:
  Status RunAcrossHosts(const offloadd::v1::Job& job, JobControl& control, int hosts);

  const ClusterConfig cluster_;
  const std::unique_ptr<ExecutorJobRunner> local_;
};

}  // namespace offloadd::daemon
