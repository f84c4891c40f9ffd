#pragma once
// eventfd wake-ups for ring queues, and a blocking wait that also watches a "peer died" fd
// (a pidfd, or the Unix socket to the peer) so nobody waits forever on a dead process.

#include "common/status.h"
#include "ipc/unique_fd.h"

namespace offloadd::ipc {

// A non-blocking, close-on-exec eventfd (counter mode).
StatusOr<UniqueFd> MakeEventFd();

// Adds 1 to the eventfd's counter. Never blocks; a saturated counter already means "wake up".
void SignalEventFd(int fd);

// Reads the counter back to zero (non-blocking). Returns true if it was non-zero.
bool DrainEventFd(int fd);

// Blocks until `fd` is readable (OK), `abort_fd` is readable or hung up (UNAVAILABLE, e.g. the
// peer's pidfd when it exits), or `timeout_ms` passes (DEADLINE_EXCEEDED; -1 waits forever).
// abort_fd may be -1. Restarts after EINTR with the remaining time.
Status WaitReadable(int fd, int abort_fd, int timeout_ms);

}  // namespace offloadd::ipc
