// trainer/host_optimizer_size.cc: the arena's bytes and the CPU update's traffic per parameter in
// each compact optimizer mode (what the planners price once the arena holds them).
#include <gtest/gtest.h>

#include "trainer/host_optimizer_layout.h"

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
  ASSERT_EQ(HostOptimizer::BytesPerParameter(o), 14u);
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {}), 14);
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {StateDtype::kBf16, MasterDtype::kFp32}), 10);
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {StateDtype::kInt8, MasterDtype::kBf16}),
                   8 + 8.0 / 256);
  EXPECT_DOUBLE_EQ(ModeUpdateTrafficPerParameter(o, {}), 26);
  EXPECT_DOUBLE_EQ(ModeUpdateTrafficPerParameter(o, {StateDtype::kInt8, MasterDtype::kFp32}),
                   14 + 16.0 / 256);
  o.host_weight_copy = true;  // the 16-bit copy in the arena, written by every update
  EXPECT_DOUBLE_EQ(ModeUpdateTrafficPerParameter(o, {}), 28);
  o.tier = StateTier::kNvme;  // states in the store: the arena holds gradients only
  EXPECT_DOUBLE_EQ(ModeBytesPerParameter(o, {StateDtype::kInt8, MasterDtype::kFp32}),
                   static_cast<double>(HostOptimizer::BytesPerParameter(o)));
}

}  // namespace
}  // namespace offloadd::trainer::internal
