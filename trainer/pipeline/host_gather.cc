// HostGather: the all-gather thread of ZeRO-1 across hosts.
#include "trainer/pipeline/host_gather.h"

#include <algorithm>
#include <string>
#include <utility>

#include "trainer/pipeline/trace.h"  // NowMicros()

namespace offloadd::trainer {

HostGather::HostGather(int blocks, Hooks hooks)
    : n_(blocks), hooks_(std::move(hooks)), gathered_(static_cast<size_t>(blocks), 0) {
  thread_ = std::thread([this] { Loop(); });
}

HostGather::~HostGather() { Stop(); }

Status HostGather::Submit(uint64_t step, bool restored) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_)
    return FailedPreconditionError("gathers submitted after the gather thread stopped");
  if (restored) {  // the slices were rewritten: nothing gathered before counts
    cv_.wait(lock, [&] { return queue_.empty() || !error_.ok(); });
    std::fill(gathered_.begin(), gathered_.end(), 0);
  }
  RETURN_IF_ERROR(error_);
  queue_.push_back(Job{step, restored});
  cv_.notify_all();
  return OkStatus();
}

Status HostGather::WaitGathered(int b, uint64_t step) {
  if (b < 0 || b >= n_) {
    return InvalidArgumentError("block " + std::to_string(b) + " out of " + std::to_string(n_));
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return gathered_[static_cast<size_t>(b)] >= step || !error_.ok(); });
  if (gathered_[static_cast<size_t>(b)] >= step) return OkStatus();
  return error_;
}

Status HostGather::WaitAll(uint64_t step) {
  for (int b = 0; b < n_; ++b) RETURN_IF_ERROR(WaitGathered(b, step));
  return OkStatus();
}

void HostGather::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

std::vector<int> HostGather::gathered_order() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_;
}

void HostGather::Loop() {
  if (hooks_.on_start) hooks_.on_start();
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Stopping still drains the queue: the other ranks run the same collectives.
      cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
      if (queue_.empty() || !error_.ok()) {
        queue_.clear();
        cv_.notify_all();
        return;
      }
      job = queue_.front();
    }
    Status st = Run(job);
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    if (!st.ok() && error_.ok()) error_ = st;
    cv_.notify_all();
  }
}

Status HostGather::Run(const Job& job) {
  if (!job.restored && hooks_.skipped) {
    ASSIGN_OR_RETURN(const bool skipped, hooks_.skipped(job.step));
    if (skipped) {  // every rank took the same decision: the weights stay, nothing is gathered
      std::lock_guard<std::mutex> lock(mu_);
      for (uint64_t& g : gathered_) g = std::max(g, job.step);
      cv_.notify_all();
      return OkStatus();
    }
  }
  for (int b = 0; b < n_; ++b) {
    if (!job.restored) RETURN_IF_ERROR(hooks_.wait_updated(b, job.step));
    const int64_t t0 = NowMicros();
    RETURN_IF_ERROR(hooks_.gather(b));
    if (hooks_.span) hooks_.span(b, t0, NowMicros());
    std::lock_guard<std::mutex> lock(mu_);
    gathered_[static_cast<size_t>(b)] = std::max(gathered_[static_cast<size_t>(b)], job.step);
    if (order_.size() < kOrderKept) order_.push_back(b);
    cv_.notify_all();
  }
  return OkStatus();
}

}  // namespace offloadd::trainer
