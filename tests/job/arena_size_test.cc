// job/arena_size.cc: the arena's bytes and the CPU update's traffic per parameter in
// each compact optimizer mode (what the planners price once the arena holds them).
#include <gtest/gtest.h>

#include "job/arena_layout.h"
#include "job/host_memory.h"

namespace offloadd::trainer::internal {
namespace {

using workers::MasterDtype;
using workers::OptimizerMode;
using workers::StateDtype;

TEST(HostOptimizerSizeTest, CompactModesShrinkTheArenaAndTheUpdatesTraffic) {
  HostOptimizerOptions o;
  o.block_elements = {1 << 20};
  o.compute = HostDtype::kBf16;
  o.host_weight_copy = false;  // RAM tier, no 16-bit copy: the device reads the fp32 masters
  ASSERT_EQ(ArenaBytesPerParameter(o), 14u);
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {}), 14);
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {StateDtype::kBf16, MasterDtype::kFp32}), 10);
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {StateDtype::kInt8, MasterDtype::kBf16}),
                   8 + 8.0 / 256);
  EXPECT_DOUBLE_EQ(ModeUpdateTrafficPerParameter(o, {}), 26);
  EXPECT_DOUBLE_EQ(ModeUpdateTrafficPerParameter(o, {StateDtype::kInt8, MasterDtype::kFp32}),
                   14 + 16.0 / 256);
  o.host_weight_copy = true;  // the 16-bit copy in the arena, written by every update
  EXPECT_DOUBLE_EQ(ModeUpdateTrafficPerParameter(o, {}), 28);
  // A bf16 master is the device's weights: no copy to hold or write, whatever host_weight_copy
  // says (master and compensation 4 B, fp32 states 8, gradients 2).
  const OptimizerMode bf16_master = {StateDtype::kFp32, MasterDtype::kBf16};
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, bf16_master), 14);
  EXPECT_DOUBLE_EQ(ModeUpdateTrafficPerParameter(o, bf16_master), 26);
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {StateDtype::kInt8, MasterDtype::kBf16}),
                   8 + 8.0 / 256);
  o.tier = StateTier::kNvme;  // states in the store: the arena holds gradients only
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {StateDtype::kInt8, MasterDtype::kFp32}),
                   static_cast<double>(ArenaBytesPerParameter(o)));
}

// The validator's and --validate-only's host-RAM line: the arena in a compact mode is priced with
// the mode's bytes and says so; exact says what it always said.
TEST(HostOptimizerSizeTest, TheHostMemoryPredictionNamesACompactModesBytesPerParameter) {
  HostMemoryInputs in;
  in.optimizer.block_elements = {1 << 20, 1 << 20};
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.host_weight_copy = false;
  const HostMemoryPrediction exact = PredictHostMemory(in);
  EXPECT_EQ(exact.Describe().find("B/parameter"), std::string::npos) << exact.Describe();
  in.optimizer.mode = {StateDtype::kInt8, MasterDtype::kFp32};
  const HostMemoryPrediction int8 = PredictHostMemory(in);
  EXPECT_NE(int8.Describe().find("at 8.03 B/parameter, not exact: fp32 master, int8 states"),
            std::string::npos)
      << int8.Describe();
  // 5.97 B per parameter fewer (exact's 12 of master and states against 6.03), pages aside.
  EXPECT_NEAR(static_cast<double>(exact.total - int8.total), (6 - 8.0 / 256) * (2 << 20),
              6 * 4096.0);
  // A bf16 master: the arena of exact without the copy (which it replaces), priced and named.
  in.optimizer.mode = {StateDtype::kFp32, MasterDtype::kBf16};
  const HostMemoryPrediction bf16_master = PredictHostMemory(in);
  EXPECT_NE(bf16_master.Describe().find("at 14 B/parameter, not exact: bf16 master, fp32 states"),
            std::string::npos)
      << bf16_master.Describe();
  EXPECT_NEAR(static_cast<double>(bf16_master.total), static_cast<double>(exact.total), 6 * 4096.0);
}

// The NVMe tier with part of the states in RAM: a block whose master is in the arena keeps no
// 16-bit copy beside it (the device reads and rounds the master, as on the RAM tier), 2 B per
// parameter less; the NVMe blocks keep theirs (their masters are in the store between updates);
// with host_weight_copy, or with every block on NVMe, nothing changes.
TEST(HostOptimizerSizeTest, BlocksInRamKeepNoCopyBesideTheirMastersOnTheNvmeTier) {
  HostOptimizerOptions o;
  o.block_elements = {1 << 20, 1 << 21, 1 << 20};  // whole pages
  o.compute = HostDtype::kBf16;
  o.tier = StateTier::kNvme;
  o.host_weight_copy = false;
  o.nvme_blocks = {false, true, false};
  HostOptimizerOptions with_copy = o;
  with_copy.host_weight_copy = true;
  EXPECT_FALSE(BlockWeightsFp32(with_copy, 0));
  EXPECT_TRUE(BlockWeightsFp32(o, 0));
  EXPECT_FALSE(BlockWeightsFp32(o, 1));  // on NVMe
  EXPECT_TRUE(BlockWeightsFp32(o, 2));
  // Two 16-bit regions fewer (the region table is sized per shard, whatever regions it holds).
  const uint64_t ram_params = 2 << 20;
  EXPECT_EQ(ArenaBytes(with_copy) - ArenaBytes(o), 2 * ram_params);
  const workers::ShardLayoutOptions lo = LayoutOptions(o);
  EXPECT_EQ(lo.weights_elsewhere, (std::vector<bool>{true, false, true}));
  HostOptimizerOptions all_nvme = o;
  all_nvme.nvme_blocks.clear();
  EXPECT_FALSE(BlockWeightsFp32(all_nvme, 0));
  EXPECT_EQ(ArenaBytes(all_nvme), [&] {
    HostOptimizerOptions c = all_nvme;
    c.host_weight_copy = true;
    return ArenaBytes(c);
  }());
  // fp32 compute: every block reads an fp32 master or compute copy already; a bf16 master is the
  // device's weights.
  HostOptimizerOptions fp32 = o;
  fp32.compute = HostDtype::kFp32;
  EXPECT_TRUE(BlockWeightsFp32(fp32, 1));
  HostOptimizerOptions bf16_master = o;
  bf16_master.mode = {StateDtype::kFp32, MasterDtype::kBf16};
  EXPECT_FALSE(BlockWeightsFp32(bf16_master, 0));
}

}  // namespace
}  // namespace offloadd::trainer::internal
