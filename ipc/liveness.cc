#include "ipc/liveness.h"

#include <algorithm>
#include <atomic>
#include <mutex>

namespace offloadd::ipc {
namespace {

struct State {
  std::mutex mu;
  double floor_seconds = 0, factor = 10, worker_rate = 0, store_rate = 0;
};

State& Global() {
  static State s;
  return s;
}

std::atomic<uint64_t> g_worker_kills{0}, g_store_kills{0};

}  // namespace

double LivenessPolicy::DeadlineSeconds(double work) const {
  if (floor_seconds <= 0) return 0;
  const double expected = work_per_second > 0 ? work / work_per_second : 0;
  return std::max(floor_seconds, factor * expected);
}

void SetLivenessPolicy(double floor_seconds, double factor) {
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  s.floor_seconds = floor_seconds;
  s.factor = factor;
}

void SetLivenessRates(double worker_params_per_second, double store_bytes_per_second) {
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  s.worker_rate = worker_params_per_second;
  s.store_rate = store_bytes_per_second;
}

LivenessPolicy WorkerLivenessPolicy() {
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  return {s.floor_seconds, s.factor, s.worker_rate};
}

LivenessPolicy StoreLivenessPolicy() {
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  return {s.floor_seconds, s.factor, s.store_rate};
}

void CountWatchdogKill(const std::string& kind) {
  (kind == "store" ? g_store_kills : g_worker_kills).fetch_add(1);
}

uint64_t WatchdogKills(const std::string& kind) {
  return (kind == "store" ? g_store_kills : g_worker_kills).load();
}

}  // namespace offloadd::ipc
