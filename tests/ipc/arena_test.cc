#include "ipc/arena.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

namespace offloadd::ipc {
namespace {

TEST(ArenaTest, AllocateFindAndAccountAcrossProcesses) {
  auto seg = SharedSegment::Create(8 << 20, {.name = "arena"});
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto arena = Arena::Format(&*seg, {.max_regions = 16});
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  auto grad = arena->Allocate("L0.grad", RegionKind::kGradStaging, 1000);
  auto master = arena->Allocate("L0.master", RegionKind::kMaster, 4096 * 3);
  ASSERT_TRUE(grad.ok() && master.ok());
  EXPECT_EQ(grad->offset % 4096, 0u);
  EXPECT_GE(master->offset, grad->offset + 4096);
  std::memset(arena->At<uint8_t>(grad->offset), 7, 1000);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto child_seg = SharedSegment::Attach(seg->fd());
    if (!child_seg.ok()) _exit(1);
    auto child = Arena::Open(&*child_seg);
    if (!child.ok()) _exit(2);
    auto g = child->Find("L0.grad");
    if (!g.ok() || g->size != 1000 || child->At<uint8_t>(g->offset)[999] != 7) _exit(3);
    if (!child->Allocate("L0.exp_avg", RegionKind::kExpAvg, 64).ok()) _exit(4);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);

  auto m = arena->Find("L0.exp_avg");  // allocated by the child
  ASSERT_TRUE(m.ok());
  const ArenaStats s = arena->Stats();
  EXPECT_EQ(s.live_regions, 3u);
  EXPECT_EQ(s.bytes_by_kind[static_cast<size_t>(RegionKind::kGradStaging)], 1000u);
  EXPECT_EQ(s.bytes_by_kind[static_cast<size_t>(RegionKind::kMaster)], 4096u * 3);
  EXPECT_EQ(s.bytes_by_kind[static_cast<size_t>(RegionKind::kExpAvg)], 64u);
  EXPECT_EQ(s.used_bytes, 4096u * 5);
  EXPECT_EQ(RegionKindName(RegionKind::kExpAvgSq), "exp_avg_sq");

  ASSERT_TRUE(arena->Release("L0.grad").ok());
  EXPECT_EQ(arena->Find("L0.grad").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(arena->Stats().bytes_by_kind[0], 0u);
  EXPECT_EQ(arena->List().size(), 2u);
}

TEST(ArenaTest, RejectsDuplicatesBadNamesAndOverflow) {
  auto seg = SharedSegment::Create(1 << 20);
  ASSERT_TRUE(seg.ok());
  auto arena = Arena::Format(&*seg, {.max_regions = 3});
  ASSERT_TRUE(arena.ok());
  ASSERT_TRUE(arena->Allocate("a", RegionKind::kOther, 10).ok());
  EXPECT_EQ(arena->Allocate("a", RegionKind::kOther, 10).status().code(),
            StatusCode::kAlreadyExists);
  EXPECT_EQ(arena->Allocate("", RegionKind::kOther, 10).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->Allocate(std::string(100, 'x'), RegionKind::kOther, 10).status().code(),
            StatusCode::kInvalidArgument);
  auto big = arena->Allocate("big", RegionKind::kMaster, 64 << 20);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("/dev/shm"), std::string::npos) << big.status().ToString();
  ASSERT_TRUE(arena->Allocate("b", RegionKind::kOther, 10).ok());
  auto full = arena->Allocate("c", RegionKind::kOther, 10);  // the failed "big" used a slot
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("max_regions"), std::string::npos);
}

TEST(ArenaTest, CheckValidatesPeerOffsets) {
  auto seg = SharedSegment::Create(1 << 20);
  ASSERT_TRUE(seg.ok());
  auto arena = Arena::Format(&*seg);
  ASSERT_TRUE(arena.ok());
  auto r = arena->Allocate("r", RegionKind::kOther, 100);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(arena->Check(r->offset, 100).ok());
  EXPECT_TRUE(arena->Check(r->offset + 50, 50).ok());
  EXPECT_EQ(arena->Check(r->offset + 50, 51).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(arena->Check(~uint64_t{0} - 4, 8).code(), StatusCode::kOutOfRange);
}

TEST(ArenaTest, OpenRefusesUnformattedAndCorruptHeaders) {
  auto seg = SharedSegment::Create(1 << 20);
  ASSERT_TRUE(seg.ok());
  auto raw = Arena::Open(&*seg);
  ASSERT_FALSE(raw.ok());
  EXPECT_NE(raw.status().message().find("bad arena magic"), std::string::npos);

  ASSERT_TRUE(Arena::Format(&*seg).ok());
  uint8_t* h = seg->base() + seg->header().data_offset;
  uint64_t table_offset;
  std::memcpy(&table_offset, h + 32, 8);  // Header::table_offset
  const uint64_t bogus = uint64_t{1} << 50;
  std::memcpy(h + 32, &bogus, 8);
  auto corrupt = Arena::Open(&*seg);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(corrupt.status().message().find("corrupt"), std::string::npos);
  std::memcpy(h + 32, &table_offset, 8);
  EXPECT_TRUE(Arena::Open(&*seg).ok());

  // A table offset that is in bounds but not aligned would give misaligned atomics.
  const uint64_t misaligned = table_offset + 8;
  std::memcpy(h + 32, &misaligned, 8);
  auto unaligned = Arena::Open(&*seg);
  ASSERT_FALSE(unaligned.ok());
  EXPECT_NE(unaligned.status().message().find("misaligned"), std::string::npos);
  std::memcpy(h + 32, &table_offset, 8);
  EXPECT_TRUE(Arena::Open(&*seg).ok());

  h[8] = 99;  // version
  auto old = Arena::Open(&*seg);
  ASSERT_FALSE(old.ok());
  EXPECT_NE(old.status().message().find("restart all offloadd processes"), std::string::npos);
}

// A live region whose offset points past the heap: views built on it (rings, tensors) would read
// outside the mapping, so Open refuses the arena and names the region.
TEST(ArenaTest, OpenRefusesARegionOutsideTheHeap) {
  auto seg = SharedSegment::Create(1 << 20);
  ASSERT_TRUE(seg.ok());
  auto arena = Arena::Format(&*seg);
  ASSERT_TRUE(arena.ok());
  auto r = arena->Allocate("ring", RegionKind::kQueue, 4096);
  ASSERT_TRUE(r.ok());
  const uint8_t* h = seg->base() + seg->header().data_offset;
  uint64_t table_offset;
  std::memcpy(&table_offset, h + 32, 8);
  uint8_t* entry = seg->base() + table_offset;  // Entry 0: state, kind, offset, size, name
  for (const uint64_t bad : {uint64_t{1} << 40, r->offset + 1}) {
    std::memcpy(entry + 8, &bad, 8);
    auto opened = Arena::Open(&*seg);
    ASSERT_FALSE(opened.ok()) << bad;
    EXPECT_NE(opened.status().message().find("region 'ring' is corrupt"), std::string::npos)
        << opened.status().ToString();
  }
  std::memcpy(entry + 8, &r->offset, 8);
  EXPECT_TRUE(Arena::Open(&*seg).ok());
}

}  // namespace
}  // namespace offloadd::ipc
