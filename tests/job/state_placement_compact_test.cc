// The compact optimizer modes on the NVMe tier (job/state_placement.h, job/host_memory.h): the
// store holds each NVMe block's master and states in the mode's own bytes, and the prediction, the
// placement under a host limit and its disk check price those bytes, not exact's 12 per parameter.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "job/state_placement.h"

namespace offloadd::trainer {
namespace {

constexpr uint64_t kPage = 4096;
uint64_t Page(uint64_t v) { return (v + kPage - 1) / kPage * kPage; }
// A block's bytes with an fp32 master and int8 states, from the format (docs/optimizer-modes.md):
// the master's 4 B per parameter, and per state the codes padded to 64 bytes, then one fp32
// scale per block of 256.
uint64_t Int8State(uint64_t n) { return (n + 63) / 64 * 64 + 4 * ((n + 255) / 256); }
uint64_t Int8Stored(uint64_t n) { return 4 * n + 2 * Int8State(n); }

TEST(StatePlacementTest, CompactStatesOnNvmeArePricedInTheirOwnBytes) {
  HostMemoryInputs exact;
  exact.optimizer.tier = StateTier::kNvme;
  exact.optimizer.compute = HostDtype::kBf16;
  const std::vector<uint64_t> blocks = {1 << 21, 1 << 20, 1 << 20,
                                        1 << 20, 1 << 20, (1 << 21) + 64};
  exact.optimizer.block_elements = blocks;
  HostMemoryInputs int8 = exact;
  int8.optimizer.mode = {workers::StateDtype::kInt8, workers::MasterDtype::kFp32};
  const uint64_t largest = (1 << 21) + 64;
  const uint64_t versions = exact.optimizer.nvme_slots + 1;  // new versions in flight

  // Every block on NVMe: the disk holds the mode's bytes, and the staging slots shrink with them.
  const HostMemoryPrediction e = PredictHostMemory(exact), q = PredictHostMemory(int8);
  uint64_t params = 0, stored = 0;
  for (uint64_t n : blocks) {
    params += n;
    stored += Int8Stored(n);
  }
  EXPECT_EQ(e.disk_bytes, 12 * params + 12 * largest * versions);
  EXPECT_EQ(q.disk_bytes, stored + Int8Stored(largest) * versions);
  EXPECT_NEAR(static_cast<double>(q.disk_bytes) / static_cast<double>(e.disk_bytes),
              (4 + 2 * (1 + 4.0 / 256)) / 12, 1e-3);  // 6.03 B per parameter against 12
  const uint64_t slots = exact.optimizer.nvme_slots;
  EXPECT_EQ(e.total - q.total,
            slots * (3 * Page(4 * largest) - Page(4 * largest) - 2 * Page(Int8State(largest))));
  EXPECT_NE(q.Describe().find(std::to_string(params) +
                              " parameters' master and AdamW states in their fp32/int8 bytes"),
            std::string::npos)
      << q.Describe();
  EXPECT_NE(e.Describe().find(" parameters' fp32 master and AdamW states"), std::string::npos)
      << e.Describe();

  // The same room above each mode's all-on-NVMe prediction: exact keeps one layer on NVMe
  // (state_placement_test.cc), int8 states take half the RAM per block and keep every block in
  // RAM, which needs no disk.
  const uint64_t room = 12 * ((1 << 22) + 64 + (1 << 19));
  auto pe = PlaceStatesUnderLimit(&exact, e.total + room, uint64_t{1} << 40);
  ASSERT_TRUE(pe.ok()) << pe.status().ToString();
  EXPECT_EQ(exact.optimizer.nvme_blocks,
            std::vector<bool>({false, false, false, false, true, false}));
  auto pq = PlaceStatesUnderLimit(&int8, q.total + room, 0);
  ASSERT_TRUE(pq.ok()) << pq.status().ToString();
  EXPECT_EQ(int8.optimizer.nvme_blocks, std::vector<bool>(6, false)) << pq->Describe();
  EXPECT_LE(PredictHostMemory(int8).total, q.total + room);
  // Under a limit that holds only the largest block's int8 states in RAM, the others' disk is the
  // mode's: refused by the byte with one less.
  int8.optimizer.nvme_blocks.clear();
  const uint64_t tight = q.total + Int8Stored(largest) + 12 * kPage;  // its regions, rounded
  auto one = PlaceStatesUnderLimit(&int8, tight, uint64_t{1} << 40);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  const HostMemoryPrediction placed = PredictHostMemory(int8);
  uint64_t on_nvme = 0, largest_nvme = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!int8.optimizer.nvme_blocks[b]) continue;
    on_nvme += Int8Stored(blocks[b]);
    largest_nvme = std::max(largest_nvme, blocks[b]);
  }
  ASSERT_GT(on_nvme, 0u) << one->Describe();
  EXPECT_EQ(placed.disk_bytes, on_nvme + Int8Stored(largest_nvme) * versions);
  HostMemoryInputs again = int8;
  EXPECT_TRUE(PlaceStatesUnderLimit(&again, tight, placed.disk_bytes).ok());
  again = int8;
  EXPECT_FALSE(PlaceStatesUnderLimit(&again, tight, placed.disk_bytes - 1).ok());
}

}  // namespace
}  // namespace offloadd::trainer
