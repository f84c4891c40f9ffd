#pragma once
// Liveness deadlines on a process's waits for its child processes: an optimizer
// worker (workers::WorkerPool) or the NVMe store (storage::StoreProcess) that holds work and
// completes none of it within the deadline is stopped, wedged in the kernel or deadlocked; it
// shows no death, so the waiter kills it (SIGKILL) and recovers as after its crash.
//
// The deadline of outstanding work is max(floor_seconds, factor x its expected time), the expected
// time being the work (parameters for a worker, bytes for the store) over the node profile's rate
// (0: unknown, the floor alone); floor_seconds 0 means no deadline.
//
// Like SetAllowedRoots (common/safe_path.h), the policy is the process's: offloadd-executor sets it
// from the daemon's jobs.liveness before it builds the trainer, and the trainer adds the node
// profile's rates once measured. Waits read it when they check, so a later setting applies to
// pools and stores already running. Thread-safe.
#include <cstdint>
#include <string>

namespace offloadd::ipc {

struct LivenessPolicy {
  double floor_seconds = 0;
  double factor = 10;
  double work_per_second = 0;  // the node profile's rate; 0: unknown
  // The deadline of `work` (parameters, bytes) outstanding; 0: none.
  double DeadlineSeconds(double work) const;
};

// jobs.liveness.floor_seconds and factor for this process (default: no deadlines).
void SetLivenessPolicy(double floor_seconds, double factor);
// The node profile's AdamW rate (parameters/s) and NVMe store rate (bytes/s); 0: unknown.
void SetLivenessRates(double worker_params_per_second, double store_bytes_per_second);
LivenessPolicy WorkerLivenessPolicy();
LivenessPolicy StoreLivenessPolicy();

// Children this process killed for missing their deadline, by kind ("worker", "store"): the
// executor reports them for offloadd_watchdog_kills_total.
void CountWatchdogKill(const std::string& kind);
uint64_t WatchdogKills(const std::string& kind);

}  // namespace offloadd::ipc
