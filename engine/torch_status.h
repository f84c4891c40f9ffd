#pragma once
// The one mapping from a LibTorch exception to a Status (STYLE.md: exceptions only at the
// LibTorch boundary, converted once). Callers catch std::exception where LibTorch may throw and
// return TorchErrorStatus(what they were doing, e):
//   - c10::OutOfMemoryError (CUDA's caching allocator, and any allocator that reports it), the
//     CPU allocator's failure (a plain c10::Error, known by its message) and std::bad_alloc are
//     RESOURCE_EXHAUSTED: the job asked for more memory than it has, which a smaller micro-batch
//     or a larger budget fixes, not a bug;
//   - any other c10::Error is INTERNAL, with LibTorch's message without its C++ backtrace;
//   - any other std::exception is INTERNAL with its what().
// The message is "<context>: <LibTorch's message>". Thread-safe.
#include <exception>
#include <string>

#include "common/status.h"

namespace offloadd::engine {

Status TorchErrorStatus(const std::string& context, const std::exception& e);

}  // namespace offloadd::engine
