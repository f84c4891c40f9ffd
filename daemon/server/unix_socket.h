#pragma once
// Preparing the daemon's Unix socket path: create the parent directory, remove a stale socket
// left by a crashed daemon, and refuse to steal a socket another live daemon is serving.

#include <string>

#include "common/status.h"

namespace offloadd::daemon {

// Call before binding. FAILED_PRECONDITION if something accepts connections on `path` already
// or if `path` exists and is not a socket.
Status PrepareUnixSocketPath(const std::string& path);

// chmod after binding (gRPC creates the socket with the process umask).
Status SetSocketMode(const std::string& path, unsigned mode);

}  // namespace offloadd::daemon
