#include "ipc/memory_limits.h"

#include <sys/mman.h>

#include <gtest/gtest.h>

#include "ipc/numa.h"

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

namespace offloadd::ipc {
namespace {

TEST(NumaTest, BindsToNodeZeroAndRejectsBadNodes) {
  const size_t bytes = 1 << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  static_cast<char*>(p)[0] = 1;
  Status st = BindToNumaNode(p, bytes, 0);
  if (st.code() == StatusCode::kUnimplemented ||
      st.message().find("Function not implemented") != std::string::npos) {
    munmap(p, bytes);
    GTEST_SKIP() << "kernel without NUMA support: " << st.ToString();
  }
  EXPECT_TRUE(st.ok()) << st.ToString();
  Status bad = BindToNumaNode(p, bytes, 4000);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("NUMA node 4000"), std::string::npos) << bad.ToString();
  EXPECT_EQ(BindToNumaNode(static_cast<char*>(p) + 1, 100, 0).code(), StatusCode::kInvalidArgument);
  munmap(p, bytes);
}

}  // namespace
}  // namespace offloadd::ipc
