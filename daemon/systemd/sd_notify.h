#pragma once
// systemd's readiness and watchdog protocol through libsystemd (sd_notify(3),
// sd_watchdog_enabled(3)). Both are no-ops when the daemon was not started by systemd (no
// NOTIFY_SOCKET, no WATCHDOG_USEC for this pid). Thread-safe (libsystemd opens a socket per call).

#include <chrono>
#include <optional>
#include <string_view>

#include "common/status.h"

namespace offloadd::daemon {

// Sends e.g. "READY=1\nSTATUS=serving on /run/offloadd/offloadd.sock". OK when there is no
// NOTIFY_SOCKET; an error naming the errno when the notification could not be sent.
Status SdNotify(std::string_view state);

// The unit's WatchdogSec when systemd expects "WATCHDOG=1" from this process at least that often
// (WATCHDOG_USEC set, and WATCHDOG_PID unset or this pid); nullopt otherwise. An unparsable
// WATCHDOG_USEC is an error.
StatusOr<std::optional<std::chrono::microseconds>> SdWatchdogInterval();

}  // namespace offloadd::daemon
