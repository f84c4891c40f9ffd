// Manifest framing and replay, identity files, and the extent allocator.
#include "storage/format.h"

#include <gtest/gtest.h>

#include "storage/extent_allocator.h"

namespace offloadd::storage {
namespace {

ManifestEntry Commit(uint32_t layer, uint64_t version) {
  ManifestEntry e;
  e.record.key = {layer, static_cast<uint32_t>(TensorKind::kAdamM), 0};
  e.record.version = version;
  e.record.size = 3 * 4096 + 5;
  e.record.chunk_bytes = 4096;
  e.record.extents = {{0, 8192, 8192}, {1, 0, 8192}};
  e.record.chunks = {{0, 11}, {1, 22}, {0, 33}, {1, 44}};
  return e;
}

std::vector<uint8_t> Frame(std::vector<ManifestEntry> entries) {
  std::vector<std::vector<uint8_t>> encoded(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) EncodeEntry(entries[i], &encoded[i]);
  std::vector<uint8_t> out;
  EncodeFrame(encoded, &out);
  return out;
}

TEST(ManifestTest, FramesRoundTripAndChunkOffsetsFollowSlots) {
  auto image = Frame({Commit(1, 1), Commit(2, 1)});
  auto second = Frame({Commit(1, 2)});
  image.insert(image.end(), second.begin(), second.end());
  auto r = ReplayManifest(image);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->torn_tail);
  EXPECT_EQ(r->valid_bytes, image.size());
  ASSERT_EQ(r->entries.size(), 3u);
  const TensorRecord& rec = r->entries[2].record;
  EXPECT_EQ(rec.key.layer, 1u);
  EXPECT_EQ(rec.version, 2u);
  EXPECT_TRUE(rec.Validate(2).ok());
  EXPECT_FALSE(rec.Validate(1).ok());  // refers to directory 1
  EXPECT_EQ(rec.ChunkOffsets(), (std::vector<uint64_t>{8192, 0, 12288, 4096}));
  EXPECT_EQ(rec.chunk_len(3), 5u);
}

TEST(ManifestTest, DamageInsideTheLastFrameIsATornTail) {
  auto image = Frame({Commit(1, 1)});
  const size_t good = image.size();
  auto last = Frame({Commit(1, 2), Commit(2, 2), Commit(3, 2)});
  // A crash mid-append: the last frame's later bytes reached the disk, a middle page did not.
  for (size_t i = 40; i < 80; ++i) last[i] = 0;
  image.insert(image.end(), last.begin(), last.end());
  auto r = ReplayManifest(image);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->torn_tail);
  EXPECT_EQ(r->valid_bytes, good);
  EXPECT_EQ(r->entries.size(), 1u);
  // Cut short, too.
  image.resize(good + 10);
  r = ReplayManifest(image);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->torn_tail);
}

TEST(ManifestTest, DamageBeforeAValidFrameIsCorruption) {
  auto image = Frame({Commit(1, 1)});
  image[20] ^= 0xff;
  auto next = Frame({Commit(1, 2)});
  image.insert(image.end(), next.begin(), next.end());
  auto r = ReplayManifest(image);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("byte 0"), std::string::npos) << r.status().message();
}

TEST(IdentityTest, RoundTripsAndDetectsDamage) {
  StoreIdentity id;
  for (int i = 0; i < 16; ++i) id.uuid[i] = static_cast<uint8_t>(i * 7);
  id.dir_index = 2;
  id.dir_count = 3;
  auto bytes = EncodeIdentity(id);
  auto back = DecodeIdentity(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dir_index, 2u);
  EXPECT_EQ(back->dir_count, 3u);
  bytes[20] ^= 1;
  EXPECT_EQ(DecodeIdentity(bytes).status().code(), StatusCode::kDataLoss);
  bytes[0] ^= 1;
  EXPECT_EQ(DecodeIdentity(bytes).status().code(), StatusCode::kFailedPrecondition);
}

TEST(ExtentAllocatorTest, FirstFitCoalescingAndRecovery) {
  ExtentAllocator a;
  const uint64_t x = a.Allocate(5000);  // rounds to 8 KiB
  const uint64_t y = a.Allocate(4096);
  const uint64_t z = a.Allocate(4096);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, 8192u);
  EXPECT_EQ(z, 12288u);
  EXPECT_EQ(a.end(), 16384u);
  a.Free(x, 5000);
  a.Free(y, 4096);  // coalesces with x's range
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_EQ(a.Allocate(16384), 16384u);  // larger than the 12 KiB hole: from the end
  a.Free(16384, 16384);                  // back to the end pointer
  EXPECT_EQ(a.end(), 16384u);
  EXPECT_EQ(a.Allocate(12288), 0u);  // exactly the hole
  EXPECT_EQ(a.used_bytes(), 12288u + 4096u);

  ExtentAllocator r;
  r.MarkUsed(8192, 4096);
  r.MarkUsed(20480, 8192);
  r.FinishRecovery();
  EXPECT_EQ(r.end(), 28672u);
  EXPECT_EQ(r.used_bytes(), 12288u);
  EXPECT_EQ(r.Allocate(8192), 0u);      // the gap before 8192
  EXPECT_EQ(r.Allocate(8192), 12288u);  // the gap between the two
  EXPECT_EQ(r.Allocate(4096), 28672u);  // nothing left below the end
}

}  // namespace
}  // namespace offloadd::storage
