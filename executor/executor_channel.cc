#include "executor/executor_channel.h"

#include "common/logging.h"
#include "job/executor_protocol.h"

namespace offloadd::executor {

void ExecutorChannel::Send(const offloadd::internal::ExecutorMessage& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return;
  if (Status s = daemon::SendProto(fd_, message); !s.ok()) {
    broken_ = true;
    OFFLOADD_LOG(kWarning, "executor") << "the daemon's socket failed (" << s.ToString()
                                       << "); later events are dropped";
  }
}

void ExecutorChannel::RequestStop(StopRequest request) {
  StopRequest now = stop_.load();
  while (static_cast<int>(request) > static_cast<int>(now) && !stop_.compare_exchange_weak(now, request)) {
  }
  std::lock_guard<std::mutex> lock(stop_mu_);
  stop_changed_.notify_all();
}

StopRequest ExecutorChannel::WaitForStop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stop_changed_.wait_for(lock, timeout, [this] { return stop_.load() != StopRequest::kNone; });
  return stop_.load();
}

}  // namespace offloadd::executor
