// job/host_memory.h: the host limit a node gives by default, the RAM and disk a job needs (its
// arena from ArenaBytes itself), and refusals that name the numbers and the change
// that fits.
#include "job/host_memory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

// A node's memory as DefaultHostMemoryLimit sees it.
NodeMemory Node(uint64_t total, uint64_t available) {
  NodeMemory m;
  m.total = total;
  m.available = available;
  return m;
}

TEST(HostMemoryTest, DefaultLimitIsTheConfiguredOneElseWhatIsAvailableLessTheReserve) {
  // The reserve: 6% of the RAM, at least 4 GiB.
  EXPECT_EQ(HostMemoryReserve(16 * kGiB), 4 * kGiB);
  EXPECT_EQ(HostMemoryReserve(500 * kGiB), 500 * kGiB / 100 * 6);
  const HostMemoryLimit configured = DefaultHostMemoryLimit(3 * kGiB, Node(100 * kGiB, 90 * kGiB));
  EXPECT_EQ(configured.bytes, 3 * kGiB);
  EXPECT_NE(configured.source.find("memory.host_memory_limit"), std::string::npos)
      << configured.source;
  const HostMemoryLimit l = DefaultHostMemoryLimit(0, Node(100 * kGiB, 90 * kGiB));
  EXPECT_EQ(l.bytes, 84 * kGiB);
  EXPECT_NE(l.source.find("90 GiB available less a reserve of 6 GiB"), std::string::npos)
      << l.source;
  // MemAvailable unknown: the RAM counts; unknown RAM: no limit to apply.
  EXPECT_EQ(DefaultHostMemoryLimit(0, Node(100 * kGiB, 0)).bytes, 94 * kGiB);
  EXPECT_EQ(DefaultHostMemoryLimit(0, Node(0, 0)).bytes, 0u);
  // Less available than the reserve: nothing to give (1 byte: 0 would mean no limit).
  EXPECT_EQ(DefaultHostMemoryLimit(0, Node(100 * kGiB, 5 * kGiB)).bytes, 1u);
}

TEST(HostMemoryTest, DefaultLimitIsCappedByTheCgroupAndByMemlockWhenPinned) {
  NodeMemory m = Node(100 * kGiB, 90 * kGiB);
  m.cgroup_max = 95 * kGiB;    // the unit's MemoryMax=95%
  m.cgroup_usage = 30 * kGiB;  // another job's arena
  HostMemoryLimit l = DefaultHostMemoryLimit(0, m);
  EXPECT_EQ(l.bytes, 59 * kGiB);
  EXPECT_NE(l.source.find("65 GiB left under the cgroup's memory.max of 95 GiB"), std::string::npos)
      << l.source;
  m.memlock = 8 << 20;  // a login shell's 8 MiB
  m.pinned = false;     // a CPU device pins nothing
  EXPECT_EQ(DefaultHostMemoryLimit(0, m).bytes, 59 * kGiB);
  m.pinned = true;
  l = DefaultHostMemoryLimit(0, m);
  EXPECT_EQ(l.bytes, uint64_t{8} << 20);
  EXPECT_NE(l.source.find("ulimit -l unlimited"), std::string::npos) << l.source;
}

// A CI container (memory.max 24 GiB) right after a build: memory.current is at the max, almost
// all of it page cache. The kernel reclaims the cache before it OOM-kills, so it is room, as
// MemAvailable counts it; before, the limit was 1 byte and every job was refused.
TEST(HostMemoryTest, TheCgroupsPageCacheIsRoomNotUsage) {
  NodeMemory m = Node(24 * kGiB, 22 * kGiB);
  m.cgroup_max = 24 * kGiB;
  m.cgroup_usage = 24 * kGiB;
  m.cgroup_reclaimable = 21 * kGiB;  // 3 GiB of anon + shmem held
  HostMemoryLimit l = DefaultHostMemoryLimit(0, m);
  EXPECT_EQ(l.bytes, 21 * kGiB - HostMemoryReserve(24 * kGiB)) << l.source;
  EXPECT_NE(l.source.find("21 GiB left under the cgroup's memory.max of 24 GiB"), std::string::npos)
      << l.source;
  // Nothing reclaimable: what is held is all the cgroup has used.
  m.cgroup_reclaimable = 0;
  EXPECT_EQ(DefaultHostMemoryLimit(0, m).bytes, 1u);
}

