// The step planner's held-update dependency with its tails, and the length distribution the
// planner prices variable-length batches from.
#include "job/step_planner.h"

#include <gtest/gtest.h>

#include <set>

#include "job/batch_planner.h"

namespace offloadd::trainer {
namespace {

// Two blocks of 1 G parameters each, nothing placeable: a step bound by its held updates.
PlanInputs HeldStep() {
  PlanInputs in;
  in.params = {1'000'000'000, 1'000'000'000};
  in.device_state_bytes = {0, 0};
  in.keep_extra_bytes = {0, 0};
  in.recompute_seconds = {0, 0};
  in.budget_bytes = int64_t{1} << 40;
  in.gpu_seconds = 0.9;
  in.gpu_forward_seconds = 0.3;
  in.host_bytes_per_s = 1e15;  // the pool's rate binds the update
  in.cpu_params_per_s = 4e9;   // 0.5 s for 2 G parameters
  in.h2d_bytes_per_s = in.d2h_bytes_per_s = 1e15;
  in.place_states = in.keep_activations = false;
  in.held_updates = true;
  return in;
}

TEST(HeldUpdatesTest, TheTailsFollowTheBackwardAndTheUpdate) {
  PlanInputs in = HeldStep();
  PlanChoice c = EvaluatePlan(in, 0, 0);
  EXPECT_DOUBLE_EQ(c.held_s, 0.6 + 0.5);  // backward, then the update (longer than the forward)
  EXPECT_EQ(c.bound, "held updates");
  // The norm waits for the last gradients' copy; the next forward for the last block's upload
  // and its own forward after its update.
  in.norm_tail_seconds = 0.02;
  in.update_tail_seconds = 0.05;
  c = EvaluatePlan(in, 0, 0);
  EXPECT_DOUBLE_EQ(c.held_s, 0.6 + 0.02 + 0.5 + 0.05);
  EXPECT_DOUBLE_EQ(c.predicted_s, c.held_s);
  // A forward longer than update + tail hides the tail.
  in.gpu_forward_seconds = 0.7;
  in.gpu_seconds = 1.3;
  c = EvaluatePlan(in, 0, 0);
  EXPECT_DOUBLE_EQ(c.held_s, 0.6 + 0.02 + 0.7);
}

TEST(HeldUpdatesTest, NegativeTailsAreRefusedByName) {
  PlanInputs in = HeldStep();
  in.update_tail_seconds = -1;
  EXPECT_NE(ValidatePlanInputs(in).message().find("update_tail_seconds"), std::string::npos);
}

// What a CPU-updated parameter moves, from the arena's layout and the workers' commands.
TEST(ParamTrafficTest, TheUpdatesHostBytesAndAPlacedBlocksSavingsFollowTheLayout) {
  ParamTraffic t;  // bf16 gradients, fp32 masters uploaded and cast on the GPU, streamed
  // Gradient read (2), master and moments read and written (24); no 16-bit copy written.
  EXPECT_DOUBLE_EQ(HostUpdateBytesPerParam(t), 26);
  t.weight_copy = true;
  t.upload_bytes = 2;
  EXPECT_DOUBLE_EQ(HostUpdateBytesPerParam(t), 28);
  t.weight_copy = false;
  t.upload_bytes = 4;
  // Held updates whose norm the workers measure read the gradient once more.
  t.cpu_norm = true;
  EXPECT_DOUBLE_EQ(HostUpdateBytesPerParam(t), 28);
  // Accumulation over 4: the update and the norm read the fp32 buffer (4 + 24 + 4); each
  // micro-batch's bf16 gradient is read (4 x 2), the buffer written once and read and written 3
  // times (4 + 3 x 8).
  t.accumulation = 4;
  EXPECT_DOUBLE_EQ(HostUpdateBytesPerParam(t), 32 + 8 + 4 + 24);
  PlanInputs in;
  ApplyParamTraffic(t, &in);
  // A placed block's weights stay on the GPU: two fp32 uploads per micro-batch saved; and its
  // bf16 gradients are not copied out, per micro-batch.
  EXPECT_DOUBLE_EQ(in.h2d_saved_per_param, 2 * 4 * 4);
  EXPECT_DOUBLE_EQ(in.d2h_saved_per_param, 4 * 2);
  t.streamed = false;  // resident weights: the update's one upload per step
  ApplyParamTraffic(t, &in);
  EXPECT_DOUBLE_EQ(in.h2d_saved_per_param, 4);
  // The planner's defaults are the default traffic's.
  const PlanInputs defaults;
  PlanInputs derived;
  ApplyParamTraffic(ParamTraffic{}, &derived);
  EXPECT_DOUBLE_EQ(defaults.host_bytes_per_param, derived.host_bytes_per_param);
  EXPECT_DOUBLE_EQ(defaults.h2d_saved_per_param, derived.h2d_saved_per_param);
  EXPECT_DOUBLE_EQ(defaults.d2h_saved_per_param, derived.d2h_saved_per_param);
}

// A compact optimizer mode moves its own master and state bytes: 2 x (4 + 2 x 2) with bf16
// states, 2 x (4 + 2 x 1.016) with int8 (their block scales), where exact moves 2 x 12.
TEST(ParamTrafficTest, CompactModesMoveTheirStatesBytes) {
  ParamTraffic t;
  t.state_bytes = 8;
  EXPECT_DOUBLE_EQ(HostUpdateBytesPerParam(t), 2 + 16);
  t.state_bytes = 4 + 2 * (1 + 4.0 / 256);
  EXPECT_DOUBLE_EQ(HostUpdateBytesPerParam(t), 2 + 2 * (4 + 2 * (1 + 4.0 / 256)));
}

// States on NVMe: 12 B per NVMe parameter read and written at the store's rates is a resource of
// its own, and those bytes cross host memory into and out of the staging slots.
TEST(NvmeTermTest, TheStoresReadsAndWritesEnterTheBound) {
  PlanInputs in = HeldStep();
  in.held_updates = false;
  PlanChoice c = EvaluatePlan(in, 0, 0);
  EXPECT_EQ(c.nvme_s, 0);
  const double host_before = c.host_s;
  in.nvme_params = 1e9;
  in.nvme_read_bytes_per_s = 6e9;
  in.nvme_write_bytes_per_s = 4e9;
  c = EvaluatePlan(in, 0, 0);
  EXPECT_DOUBLE_EQ(c.nvme_s, 12e9 / 6e9 + 12e9 / 4e9);
  EXPECT_EQ(c.bound, "NVMe");
  EXPECT_DOUBLE_EQ(c.predicted_s, c.nvme_s);
  EXPECT_DOUBLE_EQ(c.host_s - host_before, 24e9 / in.host_bytes_per_s);
  EXPECT_NE(DescribePlan(c, in.budget_bytes).find("NVMe 5.00 s"), std::string::npos);
  // No measured rate: not priced (the estimate says so).
  in.nvme_write_bytes_per_s = 0;
  EXPECT_EQ(EvaluatePlan(in, 0, 0).nvme_s, 0);
  in.nvme_params = -1;
  EXPECT_NE(ValidatePlanInputs(in).message().find("nvme_params"), std::string::npos);
}

// Compact optimizer states on NVMe: the store holds the mode's bytes (ApplyParamTraffic's
// state_bytes: 6.03 B per parameter with int8 states), read and written at the drives' rates and
// through host memory into and out of the staging slots.
TEST(NvmeTermTest, CompactStatesOnNvmeMoveTheirOwnBytes) {
  PlanInputs in = HeldStep();
  in.held_updates = false;
  in.nvme_params = 1e9;
  in.nvme_read_bytes_per_s = 6e9;
  in.nvme_write_bytes_per_s = 4e9;
  const PlanChoice exact = EvaluatePlan(in, 0, 0);
  ParamTraffic t;
  t.state_bytes = 4 + 2 * (1 + 4.0 / 256);
  ApplyParamTraffic(t, &in);
  EXPECT_DOUBLE_EQ(in.nvme_state_bytes, t.state_bytes);
  const PlanChoice int8 = EvaluatePlan(in, 0, 0);
  EXPECT_DOUBLE_EQ(int8.nvme_s, t.state_bytes * 1e9 / 6e9 + t.state_bytes * 1e9 / 4e9);
  EXPECT_LT(int8.nvme_s, exact.nvme_s / 1.9);
}

// Layer inputs on NVMe (trainer/checkpoint_placement.h): their bytes written and read per step
// share the drives with the states' traffic.
TEST(NvmeTermTest, LayerInputsOnNvmeAddTheirWritesAndReads) {
  PlanInputs in = HeldStep();
  in.held_updates = false;
  in.nvme_activation_bytes = 8e9;
  in.nvme_read_bytes_per_s = 8e9;
  in.nvme_write_bytes_per_s = 4e9;
  PlanChoice c = EvaluatePlan(in, 0, 0);
  EXPECT_DOUBLE_EQ(c.nvme_s, 8e9 / 8e9 + 8e9 / 4e9);
  EXPECT_EQ(c.bound, "NVMe");
  in.nvme_params = 1e9;  // and the states' 12 B per parameter each way beside them
  c = EvaluatePlan(in, 0, 0);
  EXPECT_DOUBLE_EQ(c.nvme_s, 20e9 / 8e9 + 20e9 / 4e9);
  in.nvme_activation_bytes = -1;
  EXPECT_NE(ValidatePlanInputs(in).message().find("nvme_activation_bytes"), std::string::npos);
}

// The 16-bit weights on NVMe: 2 B read per pass that needs them and 2 B written after the update,
// at the store's rates and through host memory; a block whose weights are there keeps its states
// off the GPU (max_device_blocks).
TEST(NvmeTermTest, WeightsOnNvmeAddTheirReadsAndWritesAndCapThePlacedBlocks) {
  PlanInputs in = HeldStep();
  in.held_updates = false;
  in.nvme_params = 1e9;
  in.nvme_read_bytes_per_s = 6e9;
  in.nvme_write_bytes_per_s = 4e9;
  const PlanChoice states = EvaluatePlan(in, 0, 0);
  in.nvme_weight_params = 0.5e9;
  in.nvme_weight_reads = 4;  // streamed, two micro-batches
  const PlanChoice weights = EvaluatePlan(in, 0, 0);
  // (Differences of sums near 5 s: a few ulps of 5.)
  EXPECT_NEAR(weights.nvme_s - states.nvme_s, 4e9 / 6e9 + 1e9 / 4e9, 1e-14);
  EXPECT_NEAR(weights.host_s - states.host_s, 5e9 / in.host_bytes_per_s, 1e-14);
  in.nvme_weight_params = 2e9;  // more than the NVMe blocks' parameters
  EXPECT_NE(ValidatePlanInputs(in).message().find("nvme_weight_params"), std::string::npos);
  in.nvme_weight_params = 0.5e9;
  // A CPU-bound step places both blocks' states on the GPU; a cap of one (block 1's weights on
  // NVMe) stops it there.
  in.nvme_params = 0;
  in.nvme_weight_params = 0;
  in.place_states = true;
  in.gpu_seconds = 0.1;
  in.gpu_forward_seconds = 0.03;
  auto free_plan = SolvePlan(in);
  ASSERT_TRUE(free_plan.ok()) << free_plan.status().ToString();
  EXPECT_EQ(free_plan->device_blocks, 2);
  in.max_device_blocks = 1;
  auto capped = SolvePlan(in);
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_EQ(capped->device_blocks, 1);
}

TEST(ExpectedPaddedLengthTest, TheMaximumOfTheBatchRoundedUp) {
  // One row: the mean of the rounded lengths.
  EXPECT_DOUBLE_EQ(ExpectedPaddedLength({8, 16}, 1, 8, 1024), 12);
  // Two rows: the longer is 16 unless both draws are 8 (probability 1/4).
  EXPECT_DOUBLE_EQ(ExpectedPaddedLength({16, 8}, 2, 8, 1024), 0.25 * 8 + 0.75 * 16);
  // Rounded up to the multiple, and never past the cap (the rows are truncated to it).
  EXPECT_DOUBLE_EQ(ExpectedPaddedLength({5}, 4, 8, 1024), 8);
  EXPECT_DOUBLE_EQ(ExpectedPaddedLength({1020}, 4, 8, 1020), 1020);
  // Large batches approach the longest record.
  EXPECT_NEAR(ExpectedPaddedLength({100, 200, 300, 400}, 64, 8, 1024), 400, 1e-4);
  EXPECT_EQ(ExpectedPaddedLength({}, 8, 8, 1024), 0);
}

TEST(PaddedLengthTest, BucketsAreAFewLengthsPerOctave) {
  // Without buckets: a multiple of 8, never past max(cap, longest).
  EXPECT_EQ(PaddedLength(1, 1024, false), 8);
  EXPECT_EQ(PaddedLength(217, 1024, false), 224);
  EXPECT_EQ(PaddedLength(1020, 1020, false), 1020);
  EXPECT_EQ(PaddedLength(1030, 1024, false), 1030);  // a row longer than the cap keeps its length
  // Buckets: multiples of 16 up to 64, then quarter octaves.
  EXPECT_EQ(PaddedLength(1, 1024, true), 16);
  EXPECT_EQ(PaddedLength(64, 1024, true), 64);
  EXPECT_EQ(PaddedLength(65, 1024, true), 80);
  EXPECT_EQ(PaddedLength(128, 1024, true), 128);
  EXPECT_EQ(PaddedLength(129, 1024, true), 160);
  EXPECT_EQ(PaddedLength(217, 1024, true), 224);
  EXPECT_EQ(PaddedLength(257, 1024, true), 320);
  EXPECT_EQ(PaddedLength(900, 1024, true), 1024);
  EXPECT_EQ(PaddedLength(900, 1000, true), 1000);  // the cap, not the bucket past it
  // Every length from 1 to 1024 lands in one of 20 buckets, each at most 25% (or 15 tokens) of
  // padding.
  std::set<int64_t> buckets;
  for (int64_t t = 1; t <= 1024; ++t) {
    const int64_t p = PaddedLength(t, 1024, true);
    EXPECT_GE(p, t);
    EXPECT_LE(p - t, std::max<int64_t>(15, t / 4)) << t;
    buckets.insert(p);
  }
  EXPECT_EQ(buckets.size(), 20u);
}

TEST(PaddedLengthTest, DistributionOfTheBatchsLongestRow) {
  // Two rows from {8, 16}: 16 unless both draws are 8.
  auto d = PaddedLengthDistribution({16, 8}, 2, 1024, false);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 8);
  EXPECT_DOUBLE_EQ(d[0].second, 0.25);
  EXPECT_EQ(d[1].first, 16);
  EXPECT_DOUBLE_EQ(d[1].second, 0.75);
  EXPECT_DOUBLE_EQ(ExpectedLength(d), ExpectedPaddedLength({16, 8}, 2, 8, 1024));
  // Buckets merge lengths: 70 and 75 both pad to 80.
  d = PaddedLengthDistribution({70, 75, 200}, 1, 1024, true);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].first, 80);
  EXPECT_NEAR(d[0].second, 2.0 / 3, 1e-12);
  EXPECT_EQ(d[1].first, 224);
  double total = 0;
  for (const auto& [length, p] : PaddedLengthDistribution({10, 90, 300, 301, 700}, 8, 1024, true)) total += p;
  EXPECT_NEAR(total, 1.0, 1e-12);
  EXPECT_TRUE(PaddedLengthDistribution({}, 8, 1024, true).empty());
}

}  // namespace
}  // namespace offloadd::trainer
