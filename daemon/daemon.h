#pragma once
// The offloadd daemon's lifecycle: from a loaded config to serving, and back down on SIGTERM.

#include "daemon/config/config.h"

namespace offloadd::daemon {

// Serves until SIGTERM/SIGINT, then drains and returns the process exit code (0 on a clean stop).
int RunDaemon(const DaemonConfig& config);

}  // namespace offloadd::daemon
