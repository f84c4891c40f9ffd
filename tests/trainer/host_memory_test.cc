// trainer/host_memory.h: the host limit a node gives by default, the RAM and disk a job needs (its
// arena from HostOptimizer::ArenaBytes itself), and refusals that name the numbers and the change
// that fits.
#include "trainer/host_memory.h"

#include <gtest/gtest.h>

#include <string>

#include "common/units.h"

namespace offloadd::trainer {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// Llama-3-8B's blocks: embedding 128256 x 4096, 32 decoder layers, the untied head and final norm.
HostOptimizerOptions Llama3_8B() {
  HostOptimizerOptions o;
  const uint64_t h = 4096, inter = 14336, kv = 1024;
  o.block_elements.push_back(128256 * h);
  const uint64_t layer = h * h + 2 * h * kv + h * h + 3 * h * inter + 2 * h;
  for (int l = 0; l < 32; ++l) o.block_elements.push_back(layer);
  o.block_elements.push_back(128256 * h + h);
  o.compute = HostDtype::kBf16;
  return o;
}

uint64_t Params(const HostOptimizerOptions& o) {
  uint64_t n = 0;
  for (uint64_t b : o.block_elements) n += b;
  return n;
}

TEST(HostMemoryTest, DefaultLimitIsTheConfiguredOneElseEightyPercentOfRam) {
  EXPECT_EQ(DefaultHostMemoryLimit(0, 100 * kGiB), 80 * kGiB);
  EXPECT_EQ(DefaultHostMemoryLimit(3 * kGiB, 100 * kGiB), 3 * kGiB);
  EXPECT_EQ(DefaultHostMemoryLimit(0, 0), 0u);  // unknown RAM: no limit to apply
  EXPECT_GT(HostRamBytes(), 0u);
}

TEST(HostMemoryTest, ArenaIsHostOptimizersOwnAndNvmeMovesTheStatesToDisk) {
  HostMemoryInputs in;
  in.optimizer = Llama3_8B();
  in.cuda = true;
  const HostMemoryPrediction ram = PredictHostMemory(in);
  EXPECT_EQ(ram.arena, HostOptimizer::ArenaBytes(in.optimizer));
  EXPECT_EQ(ram.disk_bytes, 0u);
  EXPECT_EQ(ram.total, ram.arena + ram.processes);
  // At least the fp32 master and both moments (12 B) per parameter in RAM.
  EXPECT_GE(ram.arena, 12 * Params(in.optimizer));
  in.optimizer.tier = StateTier::kNvme;
  const HostMemoryPrediction nvme = PredictHostMemory(in);
  EXPECT_EQ(nvme.nvme_params, Params(in.optimizer));
  // 12 B per parameter and the new versions of 3 slots + 1 committing of the largest block.
  EXPECT_EQ(nvme.disk_bytes, 12 * Params(in.optimizer) + 4 * 12 * (uint64_t{128256} * 4096 + 4096));
  // Off the RAM: 12 B per parameter (less the 16-bit copy the NVMe tier keeps, when the RAM tier
  // keeps none), less the three staging slots of the largest block (the 2.1 GB embedding: 19 GB).
  EXPECT_LT(nvme.arena + 7 * Params(in.optimizer), ram.arena);
  EXPECT_NE(nvme.Describe().find("disk "), std::string::npos);
}

// The 8B OOM kill: on a 125 GiB host, Llama-3-8B with every state in RAM needs more than the
// default limit (80%: 100 GiB). offloadd-train had no limit and the kernel killed it after step
// 2; now the check refuses it before the arena is made, with the numbers and NVMe as the fix.
TEST(HostMemoryTest, Llama8BOnA125GiBHostIsRefusedWithTheNumbersAndNvmeAsTheFix) {
  HostMemoryInputs in;
  in.optimizer = Llama3_8B();
  in.cuda = true;
  const uint64_t ram = 125 * kGiB;
  const uint64_t limit = DefaultHostMemoryLimit(0, ram);
  const Status st = CheckHostMemory(in, limit, "the default", ram);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  const std::string m(st.message());
  const HostMemoryPrediction p = PredictHostMemory(in);
  EXPECT_NE(m.find(FormatByteSize(p.total)), std::string::npos) << m;
  EXPECT_NE(m.find(FormatByteSize(limit)), std::string::npos) << m;
  EXPECT_NE(m.find("--tier=nvme"), std::string::npos) << m;
  // 122 GiB of a 125 GiB host: beyond 90% of the RAM, a higher limit is not offered.
  EXPECT_EQ(m.find("a host memory limit of at least"), std::string::npos) << m;
  in.optimizer.tier = StateTier::kNvme;
  EXPECT_TRUE(CheckHostMemory(in, limit, "the default", ram).ok());
}

TEST(HostMemoryTest, RefusalOffersTheLargestMicroBatchThatFits) {
  HostMemoryInputs in;
  in.optimizer.block_elements = {1 << 20, 1 << 20};
  in.micro = 8;
  in.checkpoint_bytes = 8 * kGiB;  // 1 GiB per row
  const HostMemoryPrediction p = PredictHostMemory(in);
  const uint64_t limit = p.total - 3 * kGiB - (kGiB / 2);  // 4.5 rows of checkpoints fit
  const Status st = CheckHostMemory(in, limit, "host_memory_limit", 0);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("micro-batch 4 (--batch-size"), std::string::npos) << st.message();
  EXPECT_TRUE(CheckHostMemory(in, p.total, "host_memory_limit", 0).ok());
  // Within 90% of the RAM a higher limit is offered too.
  const Status raise = CheckHostMemory(in, limit, "host_memory_limit", p.total * 2);
  EXPECT_NE(std::string(raise.message()).find("or a host memory limit of at least " + FormatByteSize(p.total)),
            std::string::npos)
      << raise.message();
}

TEST(HostMemoryTest, NothingFitsSaysSo) {
  HostMemoryInputs in;
  in.optimizer = Llama3_8B();
  in.optimizer.tier = StateTier::kNvme;
  const Status st = CheckHostMemory(in, kGiB, "host_memory_limit", 2 * kGiB);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("nothing smaller fits"), std::string::npos) << st.message();
}

TEST(HostMemoryTest, NvmeStepSecondsReadsAndWritesTwelveBytesPerParameter) {
  EXPECT_DOUBLE_EQ(NvmeStepSeconds(1'000'000'000, 6e9, 4e9), 12e9 / 6e9 + 12e9 / 4e9);
  EXPECT_EQ(NvmeStepSeconds(0, 6e9, 4e9), 0);
  EXPECT_EQ(NvmeStepSeconds(10, 0, 4e9), 0);
}

}  // namespace
}  // namespace offloadd::trainer
