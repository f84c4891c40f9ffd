#include "job/checkpoint_placement.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Embedding, eight decoder layers with a 64 MiB input each, head.
CheckpointPlacementInputs EightLayers(uint64_t over) {
  CheckpointPlacementInputs in;
  in.bytes = {0,         64 * kMiB, 64 * kMiB, 64 * kMiB, 64 * kMiB,
              64 * kMiB, 64 * kMiB, 64 * kMiB, 64 * kMiB, 0};
  in.ram_over = over;
  in.nvme_configured = true;
  return in;
}

TEST(CheckpointPlacementTest, NothingMovesWhenRamHoldsThemAll) {
  const CheckpointPlacement p = PlaceCheckpoints(EightLayers(0));
  EXPECT_EQ(p.moved, 0);
  EXPECT_EQ(p.ram_bytes, 8 * 64 * kMiB);
  EXPECT_EQ(p.buffer_bytes, 0u);
  EXPECT_EQ(p.Describe(EightLayers(0)), "layer inputs: layers 0-7 in pinned RAM (512 MiB)");
}

TEST(CheckpointPlacementTest, NothingMovesWithoutAStoreDirectory) {
  CheckpointPlacementInputs in = EightLayers(100 * kMiB);
  in.nvme_configured = false;
  EXPECT_EQ(PlaceCheckpoints(in).moved, 0);
}

TEST(CheckpointPlacementTest, TheFewestLowestLayersFreeWhatTheLimitNeeds) {
  // Moving k inputs frees 64k MiB and costs the staging buffer (five records: 320 MiB), so 100 MiB
  // over needs k = 7 (448 - 320 = 128 >= 100; k = 6 frees 64).
  const CheckpointPlacementInputs in = EightLayers(100 * kMiB);
  const CheckpointPlacement p = PlaceCheckpoints(in);
  EXPECT_EQ(p.moved, 7);
  for (int b = 1; b <= 7; ++b) EXPECT_TRUE(p.to_nvme[b]) << b;
  EXPECT_FALSE(p.to_nvme[8]);
  EXPECT_FALSE(p.to_nvme[0]);
  EXPECT_EQ(p.ram_bytes, 64 * kMiB);
  EXPECT_EQ(p.nvme_bytes, 7 * 64 * kMiB);
  EXPECT_EQ(p.buffer_bytes, 5 * 64 * kMiB);
  EXPECT_EQ(p.disk_bytes, 12 * 64 * kMiB);  // seven records and five versions in flight
  EXPECT_NE(p.Describe(in).find("layers 0-6 on NVMe"), std::string::npos) << p.Describe(in);
  EXPECT_NE(p.Describe(in).find("layer 7 in pinned RAM (64 MiB)"), std::string::npos);
}

TEST(CheckpointPlacementTest, AllMoveWhenEvenThatIsNotEnough) {
  const CheckpointPlacement p = PlaceCheckpoints(EightLayers(10000 * kMiB));
  EXPECT_EQ(p.moved, 8);
  EXPECT_EQ(p.ram_bytes, 0u);
}

TEST(CheckpointPlacementTest, AnOffloadNvmeBufferIsSharedNotPaidTwice) {
  // The spill's buffer is there already for offload_nvme blocks (64 MiB floor, or five of their
  // records): a layer input's move costs only what it grows the buffer by.
  CheckpointPlacementInputs in = EightLayers(60 * kMiB);
  in.largest_keep_record = 100 * kMiB;  // 500 MiB buffer already
  const CheckpointPlacement p = PlaceCheckpoints(in);
  EXPECT_EQ(p.moved, 1);
  EXPECT_EQ(p.buffer_bytes, 500 * kMiB);
}

TEST(CheckpointPlacementTest, PricesTheWritesAndReadsPerStepAgainstTheCompute) {
  CheckpointPlacementInputs in = EightLayers(100 * kMiB);
  in.accumulation = 2;
  in.write_bytes_per_s = 1024.0 * kMiB;  // 1 GiB/s
  in.read_bytes_per_s = 2048.0 * kMiB;
  in.compute_seconds = 10;
  const CheckpointPlacement p = PlaceCheckpoints(in);
  // Per layer: 2 micro-batches x (64 MiB / 1 GiB/s + 64 MiB / 2 GiB/s) = 0.1875 s; seven of them.
  EXPECT_DOUBLE_EQ(p.per_layer_seconds, 0.1875);
  EXPECT_DOUBLE_EQ(p.nvme_seconds, 7 * 0.1875);
  const std::string d = p.Describe(in);
  EXPECT_NE(d.find("0.188 s per layer and 1.31 s per step at the store's rates against 10 s of "
                   "compute (hidden behind it)"),
            std::string::npos)
      << d;
  in.compute_seconds = 1;
  EXPECT_NE(PlaceCheckpoints(in).Describe(in).find("the disk bounds the step"), std::string::npos);
}

TEST(CheckpointPlacementTest, ADiskTooSmallIsRefusedNamingTheBytes) {
  const CheckpointPlacement p = PlaceCheckpoints(EightLayers(100 * kMiB));
  EXPECT_TRUE(CheckCheckpointDisk(p, 0, p.disk_bytes).ok());
  const Status s = CheckCheckpointDisk(p, 1 * kMiB, p.disk_bytes);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("need 768 MiB of disk (805306368 bytes: 7 layers' inputs"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("but the store directories have 768 MiB free"), std::string::npos);
  // Nothing on NVMe: nothing to check.
  EXPECT_TRUE(CheckCheckpointDisk(PlaceCheckpoints(EightLayers(0)), 0, 0).ok());
}

TEST(CheckpointPlacementTest, SpillBufferSizes) {
  EXPECT_EQ(ActivationSpillBufferBytes(0, 0), 0u);
  EXPECT_EQ(ActivationSpillBufferBytes(kMiB, 0), 64 * kMiB);  // the offload_nvme floor
  EXPECT_EQ(ActivationSpillBufferBytes(0, 1000), 5 * 4096u);  // 4 KiB-aligned records
  EXPECT_EQ(ActivationSpillBufferBytes(kMiB, 20 * kMiB), 100 * kMiB);
  EXPECT_EQ(SpillRecordBytes(4097), 8192u);
}

}  // namespace
}  // namespace offloadd::trainer
