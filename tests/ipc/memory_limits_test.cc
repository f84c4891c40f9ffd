#include "ipc/memory_limits.h"

#include <gtest/gtest.h>

namespace offloadd::ipc {
namespace {

TEST(MemoryLimitsTest, ShmTooSmallNamesTheFix) {
  EXPECT_TRUE(CheckShmSpace(4096).ok());
  Status st = CheckShmSpace(uint64_t{1} << 60);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("--shm-size"), std::string::npos) << st.ToString();
}

TEST(MemoryLimitsTest, MemlockBeyondHardLimitNamesTheFix) {
  Status st = EnsureMemlock(uint64_t{1} << 62);
  if (st.ok()) GTEST_SKIP() << "RLIMIT_MEMLOCK is unlimited here";
  EXPECT_NE(st.message().find("RLIMIT_MEMLOCK"), std::string::npos);
  EXPECT_NE(st.message().find("LimitMEMLOCK"), std::string::npos);
}

TEST(MemoryLimitsTest, HugePagesShortfallNamesSysctl) {
  Status st = CheckHugePages(uint64_t{1} << 50);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vm.nr_hugepages="), std::string::npos);
}

}  // namespace
}  // namespace offloadd::ipc
