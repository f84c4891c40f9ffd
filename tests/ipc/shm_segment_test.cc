#include "ipc/shm_segment.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

namespace offloadd::ipc {
namespace {

TEST(SharedSegmentTest, ChildSeesParentWritesAndViceVersa) {
  auto seg = SharedSegment::Create(1 << 20, {.name = "test"});
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  ASSERT_GE(seg->data_size(), 1u << 20);
  std::memset(seg->data(), 0x5a, 4096);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto child = SharedSegment::Attach(seg->fd());
    if (!child.ok() || child->data()[100] != 0x5a) _exit(1);
    child->data()[200] = 0x33;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(seg->data()[200], 0x33);
  EXPECT_STREQ(seg->header().name, "test");
}

TEST(SharedSegmentTest, AttachRejectsForeignFd) {
  int fd = memfd_create("foreign", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  auto seg = SharedSegment::Attach(fd);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(seg.status().message().find("bad magic"), std::string::npos);
  close(fd);
}

TEST(SharedSegmentTest, AttachRejectsOtherVersion) {
  auto seg = SharedSegment::Create(4096);
  ASSERT_TRUE(seg.ok());
  const_cast<SegmentHeader&>(seg->header()).version = kSegmentVersion + 1;
  auto other = SharedSegment::Attach(seg->fd());
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("restart all offloadd processes"), std::string::npos);
}

// Found by the worker_protocol fuzzer in CI: a segment whose data offset is not page-aligned made
// Arena::Open read its header through a misaligned pointer (UBSan). Attach refuses it.
TEST(SharedSegmentTest, AttachRejectsMisalignedOrOverlappingDataOffset) {
  for (const uint64_t offset : {uint64_t{4097}, uint64_t{8}, uint64_t{0}}) {
    auto seg = SharedSegment::Create(8192);
    ASSERT_TRUE(seg.ok());
    const_cast<SegmentHeader&>(seg->header()).data_offset = offset;
    auto other = SharedSegment::Attach(seg->fd());
    ASSERT_FALSE(other.ok()) << offset;
    EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(other.status().message().find("data offset " + std::to_string(offset)),
              std::string::npos)
        << other.status().ToString();
  }
}

TEST(SharedSegmentTest, HugePagesFallBackWithReason) {
  auto seg = SharedSegment::Create(4096, {.name = "huge", .try_huge_pages = true});
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  if (!seg->huge_pages()) {
    EXPECT_NE(seg->hugepage_fallback_reason().find("nr_hugepages"), std::string::npos);
  }
  seg->data()[0] = 1;
}

TEST(SharedSegmentTest, TooLargeNamesTheLimit) {
  auto seg = SharedSegment::Create(size_t{1} << 62);
  ASSERT_FALSE(seg.ok());
  EXPECT_NE(seg.status().ToString().find("bytes"), std::string::npos) << seg.status().ToString();
}

}  // namespace
}  // namespace offloadd::ipc
