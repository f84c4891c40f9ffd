#include "daemon/systemd/sd_notify.h"

#include <systemd/sd-daemon.h>

#include <string>

namespace offloadd::daemon {

Status SdNotify(std::string_view state) {
  const std::string text(state);  // sd_notify wants a NUL-terminated string
  // unset_environment=0: later notifications (STOPPING=1, WATCHDOG=1) need NOTIFY_SOCKET too.
  const int rc = sd_notify(0, text.c_str());
  if (rc < 0) return ErrnoError(-rc, "sd_notify");
  return OkStatus();  // rc 0: not started by systemd
}

StatusOr<std::optional<std::chrono::microseconds>> SdWatchdogInterval() {
  uint64_t usec = 0;
  const int rc = sd_watchdog_enabled(0, &usec);
  if (rc < 0) return ErrnoError(-rc, "sd_watchdog_enabled (WATCHDOG_USEC / WATCHDOG_PID)");
  if (rc == 0) return std::optional<std::chrono::microseconds>();
  return std::optional<std::chrono::microseconds>(std::chrono::microseconds(usec));
}

}  // namespace offloadd::daemon
