// PlaceBlockStates: RAM in block order while it lasts, the rest on NVMe, refused with the numbers
// when the disk is too small.
#include "trainer/state_placement.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

std::vector<BlockStateBytes> Blocks(std::initializer_list<uint64_t> gib) {
  std::vector<BlockStateBytes> out;
  for (uint64_t g : gib) out.push_back({g * kGiB, g * kGiB});
  return out;
}

TEST(StatePlacementTest, EverythingInRamWhenItFits) {
  auto p = PlaceBlockStates(Blocks({2, 3, 3}), 8 * kGiB, 0);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->ram_blocks(), 3);
  EXPECT_EQ(p->ram_bytes, 8 * kGiB);
  EXPECT_EQ(p->disk_bytes, 0u);
  EXPECT_EQ(p->nvme_blocks(), std::vector<bool>({false, false, false}));
  EXPECT_EQ(p->Describe(), "blocks 0-2 in RAM (8 GiB)");
}

TEST(StatePlacementTest, FirstBlocksInRamTheRestOnNvme) {
  auto p = PlaceBlockStates(Blocks({4, 3, 3, 3, 1}), 8 * kGiB, 100 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // 4 + 3 fit; 3 and 3 do not; the last, 1 GiB, still does.
  EXPECT_EQ(p->nvme_blocks(), std::vector<bool>({false, false, true, true, false}));
  EXPECT_EQ(p->ram_bytes, 8 * kGiB);
  EXPECT_EQ(p->disk_bytes, 6 * kGiB);
  EXPECT_EQ(p->Describe(), "blocks 0-1, 4 in RAM (8 GiB), 2-3 on NVMe (6 GiB)");
}

// The largest blocks first (the NVMe staging slots are sized by the largest block on NVMe), equal
// ones in block order.
TEST(StatePlacementTest, LargestBlocksFirst) {
  auto p = PlaceBlockStates(Blocks({2, 1, 1, 3}), 5 * kGiB, 100 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->nvme_blocks(), std::vector<bool>({false, true, true, false}));
  p = PlaceBlockStates(Blocks({2, 1, 1, 3}), 4 * kGiB, 100 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->nvme_blocks(), std::vector<bool>({true, false, true, false}));
}

TEST(StatePlacementTest, NoRamPutsEveryBlockOnNvme) {
  auto p = PlaceBlockStates(Blocks({1, 1}), 0, 2 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->ram_blocks(), 0);
  EXPECT_EQ(p->Describe(), "blocks 0-1 on NVMe (2 GiB)");
}

TEST(StatePlacementTest, BlocksOnTheDeviceTakeNothing) {
  std::vector<BlockStateBytes> b = Blocks({5, 5});
  b.insert(b.begin(), BlockStateBytes{});  // the embedding's states on the GPU
  auto p = PlaceBlockStates(b, 5 * kGiB, 5 * kGiB);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->nvme_blocks(), std::vector<bool>({false, false, true}));
}

TEST(StatePlacementTest, TooLittleDiskIsRefusedWithTheNumbers) {
  auto p = PlaceBlockStates(Blocks({4, 4, 4}), 4 * kGiB, 7 * kGiB);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(p.status().message(),
            "the optimizer states need 8 GiB on NVMe (2 of 3 blocks) beside 4 GiB in RAM, but "
            "the store directories have 7 GiB free; free disk space, add a store directory or "
            "raise the host memory limit");
}

// Under a host limit: the prediction with the placement stays within it, the blocks that fit are
// in RAM (the embedding and head first), and the disk check counts what is in flight for this
// placement's largest NVMe block.
TEST(StatePlacementTest, UnderALimitThePredictionFitsAndTheDiskIsExact) {
  HostMemoryInputs in;
  in.optimizer.tier = StateTier::kNvme;
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.block_elements = {1 << 21, 1 << 20, 1 << 20, 1 << 20, 1 << 20, (1 << 21) + 64};
  const HostMemoryPrediction all = PredictHostMemory(in);
  // Room for the states of the embedding, the head and half a layer (12 B per parameter); the
  // staging slots, sized for the head until it is in RAM, then free room for three layers more.
  const uint64_t limit = all.total + 12 * ((1 << 22) + 64 + (1 << 19));
  auto p = PlaceStatesUnderLimit(&in, limit, uint64_t{1} << 40);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(in.optimizer.nvme_blocks, std::vector<bool>({false, false, false, false, true, false}))
      << p->Describe();
  const HostMemoryPrediction placed = PredictHostMemory(in);
  EXPECT_LE(placed.total, limit);
  EXPECT_EQ(placed.nvme_params, uint64_t{1} << 20);
  // The disk: the states of block 4 and one new version per staging slot and one committing.
  EXPECT_EQ(placed.disk_bytes, 12u * (1 << 20) * (1 + 3 + 1));
  HostMemoryInputs again = in;
  ASSERT_TRUE(PlaceStatesUnderLimit(&again, limit, placed.disk_bytes).ok());
  auto short_disk = PlaceStatesUnderLimit(&again, limit, placed.disk_bytes - 1);
  ASSERT_FALSE(short_disk.ok());
  EXPECT_EQ(short_disk.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(short_disk.status().message().find(
                "(1 of 6 blocks, 12 MiB of states and the new versions in flight)"),
            std::string::npos)
      << short_disk.status().message();
  EXPECT_TRUE(again.optimizer.nvme_blocks.empty());  // refused: every block on NVMe again
}

}  // namespace
}  // namespace offloadd::trainer
