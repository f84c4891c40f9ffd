#include "engine/torch_boundary.h"

#include <c10/util/Exception.h>

#include <new>
#include <string>

namespace offloadd::engine {
namespace {

Status OutOfMemory(const std::string& operation, const std::string& what, uint64_t bytes) {
  std::string msg = operation + ": " + what;
  if (bytes > 0) msg += " (the operation needs " + std::to_string(bytes) + " bytes)";
  return ResourceExhaustedError(std::move(msg));
}

}  // namespace

Status TorchErrorStatus(const std::string& operation, const std::exception& e, uint64_t bytes) {
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    return OutOfMemory(operation, oom->what_without_backtrace(), bytes);
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return OutOfMemory(operation, std::string("out of host memory (") + e.what() + ")", bytes);
  }
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    // The CPU allocator reports a failed allocation as a plain c10::Error (an enforce), not as
    // OutOfMemoryError: its message is the only mark.
    const std::string msg = c10->what_without_backtrace();
    if (msg.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
        msg.find("DefaultCPUAllocator: not enough memory") != std::string::npos) {
      return OutOfMemory(operation, msg, bytes);
    }
    return InternalError(operation + ": " + msg);
  }
  return InternalError(operation + ": " + e.what());
}

}  // namespace offloadd::engine