// The rule's inputs from the files the kernel writes: meminfo, the process's cgroup v2 path and
// the nearest memory.max above it ("max" means none).
TEST(HostMemoryTest, ProbeReadsMeminfoAndTheNearestCgroupMemoryMax) {
  const std::string root = ::testing::TempDir() + "/host_memory_probe";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/proc/self");
  std::filesystem::create_directories(root + "/cg/system.slice/offloadd.service/job");
  std::ofstream(root + "/proc/meminfo")
      << "MemTotal:       131072000 kB\nMemFree:         1000 kB\n"
         "MemAvailable:   125829120 kB\n";
  std::ofstream(root + "/proc/self/cgroup") << "0::/system.slice/offloadd.service/job\n";
  std::ofstream(root + "/cg/system.slice/offloadd.service/job/memory.max") << "max\n";
  std::ofstream(root + "/cg/system.slice/offloadd.service/memory.max") << 100 * kGiB << "\n";
  std::ofstream(root + "/cg/system.slice/offloadd.service/memory.current") << 10 * kGiB << "\n";
  std::ofstream(root + "/cg/system.slice/offloadd.service/memory.stat")
      << "anon " << 2 * kGiB << "\nfile " << 8 * kGiB << "\nshmem " << kGiB << "\nactive_file "
      << 3 * kGiB << "\ninactive_file " << 4 * kGiB << "\nslab_reclaimable " << kGiB / 2 << "\n";
  const NodeMemory m = ProbeNodeMemory(root + "/proc", root + "/cg");
  EXPECT_EQ(m.total, uint64_t{131072000} * 1024);
  EXPECT_EQ(m.available, uint64_t{125829120} * 1024);
  EXPECT_EQ(m.cgroup_max, 100 * kGiB);
  EXPECT_EQ(m.cgroup_usage, 10 * kGiB);
  EXPECT_EQ(m.cgroup_reclaimable, 7 * kGiB + kGiB / 2);  // the file LRUs and reclaimable slab
  // No cgroup v2 line: no cap.
  std::ofstream(root + "/proc/self/cgroup", std::ios::trunc) << "1:memory:/x\n";
  EXPECT_EQ(ProbeNodeMemory(root + "/proc", root + "/cg").cgroup_max, 0u);
  // This machine's own.
  const NodeMemory here = ProbeNodeMemory();
  EXPECT_GT(here.total, 0u);
  EXPECT_GT(here.available, 0u);
  EXPECT_LE(here.available, here.total);
}

// The 8B shapes measured on the H200 host (MemTotal 125.9 GiB, bench/RESULTS.md): at 14 B per
// parameter their prediction fits the new default on an idle host, and the measured peaks (114.1
// and 117.2 GiB) stay under MemAvailable: the reserve holds the 6.7 and 7.7 GiB they ran above
// their predictions. The old default (80% of RAM, 100.7 GiB) refused both.
TEST(HostMemoryTest, The8BShapesFitTheDefaultOfThe125GiBHost) {
  const uint64_t total = uint64_t{132017844} * 1024;  // 125.9 GiB
  const uint64_t idle_available = total - 2 * kGiB;   // an idle host: ~2 GiB in use
  const HostMemoryLimit l = DefaultHostMemoryLimit(0, Node(total, idle_available));
  HostMemoryInputs in;
  in.optimizer = Llama3_8B();
  in.optimizer.host_weight_copy = false;  // the trainer's default: 14 B per parameter
  in.optimizer.worker_processes = 1;
  in.cuda = true;
  const HostMemoryPrediction p = PredictHostMemory(in);
  EXPECT_GT(p.total, total / 100 * 80);  // the old default refused it
  EXPECT_TRUE(CheckHostMemory(in, l.bytes, l.source, l.bytes).ok())
      << FormatByteSize(p.total) << " > " << FormatByteSize(l.bytes);
  // The measured peak less the prediction fits in the reserve.
  const uint64_t measured_peak = static_cast<uint64_t>(117.2 * static_cast<double>(kGiB));
  EXPECT_LE(measured_peak, l.bytes + HostMemoryReserve(total));
}

