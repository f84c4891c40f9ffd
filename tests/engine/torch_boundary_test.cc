// LibTorch's exceptions become a Status once (engine/torch_boundary.h): out of memory is
// RESOURCE_EXHAUSTED, not INTERNAL (a 7B LSP job's CUDA out-of-memory error in layer 31's
// backward once reached the job as INTERNAL), and every other error is INTERNAL naming the
// operation.
#include "engine/torch_boundary.h"

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

// RunTorch: the callable's result passes through; what it throws becomes the Status above.
TEST(RunTorchTest, AC10ErrorFromARealOpIsInternalNamingTheOperation) {
  const Status s = RunTorch("reshaping the logits", [] { (void)at::ones({2, 3}).view({4}); });
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_EQ(s.message().rfind("reshaping the logits: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("shape '[4]' is invalid for input of size 6"), std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find("Exception raised from"), std::string::npos) << s.message();
}

TEST(RunTorchTest, OutOfMemoryIsResourceExhaustedNamingTheOperationAndTheBytes) {
  const Status s = RunTorch(
      "model.layers.3 forward",
      []() -> Status {
        throw c10::OutOfMemoryError({"forward", "block.cc", 1},
                                    "CUDA out of memory. Tried to allocate 2.00 GiB");
      },
      uint64_t{2} << 30);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(s.message(),
            "model.layers.3 forward: CUDA out of memory. Tried to allocate 2.00 GiB (the operation "
            "needs 2147483648 bytes)");
  // Without the bytes, the message is LibTorch's alone.
  const Status unknown = RunTorch("step", [] {
    throw c10::OutOfMemoryError({"step", "x.cc", 1}, "CUDA out of memory.");
  });
  EXPECT_EQ(unknown.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(unknown.message(), "step: CUDA out of memory.");
}

TEST(RunTorchTest, ResultsPassThrough) {
  EXPECT_TRUE(RunTorch("nothing", [] {}).ok());
  EXPECT_EQ(RunTorch("status", [] { return NotFoundError("no such block"); }).code(),
            StatusCode::kNotFound);
  const StatusOr<int64_t> numel = RunTorch("numel", [] { return at::ones({2, 3}).numel(); });
  ASSERT_TRUE(numel.ok());
  EXPECT_EQ(*numel, 6);
  const StatusOr<int> inner = RunTorch("inner", []() -> StatusOr<int> { return 7; });
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ(*inner, 7);
  const StatusOr<int> failed = RunTorch("inner", []() -> StatusOr<int> {
    TORCH_CHECK(false, "bad dims");
    return 0;
  });
  EXPECT_EQ(failed.status().code(), StatusCode::kInternal);
  EXPECT_EQ(failed.status().message(), "inner: bad dims");
}

}  // namespace
}  // namespace offloadd::engine
