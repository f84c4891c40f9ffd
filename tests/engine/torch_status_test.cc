// LibTorch's exceptions become a Status once (engine/torch_status.h): out of memory is
// RESOURCE_EXHAUSTED, not INTERNAL (issue #29 item 22: a 7B LSP job's CUDA out-of-memory error
// in layer 31's backward reached the job as INTERNAL).
#include "engine/torch_status.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

namespace offloadd::engine {
namespace {

template <typename Fn>
Status Caught(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return TorchErrorStatus("model.layers.31 backward", e);
  }
  return OkStatus();
}

TEST(TorchErrorStatusTest, OutOfMemoryIsResourceExhausted) {
  const Status s = Caught([] {
    TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 1010.00 MiB");
  });
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find(
                "model.layers.31 backward: CUDA out of memory. Tried to allocate 1010.00 MiB"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("Exception raised from"), std::string::npos)
      << "no C++ backtrace: " << s.message();
  EXPECT_EQ(Caught([] { throw std::bad_alloc(); }).code(), StatusCode::kResourceExhausted);
}

TEST(TorchErrorStatusTest, TheCpuAllocatorsFailureIsResourceExhausted) {
  // A real allocation LibTorch cannot make (1 PiB): its CPU allocator throws a plain c10::Error.
  const Status s = Caught([] { (void)at::empty({int64_t{1} << 50}, at::kByte); });
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("1125899906842624 bytes"), std::string::npos) << s.message();
}

TEST(TorchErrorStatusTest, OtherErrorsAreInternal) {
  const Status s = Caught([] { TORCH_CHECK(false, "shapes differ"); });
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("model.layers.31 backward: shapes differ"), std::string::npos)
      << s.message();
  EXPECT_EQ(Caught([] { throw std::runtime_error("boom"); }).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace offloadd::engine
