#pragma once
// The offloadd daemon's lifecycle: from a loaded config to serving, and back down on SIGTERM.

#include "daemon/config/config.h"
#include "daemon/jobs/job_manager.h"

namespace offloadd::daemon {

// What CreateJob admits a job against (JobManager::Submit): the config's allowed roots, and the
// node as probed at each call (memory, GPUs, store directories) with the config's defaults.
JobManager::Options JobManagerOptionsFor(const DaemonConfig& config, int gpus);

// Serves until SIGTERM/SIGINT, then drains and returns the process exit code (0 on a clean stop).
int RunDaemon(const DaemonConfig& config);

}  // namespace offloadd::daemon
