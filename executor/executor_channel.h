#pragma once
// The executor's end of its control socket: events go out through Send (from the trainer's thread
// and the control reader alike), and the daemon's pause / cancel requests land in stop().
// Thread-safe.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/status.h"
#include "offloadd/internal/executor.pb.h"

namespace offloadd::executor {

enum class StopRequest { kNone, kPause, kCancel };

class ExecutorChannel {
 public:
  explicit ExecutorChannel(int fd) : fd_(fd) {}

  // Sends one message. After the first failure (the daemon is gone) later sends are dropped: the
  // death signal ends this process soon, and training must not stall on a dead socket.
  void Send(const offloadd::internal::ExecutorMessage& message);
  // A request only ever escalates (a cancel after a pause stays a cancel).
  void RequestStop(StopRequest request);
  StopRequest stop() const { return stop_.load(); }
  // stop(), once it is not kNone or after `timeout`. A rank of a group across hosts stops on rank
  // 0's word (through the store); its own request, pause or cancel, comes through its own daemon
  // and may arrive a little later.
  StopRequest WaitForStop(std::chrono::milliseconds timeout);
  int fd() const { return fd_; }

 private:
  const int fd_;
  std::mutex mu_;
  bool broken_ = false;
  std::atomic<StopRequest> stop_{StopRequest::kNone};
  std::mutex stop_mu_;
  std::condition_variable stop_changed_;
};

}  // namespace offloadd::executor
