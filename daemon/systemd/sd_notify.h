#pragma once
// systemd readiness protocol (sd_notify) spoken directly over $NOTIFY_SOCKET, so there is no
// libsystemd dependency. A no-op returning OK when not started by systemd (no NOTIFY_SOCKET).

#include <string_view>

#include "common/status.h"

namespace offloadd::daemon {

// Sends e.g. "READY=1\nSTATUS=serving on /run/offloadd/offloadd.sock".
Status SdNotify(std::string_view state);

}  // namespace offloadd::daemon
