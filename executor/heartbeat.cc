#include "executor/heartbeat.h"

namespace offloadd::executor {

namespace pb = offloadd::internal;

Heartbeat::Heartbeat(ExecutorChannel& channel, double interval_seconds)
    : channel_(channel), interval_seconds_(interval_seconds) {
  if (interval_seconds_ > 0) thread_ = std::thread([this] { Run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::Enter(const std::string& phase, double expected_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  phase_ = phase;
  expected_seconds_ = expected_seconds;
  since_ = std::chrono::steady_clock::now();
  if (interval_seconds_ > 0) SendLocked();
}

void Heartbeat::SendLocked() {
  pb::ExecutorMessage m;
  pb::Heartbeat& h = *m.mutable_heartbeat();
  h.set_phase(phase_);
  h.set_phase_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count());
  h.set_expected_seconds(expected_seconds_);
  h.set_interval_seconds(interval_seconds_);
  channel_.Send(m);
}

void Heartbeat::Run() {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(interval_seconds_));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    SendLocked();
    cv_.wait_for(lock, interval, [this] { return stop_; });
  }
}

}  // namespace offloadd::executor
