// job/capacity.h: what a job's plan holds per parameter against the node's limit for its
// optimizer mode, and the compact mode a refusal offers.
#include "job/capacity.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "common/units.h"

namespace offloadd::trainer {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// Three blocks of 1, 3 and 1 Mi parameters, bf16 compute, the trainer's default layout (no 16-bit
// copy beside the fp32 masters on the RAM tier).
HostMemoryInputs Small() {
  HostMemoryInputs in;
  in.optimizer.block_elements = {uint64_t{1} << 20, uint64_t{3} << 20, uint64_t{1} << 20};
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.host_weight_copy = false;
  in.optimizer.worker_processes = 1;
  return in;
}

// The parts add up to the prediction (RAM and disk together), whatever the layout.
void ExpectPartsAddUp(const HostMemoryInputs& in, const CapacityFigures& c) {
  const HostMemoryPrediction p = PredictHostMemory(in);
  EXPECT_NEAR(c.held() * static_cast<double>(c.params), static_cast<double>(p.total + p.disk_bytes),
              1.0);
  EXPECT_GE(c.rest, 0);  // slots, processes, rounding: never negative
}

TEST(CapacityTest, CountsEachPartOfWhatThePlanHoldsPerParameter) {
  HostMemoryInputs in = Small();
  const uint64_t limit = 64 * kGiB, disk = 32 * kGiB;
  CapacityFigures c = JobCapacity(in, limit, disk);
  EXPECT_EQ(c.params, uint64_t{5} << 20);
  EXPECT_DOUBLE_EQ(c.floor_bytes, 12);
  EXPECT_DOUBLE_EQ(c.states, 12);
  EXPECT_DOUBLE_EQ(c.gradients, 2);  // the bf16 gradient staging
  EXPECT_DOUBLE_EQ(c.weight_copies, 0);
  EXPECT_DOUBLE_EQ(c.physical_params, static_cast<double>(limit + disk) / 12);
  EXPECT_DOUBLE_EQ(c.fraction, static_cast<double>(c.params) / c.physical_params);
  ExpectPartsAddUp(in, c);
  const std::string d = c.Describe();
  EXPECT_NE(d.find("capacity: 5.2 M parameters, 0.1% of the 8.59 B this node holds for exact AdamW "
                   "((host memory limit 64 GiB + 32 "
                   "GiB free in the store directories) / 12 B per parameter)"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find(": 12 master and optimizer states, 2 gradients, "), std::string::npos) << d;

  // A 16-bit copy beside the masters, and the fp32 accumulation buffer.
  in.optimizer.host_weight_copy = true;
  in.optimizer.accumulation_steps = 4;
  c = JobCapacity(in, limit, disk);
  EXPECT_DOUBLE_EQ(c.weight_copies, 2);
  EXPECT_DOUBLE_EQ(c.gradients, 6);
  ExpectPartsAddUp(in, c);
  EXPECT_NE(c.Describe().find(", 2 weight copies beside the masters, "), std::string::npos);

  // The NVMe tier keeps the 16-bit copy in RAM; the states count on disk, the same 12 B.
  in = Small();
  const double ram_rest = JobCapacity(in, limit, disk).rest;
  in.optimizer.tier = StateTier::kNvme;
  c = JobCapacity(in, limit, disk);
  EXPECT_DOUBLE_EQ(c.states, 12);
  EXPECT_DOUBLE_EQ(c.weight_copies, 2);
  // Three staging slots of the largest block in RAM (36 B per its parameter) and four versions in
  // flight on disk (48 B), beside the store process.
  EXPECT_GT(c.rest, ram_rest + (36.0 + 48.0) * 3 / 5);
  ExpectPartsAddUp(in, c);
  // With fp32 compute an NVMe block keeps an fp32 compute copy in RAM instead.
  in.optimizer.compute = HostDtype::kFp32;
  c = JobCapacity(in, limit, disk);
  EXPECT_DOUBLE_EQ(c.gradients, 4);
  EXPECT_DOUBLE_EQ(c.weight_copies, 4);
  ExpectPartsAddUp(in, c);

  // A compact mode's floor is its own master and states; a block on the GPU holds none in RAM.
  in = Small();
  in.optimizer.mode.state = workers::StateDtype::kInt8;
  c = JobCapacity(in, limit, disk);
  EXPECT_DOUBLE_EQ(c.floor_bytes, workers::StateBytesPerParam(in.optimizer.mode));
  EXPECT_DOUBLE_EQ(c.states, c.floor_bytes);
  EXPECT_NE(c.Describe().find("this node holds for this optimizer mode"), std::string::npos);
  in = Small();
  in.optimizer.device_blocks = {false, true, false};
  c = JobCapacity(in, limit, disk);
  EXPECT_DOUBLE_EQ(c.states, 12.0 * 2 / 5);
  // No store directory (StoreDirsFreeBytes' "unknown"): the limit alone.
  c = JobCapacity(Small(), limit, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(c.disk_free, 0u);
  EXPECT_DOUBLE_EQ(c.physical_params, static_cast<double>(limit) / 12);
  EXPECT_NE(c.Describe().find("(host memory limit 64 GiB + no store directory)"),
            std::string::npos);
}

// 1 Gi parameters: exact 14 B per parameter in RAM, bf16 states 10, int8 states 8.03 (plus the
// processes): a limit between two of them gets the least lossy mode that fits, none when
// nothing does or the job is compact already.
TEST(CapacityTest, CompactModeFixOffersTheLeastLossyModeThatFits) {
  HostMemoryInputs in = Small();
  in.optimizer.block_elements = {uint64_t{1} << 30};
  auto with = [&](workers::StateDtype s) {
    HostMemoryInputs t = in;
    t.optimizer.mode.state = s;
    return PredictHostMemory(t).total;
  };
  const uint64_t exact = PredictHostMemory(in).total, bf16 = with(workers::StateDtype::kBf16),
                 int8 = with(workers::StateDtype::kInt8);
  ASSERT_LT(bf16, exact);
  ASSERT_LT(int8, bf16);
  auto fix = CompactModeFix(in, bf16);
  ASSERT_TRUE(fix.has_value());
  EXPECT_NE(fix->find("optimizer.state_dtype: bf16 (--state-dtype=bf16)"), std::string::npos)
      << *fix;
  EXPECT_NE(fix->find("not exact: fp32 master, bf16 states"), std::string::npos) << *fix;
  EXPECT_NE(fix->find(FormatByteSize(bf16)), std::string::npos) << *fix;
  fix = CompactModeFix(in, bf16 - 1);
  ASSERT_TRUE(fix.has_value());
  EXPECT_NE(fix->find("optimizer.state_dtype: int8 (--state-dtype=int8)"), std::string::npos)
      << *fix;
  EXPECT_FALSE(CompactModeFix(in, int8 - 1).has_value());
  // From the NVMe tier the compact states live in RAM (the modes do not run on NVMe).
  HostMemoryInputs nvme = in;
  nvme.optimizer.tier = StateTier::kNvme;
  fix = CompactModeFix(nvme, bf16);
  ASSERT_TRUE(fix.has_value());
  EXPECT_NE(fix->find("with the states in RAM"), std::string::npos) << *fix;
  in.optimizer.mode.state = workers::StateDtype::kBf16;
  EXPECT_FALSE(CompactModeFix(in, int8).has_value());  // compact already
}

// CheckHostMemory offers the compact mode after the exact changes (here none fits: the limit is
// below what the NVMe tier keeps in RAM for this one large block), and not when an exact one is
// all there is.
TEST(CapacityTest, AHostMemoryRefusalOffersACompactModeWhenOneFits) {
  HostMemoryInputs in = Small();
  in.optimizer.block_elements = {uint64_t{1} << 30};
  HostMemoryInputs int8 = in;
  int8.optimizer.mode.state = workers::StateDtype::kInt8;
  const uint64_t limit = PredictHostMemory(int8).total;
  const Status st = CheckHostMemory(in, limit, "host_memory_limit", 0);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  const std::string m(st.message());
  EXPECT_NE(m.find("or a compact optimizer mode, not exact: fp32 master, int8 states, with the "
                   "states in RAM: optimizer.state_dtype: int8 (--state-dtype=int8): " +
                   PredictHostMemory(int8).Describe()),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("nothing smaller fits"), std::string::npos) << m;
  // Below int8's RAM: not offered.
  const Status none = CheckHostMemory(in, limit - 1, "host_memory_limit", 0);
  EXPECT_EQ(std::string(none.message()).find("compact"), std::string::npos) << none.message();
}

}  // namespace
}  // namespace offloadd::trainer