TEST(HostMemoryTest, ArenaIsHostOptimizersOwnAndNvmeMovesTheStatesToDisk) {
  HostMemoryInputs in;
  in.optimizer = Llama3_8B();
  in.cuda = true;
  const HostMemoryPrediction ram = PredictHostMemory(in);
  EXPECT_EQ(ram.arena, ArenaBytes(in.optimizer));
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

// The 8B OOM kill: on a 125 GiB host, Llama-3-8B at 16 B per parameter (a 16-bit weight copy
// beside the masters) needs more than the node can give (115.5 GiB when idle). offloadd-train
// had no limit and the kernel killed it after step 2; now the check refuses it before the arena
// is made, with the numbers and NVMe as the fix.
TEST(HostMemoryTest, Llama8BOnA125GiBHostIsRefusedWithTheNumbersAndNvmeAsTheFix) {
  HostMemoryInputs in;
  in.optimizer = Llama3_8B();
  in.cuda = true;
  const uint64_t ram = 125 * kGiB;
  const uint64_t limit = DefaultHostMemoryLimit(0, Node(ram, ram - 2 * kGiB)).bytes;
  const Status st = CheckHostMemory(in, limit, "the default", limit);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  const std::string m(st.message());
  const HostMemoryPrediction p = PredictHostMemory(in);
  EXPECT_NE(m.find(FormatByteSize(p.total)), std::string::npos) << m;
  EXPECT_NE(m.find(FormatByteSize(limit)), std::string::npos) << m;
  EXPECT_NE(m.find("--tier=nvme"), std::string::npos) << m;
  // 122 GiB of a 125 GiB host: beyond what the node can give, a higher limit is not offered.
  EXPECT_EQ(m.find("a host memory limit of at least"), std::string::npos) << m;
  in.optimizer.tier = StateTier::kNvme;
  EXPECT_TRUE(CheckHostMemory(in, limit, "the default", limit).ok());
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

// Every block's states on NVMe and still over the limit: the refusal offers the 16-bit weights on
// NVMe too when they fit (2 B per parameter less in RAM), and says nothing of them when not.
TEST(HostMemoryTest, RefusalOffersTheWeightsOnNvmeWhenTheStatesAreThereAlready) {
  HostMemoryInputs in;
  in.optimizer = Llama3_8B();
  in.optimizer.tier = StateTier::kNvme;
  in.cuda = true;
  const HostMemoryPrediction states = PredictHostMemory(in);
  HostMemoryInputs w = in;
  w.optimizer.nvme_weight_blocks.assign(w.optimizer.block_elements.size(), true);
  const HostMemoryPrediction weights = PredictHostMemory(w);
  ASSERT_LT(weights.total, states.total);
  const uint64_t limit = (states.total + weights.total) / 2;
  const Status st = CheckHostMemory(in, limit, "host_memory_limit", 0);
  ASSERT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_NE(std::string(st.message())
                .find("the 16-bit weights on NVMe too (--param-tier=nvme): " + weights.Describe()),
            std::string::npos)
      << st.message();
  const Status none = CheckHostMemory(in, weights.total - 1, "host_memory_limit", 0);
  EXPECT_EQ(std::string(none.message()).find("--param-tier"), std::string::npos) << none.message();
  in.nvme_weights_forced = true;  // asked for already: not offered again
  EXPECT_EQ(std::string(CheckHostMemory(in, limit, "host_memory_limit", 0).message())
                .find("--param-tier"),
            std::string::npos);
}

TEST(HostMemoryTest, NvmeStepSecondsReadsAndWritesTwelveBytesPerParameter) {
  EXPECT_DOUBLE_EQ(NvmeStepSeconds(1'000'000'000, 6e9, 4e9), 12e9 / 6e9 + 12e9 / 4e9);
  // A compact mode's bytes (int8 states: 4 + 2 x (1 + 4/256) per parameter).
  const double int8 = 4 + 2 * (1 + 4.0 / 256);
  EXPECT_DOUBLE_EQ(NvmeStepSeconds(1'000'000'000, 6e9, 4e9, int8),
                   int8 * 1e9 / 6e9 + int8 * 1e9 / 4e9);
  EXPECT_EQ(NvmeStepSeconds(0, 6e9, 4e9), 0);
  EXPECT_EQ(NvmeStepSeconds(10, 0, 4e9), 0);
}

}  // namespace
}  // namespace offloadd::trainer
