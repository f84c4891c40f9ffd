#include "common/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace offloadd {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, PropagatesFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  const auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().ToString(), "INVALID_ARGUMENT: odd: 3");
}

TEST(StatusTest, ContextKeepsCode) {
  const Status s = NotFoundError("x").WithContext("loading model");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "loading model: x");
  EXPECT_TRUE(OkStatus().WithContext("ignored").ok());
}

TEST(StatusTest, ErrnoMapping) {
  EXPECT_EQ(ErrnoError(ENOSPC, "write /nvme0/x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoError(ENOENT, "open").code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoError(EIO, "read").code(), StatusCode::kDataLoss);
  EXPECT_NE(ErrnoError(EACCES, "open /etc/x").message().find("open /etc/x: "), std::string::npos);
}

}  // namespace
}  // namespace offloadd
