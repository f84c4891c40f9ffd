#include "ipc/event_fd.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>

namespace offloadd::ipc {

StatusOr<UniqueFd> MakeEventFd() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    return ErrnoError(errno, "eventfd (if EMFILE: raise the open-file limit with `ulimit -n`)");
  }
  return UniqueFd(fd);
}

void SignalEventFd(int fd) {
  const uint64_t one = 1;
  // EAGAIN means the counter is saturated, which already wakes the reader; nothing else can fail
  // on a valid eventfd, so the result is deliberately ignored.
  while (::write(fd, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

bool DrainEventFd(int fd) {
  uint64_t value = 0;
  ssize_t n;
  do {
    n = ::read(fd, &value, sizeof(value));
  } while (n < 0 && errno == EINTR);
  return n == sizeof(value) && value != 0;
}

Status WaitReadable(int fd, int abort_fd, int timeout_ms) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  pollfd fds[2] = {{fd, POLLIN, 0}, {abort_fd, POLLIN, 0}};
  const nfds_t nfds = abort_fd >= 0 ? 2 : 1;
  for (;;) {
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      wait_ms = left.count() < 0 ? 0 : static_cast<int>(left.count());
    }
    const int rc = ::poll(fds, nfds, wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "poll on eventfd");
    }
    if (nfds == 2 && fds[1].revents != 0) return UnavailableError("peer process exited");
    if (fds[0].revents & (POLLERR | POLLNVAL)) return InternalError("eventfd is invalid");
    if (fds[0].revents != 0) return OkStatus();
    if (rc == 0) return Status(StatusCode::kDeadlineExceeded, "timed out waiting on a ring queue");
  }
}

}  // namespace offloadd::ipc
