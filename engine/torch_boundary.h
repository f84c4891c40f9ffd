#pragma once
// The LibTorch boundary: the one place a LibTorch exception becomes a Status (STYLE.md:
// exceptions only at the library's boundary, converted once). Code that calls LibTorch runs it
// through RunTorch(operation, fn), or catches std::exception and returns
// TorchErrorStatus(operation, e) where a try block must span more than one callable:
//   - c10::OutOfMemoryError (CUDA's caching allocator, and any allocator that reports it), the
//     CPU allocator's failure (a plain c10::Error, known by its message) and std::bad_alloc are
//     RESOURCE_EXHAUSTED: the job asked for more memory than it has, which a smaller micro-batch
//     or a larger budget fixes, not a bug. The bytes the operation needed are named when the
//     caller knows them;
//   - any other c10::Error is INTERNAL, with LibTorch's message without its C++ backtrace;
//   - any other std::exception is INTERNAL with its what().
// The message is "<operation>: <LibTorch's message>". Thread-safe.
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include "common/status.h"

namespace offloadd::engine {

// `bytes`: what the operation allocates, when the caller knows it (0: unknown); named in the
// message of an out-of-memory error.
Status TorchErrorStatus(const std::string& operation, const std::exception& e, uint64_t bytes = 0);

namespace torch_boundary_internal {
template <typename R>
struct Result {
  using type = StatusOr<R>;
};
template <>
struct Result<void> {
  using type = Status;
};
template <>
struct Result<Status> {
  using type = Status;
};
template <typename T>
struct Result<StatusOr<T>> {
  using type = StatusOr<T>;
};
}  // namespace torch_boundary_internal

// Runs fn() and returns what it returns, as a Status (fn returns void or Status) or a StatusOr<T>
// (fn returns T or StatusOr<T>); an exception it throws becomes TorchErrorStatus(operation, e,
// bytes).
template <typename Fn>
auto RunTorch(const std::string& operation, Fn&& fn, uint64_t bytes = 0) ->
    typename torch_boundary_internal::Result<std::invoke_result_t<Fn&>>::type {
  using R = std::invoke_result_t<Fn&>;
  using Out = typename torch_boundary_internal::Result<R>::type;
  try {
    if constexpr (std::is_void_v<R>) {
      fn();
      return OkStatus();
    } else {
      return Out(fn());
    }
  } catch (const std::exception& e) {
    return Out(TorchErrorStatus(operation, e, bytes));
  }
}

}  // namespace offloadd::engine
