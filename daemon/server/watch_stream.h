#pragma once
// WatchJob on gRPC's callback API. A stream holds no server thread
// while it waits for its job's next event, and it ends as soon as gRPC reports that its client
// cancelled (OnCancel): its ClientQuota slot is free at once. The synchronous handler it replaces
// held a thread per stream and noticed a cancelled client only at its next poll, about 2 s later.
//
// JobManager wakes a stream when its job has a new event (JobManager::Subscribe); one reading
// thread owned by WatchStreams then reads the events from the store and starts the writes, so a
// wake-up (made under the manager's lock) never touches the store or gRPC. The writes of a stream
// go one at a time, each started when the previous one completed.
//
// Thread-safe. The WatchStreams must outlive every stream it started (the gRPC server is shut
// down, and so every stream done, before it is destroyed).

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "daemon/jobs/job_manager.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/client_quota.h"
#include "offloadd/v1/job_service.pb.h"

namespace offloadd::daemon {

class WatchStreams {
 public:
  // `jobs` and `metrics` (may be null) must outlive this object.
  WatchStreams(JobManager* jobs, DaemonMetrics* metrics);
  ~WatchStreams();
  WatchStreams(const WatchStreams&) = delete;
  WatchStreams& operator=(const WatchStreams&) = delete;

  // The reactor of a WatchJob call. `slot` is the stream's ClientQuota slot, or the error that
  // refused one (the stream then ends with that error at once).
  grpc::ServerWriteReactor<offloadd::v1::JobEvent>* Start(
      grpc::CallbackServerContext* context, const offloadd::v1::WatchJobRequest& request,
      StatusOr<ClientQuota::Lease> slot);

  struct Core;  // a stream's state shared with the reading thread

 private:
  class Stream;
  void Enqueue(const std::shared_ptr<Core>& core);
  void ReadLoop();
  void Pump(const std::shared_ptr<Core>& core);

  JobManager* jobs_;
  DaemonMetrics* metrics_;
  std::mutex mu_;
  std::condition_variable ready_cv_;
  std::deque<std::shared_ptr<Core>> ready_;  // streams with news to read
  bool stopping_ = false;
  std::thread reader_;
};

}  // namespace offloadd::daemon
