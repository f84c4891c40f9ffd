#pragma once
// Preparing the daemon's Unix socket path: create the parent directory, remove a stale socket
// left by a crashed daemon, and refuse to steal a socket another live daemon is serving.

#include <memory>
#include <string>

#include "common/status.h"

namespace offloadd::daemon {

// Call before binding. FAILED_PRECONDITION if something accepts connections on `path` already
// or if `path` exists and is not a socket. `setting` names the path's setting in errors.
Status PrepareUnixSocketPath(const std::string& path,
                             const std::string& setting = "server.unix_socket");

// chmod after binding (gRPC creates the socket with the process umask).
Status SetSocketMode(const std::string& path, unsigned mode);

// Binds the socket where nobody can reach it, then publishes it: a 0700 directory is made beside
// the final path; the server binds bind_path() inside it; Publish(mode) chmods the socket there
// and renames it onto the final path, so it never exists at that path with another mode. The
// directory is removed by Publish or the destructor. Not thread-safe.
class PrivateSocketBinding {
 public:
  static StatusOr<std::unique_ptr<PrivateSocketBinding>> Create(
      const std::string& final_path, const std::string& setting = "server.unix_socket");
  ~PrivateSocketBinding();
  const std::string& bind_path() const { return bind_path_; }
  Status Publish(unsigned mode);

 private:
  std::string dir_, bind_path_, final_path_;
};

}  // namespace offloadd::daemon
