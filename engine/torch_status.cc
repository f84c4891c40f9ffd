#include "engine/torch_status.h"

#include <c10/util/Exception.h>

#include <new>

namespace offloadd::engine {

Status TorchErrorStatus(const std::string& context, const std::exception& e) {
  if (const auto* oom = dynamic_cast<const c10::OutOfMemoryError*>(&e)) {
    return ResourceExhaustedError(context + ": " + oom->what_without_backtrace());
  }
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return ResourceExhaustedError(context + ": out of host memory (" + e.what() + ")");
  }
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    return InternalError(context + ": " + c10->what_without_backtrace());
  }
  return InternalError(context + ": " + e.what());
}

}  // namespace offloadd::engine
