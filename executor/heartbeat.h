#pragma once
// The executor's heartbeat (liveness): a thread that tells the daemon every
// `interval_seconds` that this process still runs and what its trainer is doing (the phase, how
// long it has been in it, and how long it is expected to take). The daemon kills an executor it
// has not heard from for several intervals (stopped, wedged in the kernel) and one whose phase
// overruns max(jobs.liveness.floor_seconds, factor x expected); see ExecutorJobRunner.
//
// Thread-safe: Enter may be called from any thread while the heartbeat thread runs.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "executor/executor_channel.h"

namespace offloadd::executor {

class Heartbeat {
 public:
  // interval_seconds <= 0: no thread, no heartbeats.
  Heartbeat(ExecutorChannel& channel, double interval_seconds);
  ~Heartbeat();  // stops and joins the thread
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // The trainer starts `phase`, expected to take `expected_seconds` (0: unknown, only the
  // heartbeats themselves are watched). Sends a heartbeat at once.
  void Enter(const std::string& phase, double expected_seconds);

 private:
  void Run();
  void SendLocked();

  ExecutorChannel& channel_;
  const double interval_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string phase_ = "setting up";
  double expected_seconds_ = 0;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::thread thread_;
};

}  // namespace offloadd::executor
