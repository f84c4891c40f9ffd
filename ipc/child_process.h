#pragma once
// One launcher for the daemon's helper processes (offloadd-worker, offloadd-store):
// fork + exec of `binary args... --control-fd=3` with
//   - the child's end of a SOCK_SEQPACKET socketpair as fd 3 (the control channel: the versioned
//     hello with the shared-memory fds, the ready handshake, and EOF when either side is gone);
//   - every other inherited fd closed (close_range), so a helper never holds the daemon's sockets,
//     files or another helper's channel;
//   - SIGKILL as its parent-death signal (checked against a parent that died before prctl);
//   - a pidfd for the parent, so that waits end when the child dies.
// The component sends its own hello over `control` and decodes exits with DescribeExit.
#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "ipc/unique_fd.h"

namespace offloadd::ipc {

struct ChildProcess {
  pid_t pid = -1;
  UniqueFd pidfd;    // invalid where pidfd_open is unavailable (then the control socket's EOF)
  UniqueFd control;  // the parent's end of the control socketpair
};

// The child execs `binary` with `args` and "--control-fd=3" appended. Errors: socketpair or fork
// failed (an exec failure shows as exit code 127, see DescribeExit).
StatusOr<ChildProcess> LaunchChild(const std::string& binary, const std::vector<std::string>& args);

// "exited with code 3", "killed by signal 9 (Killed)", with "(could not be executed)" for 127.
std::string DescribeExit(int wait_status);

}  // namespace offloadd::ipc
