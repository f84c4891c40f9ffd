#include "engine/torch_status.h"

#include <c10/util/Exception.h>

#include <new>
#include <string>

namespace offloadd::engine {

Status TorchErrorStatus(const std::string& context, const std::exception& e) {
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    return ResourceExhaustedError(context + ": " + oom->what_without_backtrace());
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return ResourceExhaustedError(context + ": out of host memory (" + e.what() + ")");
  }
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    // The CPU allocator reports a failed allocation as a plain c10::Error (an enforce), not as
    // OutOfMemoryError: its message is the only mark.
    const std::string msg = c10->what_without_backtrace();
    if (msg.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
        msg.find("DefaultCPUAllocator: not enough memory") != std::string::npos) {
      return ResourceExhaustedError(context + ": " + msg);
    }
    return InternalError(context + ": " + msg);
  }
  return InternalError(context + ": " + e.what());
}

}  // namespace offloadd::engine
