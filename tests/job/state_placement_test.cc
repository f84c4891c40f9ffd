// PlaceBlockStates: RAM in block order while it lasts, the rest on NVMe, refused with the numbers
// when the disk is too small.
#include "job/state_placement.h"

#include <gtest/gtest.h>

#include <iostream>

#include "common/units.h"
#include "job/capacity.h"

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

// A refusal for disk names what it lacks and the smallest host limit that fits the disk there is:
// under it the placement fits, 1 MiB less it does not.
TEST(StatePlacementTest, ADiskRefusalNamesTheSmallestLimitThatFits) {
  HostMemoryInputs in;
  in.optimizer.tier = StateTier::kNvme;
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.block_elements = {1 << 21, 1 << 20, 1 << 20, 1 << 20, 1 << 20, (1 << 21) + 64};
  const uint64_t limit = PredictHostMemory(in).total + 12 * (1 << 22);  // embedding and head
  const uint64_t disk = 12 * (1 << 20) * 5 - 1;  // short of block 4's states and its versions
  const uint64_t smallest = SmallestHostLimitForDisk(in, limit, disk);
  ASSERT_GT(smallest, limit);
  HostMemoryInputs t = in;
  ASSERT_TRUE(PlaceStatesUnderLimit(&t, smallest, disk).ok());
  EXPECT_EQ(t.optimizer.nvme_blocks, std::vector<bool>(6, false));  // no NVMe block fits the disk
  t = in;
  EXPECT_FALSE(PlaceStatesUnderLimit(&t, smallest - (1 << 20), disk).ok());
  auto refused = PlaceStatesUnderLimit(&in, limit, disk);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  const std::string m(refused.status().message());
  EXPECT_NE(m.find("free (under the host memory limit of " + FormatByteSize(limit) + ")"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("it would fit with "), std::string::npos) << m;
  EXPECT_NE(m.find("more free disk (free disk space or add a store directory), or a host memory "
                   "limit of at least " +
                   FormatByteSize(smallest) + " (more blocks' states in RAM)"),
            std::string::npos)
      << m;
  // A limit that fits already is its own answer; no disk at all leaves no limit that fits.
  EXPECT_EQ(SmallestHostLimitForDisk(in, smallest, disk), smallest);
  in.spill_disk_bytes = disk + 1;  // the spilled activations alone overflow the disk
  EXPECT_EQ(SmallestHostLimitForDisk(in, limit, disk), 0u);
}

// offload_param: {device: nvme}: states first, then weights. With every block's states on NVMe
// still above the limit, the 16-bit weights of NVMe blocks go to the store, the layers from the
// last down, until the prediction fits; each moved layer frees its 2 B per parameter, the first
// adds the slots' and buffers' weight regions of its size.
TEST(StatePlacementTest, StatesFirstThenWeights) {
  HostMemoryInputs in;
  in.optimizer.tier = StateTier::kNvme;
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.block_elements.assign(18, 1 << 20);
  in.optimizer.block_elements.front() = in.optimizer.block_elements.back() = 1 << 21;
  const HostMemoryPrediction all = PredictHostMemory(in);  // every block's states on NVMe
  const uint64_t limit = all.total - (4 << 20);
  HostMemoryInputs states_only = in;
  ASSERT_TRUE(PlaceStatesUnderLimit(&states_only, limit, uint64_t{1} << 40).ok());
  EXPECT_TRUE(states_only.optimizer.nvme_weight_blocks.empty());
  EXPECT_GT(PredictHostMemory(states_only).total, limit);  // CheckHostMemory refuses it
  in.nvme_weights_allowed = true;
  auto p = PlaceStatesUnderLimit(&in, limit, uint64_t{1} << 40);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<bool> want(18, false);
  for (int b = 9; b <= 16; ++b) want[b] = true;  // 8 layers: 16 MiB freed, 10 MiB of regions
  EXPECT_EQ(in.optimizer.nvme_weight_blocks, want) << p->Describe();
  EXPECT_EQ(p->nvme_weight_blocks(), want);
  EXPECT_EQ(p->ram_blocks(), 0);
  const HostMemoryPrediction placed = PredictHostMemory(in);
  EXPECT_LE(placed.total, limit);
  EXPECT_EQ(placed.nvme_weight_params, uint64_t{8} << 20);
  // 2 B per parameter and one new version per slot and one committing, of a layer.
  EXPECT_EQ(placed.disk_bytes, all.disk_bytes + 2 * (uint64_t{8} << 20) + 2 * (1 << 20) * 4);
  HostMemoryInputs seven = in;  // one layer fewer does not fit
  seven.optimizer.nvme_weight_blocks[9] = false;
  EXPECT_GT(PredictHostMemory(seven).total, limit);
  EXPECT_NE(p->Describe().find("; 16-bit weights of blocks 9-16 on NVMe (16 MiB)"),
            std::string::npos)
      << p->Describe();
  // The disk must hold them too.
  auto short_disk = PlaceStatesUnderLimit(&in, limit, placed.disk_bytes - 1);
  ASSERT_FALSE(short_disk.ok());
  EXPECT_NE(short_disk.status().message().find(", 16 MiB of 16-bit weights and the new versions"),
            std::string::npos)
      << short_disk.status().message();
  EXPECT_TRUE(in.optimizer.nvme_weight_blocks.empty());
  // fp32 compute keeps no 16-bit copy to move.
  in.optimizer.compute = HostDtype::kFp32;
  ASSERT_TRUE(PlaceStatesUnderLimit(&in, limit, uint64_t{1} << 40).ok());
  EXPECT_TRUE(in.optimizer.nvme_weight_blocks.empty());
}

// offload_param: nvme forces every NVMe block's weights into the store, whatever the limit, except
// a block the GPU updates; auto moves them only where the limit needs it; states in RAM keep
// theirs.
TEST(StatePlacementTest, ForcedWeightsFollowEveryNvmeBlockButNotTheDevicesOrRams) {
  HostMemoryInputs in;
  in.optimizer.tier = StateTier::kNvme;
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.block_elements.assign(6, 1 << 20);
  const uint64_t roomy = uint64_t{1} << 40;
  in.nvme_weights_allowed = true;
  // auto under a roomy limit: every state on NVMe (no placement), the weights in RAM.
  StatePlacement p = PlaceWeightsOnNvme(&in, roomy);
  EXPECT_TRUE(in.optimizer.nvme_weight_blocks.empty());
  EXPECT_EQ(p.DescribeWeights(), "");
  in.nvme_weights_forced = true;
  in.optimizer.device_blocks = {true, false, false, false, false, false};
  p = PlaceWeightsOnNvme(&in, roomy);
  EXPECT_EQ(in.optimizer.nvme_weight_blocks,
            std::vector<bool>({false, true, true, true, true, true}));
  EXPECT_EQ(p.DescribeWeights(), "16-bit weights of blocks 1-5 on NVMe (10 MiB)");
  EXPECT_EQ(PredictHostMemory(in).nvme_weight_params, uint64_t{5} << 20);
  // Under a limit that keeps blocks 0-2's states in RAM, only 3-5 may move.
  in.optimizer.device_blocks.clear();
  in.optimizer.nvme_weight_blocks.clear();
  HostMemoryInputs all_nvme = in;
  all_nvme.nvme_weights_allowed = false;
  // Room for two blocks' masters and moments (12 MiB each) beside every block on NVMe.
  const uint64_t limit = PredictHostMemory(all_nvme).total + (30 << 20);
  auto placed = PlaceStatesUnderLimit(&in, limit, roomy);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  ASSERT_GT(placed->ram_blocks(), 0) << placed->Describe();
  ASSERT_LT(placed->ram_blocks(), 6) << placed->Describe();
  for (size_t b = 0; b < 6; ++b) {
    EXPECT_EQ(in.optimizer.nvme_weight_blocks[b], placed->tiers[b] == BlockTier::kNvme) << b;
  }
  EXPECT_NE(placed->Describe().find("; 16-bit weights of blocks"), std::string::npos)
      << placed->Describe();
  // fp32 compute: nothing to move, forced or not.
  in.optimizer.compute = HostDtype::kFp32;
  p = PlaceWeightsOnNvme(&in, roomy);
  EXPECT_TRUE(in.optimizer.nvme_weight_blocks.empty());
  // The RAM tier: none either.
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.tier = StateTier::kCpu;
  p = PlaceWeightsOnNvme(&in, roomy);
  EXPECT_TRUE(in.optimizer.nvme_weight_blocks.empty());
}

// A Llama-shaped model's blocks (embedding, `layers` decoder layers, final norm and untied head),
// bf16 compute on the NVMe tier with one worker process (the H200 runs' setting).
HostMemoryInputs Llama(int layers, uint64_t h, uint64_t inter, uint64_t kv, uint64_t vocab) {
  HostMemoryInputs in;
  in.cuda = true;
  in.optimizer.tier = StateTier::kNvme;
  in.optimizer.compute = HostDtype::kBf16;
  in.optimizer.worker_processes = 1;
  in.optimizer.block_elements.push_back(vocab * h);
  const uint64_t layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h;
  for (int l = 0; l < layers; ++l) in.optimizer.block_elements.push_back(layer);
  in.optimizer.block_elements.push_back(vocab * h + h);
  return in;
}

uint64_t Params(const HostMemoryInputs& in) {
  uint64_t n = 0;
  for (uint64_t b : in.optimizer.block_elements) n += b;
  return n;
}

// The largest trainable model on the H200 host with per-block placement (the planner's own
// numbers, docs/host_memory_and_nvme.md "Largest trainable model"): the default limit of the idle
// 125.9 GiB host (116.3 GiB) and the 62.9 GiB its disk had free. Llama-2-13B's shape (40 x 5120)
// is refused for disk with the limit that would fit (159.4 GiB); the largest of its width that
// fits has 30 layers (9.8 B parameters), of Llama-3-8B's width (4096, vocab 128,256) 43 layers
// (10.4 B): about (R + D) / 16 less the staging slots and the versions in flight, against the
// (R + D) / 12 = 16.1 B of the physical limit.
TEST(StatePlacementTest, LargestLlamaShapesOnTheH200Host) {
  const uint64_t total = uint64_t{132017844} * 1024;  // MemTotal 125.9 GiB
  NodeMemory node;
  node.total = total;
  node.available = total - 2 * kGiB;  // idle
  const uint64_t limit = DefaultHostMemoryLimit(0, node).bytes;
  EXPECT_EQ(FormatByteSize(limit), "116.3 GiB");
  const uint64_t disk = static_cast<uint64_t>(62.9 * static_cast<double>(kGiB));
  HostMemoryInputs l13 = Llama(40, 5120, 13824, 5120, 32000);
  EXPECT_EQ(Params(l13) / 100'000'000, 130u);  // 13.0 B
  auto refused = PlaceStatesUnderLimit(&l13, limit, disk);
  ASSERT_FALSE(refused.ok());
  std::cout << "13B: " << refused.status().message() << "\n";
  auto largest = [&](uint64_t h, uint64_t inter, uint64_t kv, uint64_t vocab) {
    int layers = 1;
    for (int l = 1; l < 200; ++l) {
      HostMemoryInputs in = Llama(l, h, inter, kv, vocab);
      if (!PlaceStatesUnderLimit(&in, limit, disk).ok()) break;
      layers = l;
    }
    HostMemoryInputs in = Llama(layers, h, inter, kv, vocab);
    auto p = PlaceStatesUnderLimit(&in, limit, disk);
    const HostMemoryPrediction q = PredictHostMemory(in);
    std::cout << layers << " x " << h << ": " << Params(in) << " parameters; "
              << (p.ok() ? p->Describe() : "") << "; " << q.Describe() << "\n";
    return layers;
  };
  EXPECT_EQ(largest(5120, 13824, 5120, 32000), 30);
  EXPECT_EQ(largest(4096, 14336, 1024, 128256), 43);
  // The disk refusal names a compact mode with the states in RAM when one fits (not exact: after
  // the exact changes). This job keeps a 16-bit copy beside its fp32 masters (host_weight_copy):
  // int8 states beside them take 10.03 B per parameter, 121.5 GiB for 13.0 B, over the 116.3; a
  // bf16 master replaces the copy: 8.03 B, 97.2 GiB, with the processes under the limit.
  HostMemoryInputs compact = Llama(40, 5120, 13824, 5120, 32000);
  compact.optimizer.tier = StateTier::kCpu;
  compact.optimizer.mode = {workers::StateDtype::kInt8, workers::MasterDtype::kBf16};
  ASSERT_LE(PredictHostMemory(compact).total, limit);
  EXPECT_NE(refused.status().message().find(
                "or a compact optimizer mode, not exact: bf16 master, int8 states, with the states "
                "in RAM: optimizer.state_dtype: int8 (--state-dtype=int8) and "
                "optimizer.master_dtype: bf16 (--master-dtype=bf16): " +
                PredictHostMemory(compact).Describe()),
            std::string::npos)
      << refused.status().message();
  // Without the copy (the trainer's default) int8 states with the fp32 master fit.
  HostMemoryInputs l13_no_copy = Llama(40, 5120, 13824, 5120, 32000);
  l13_no_copy.optimizer.host_weight_copy = false;
  const Status no_copy = PlaceStatesUnderLimit(&l13_no_copy, limit, disk).status();
  EXPECT_NE(no_copy.message().find("not exact: fp32 master, int8 states, with the states in RAM: "
                                   "optimizer.state_dtype: int8 (--state-dtype=int8): host RAM "),
            std::string::npos)
      << no_copy.message();
  // The weights on NVMe do not move that limit here: RAM is not what runs out (every block's
  // weights and gradients, 4 B per parameter, take 48 GiB of the 116.3), the disk is, and a
  // weight on NVMe takes the 2 B of disk it frees in RAM.
  HostMemoryInputs w13 = Llama(40, 5120, 13824, 5120, 32000);
  w13.nvme_weights_allowed = true;
  auto same = PlaceStatesUnderLimit(&w13, limit, disk);
  ASSERT_FALSE(same.ok());
  EXPECT_EQ(same.status().message(), refused.status().message());
  // Where RAM runs out first they do: 13B under a 48 GiB limit with 1 TiB of disk.
  const uint64_t small = 48 * kGiB, big_disk = 1024 * kGiB;
  HostMemoryInputs r13 = Llama(40, 5120, 13824, 5120, 32000);
  ASSERT_TRUE(PlaceStatesUnderLimit(&r13, small, big_disk).ok());
  EXPECT_GT(PredictHostMemory(r13).total, small);  // states alone: refused later, for RAM
  r13.nvme_weights_allowed = true;
  auto fits = PlaceStatesUnderLimit(&r13, small, big_disk);
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_LE(PredictHostMemory(r13).total, small);
  std::cout << "13B under 48 GiB: " << fits->Describe() << "; " << PredictHostMemory(r13).Describe()
            << "\n";
}

// The capacity goal at plan level on the H200 host (125.9 GiB of RAM, the idle host's default
// limit of 116.3 GiB; 64 GiB of disk with 50 GiB free), per tier mix, at Llama-3-8B's width: the
// most decoder layers the planner accepts (placed, and within the limit by CheckHostMemory) and
// that shape against (limit + free disk) / 12 B. Whatever the mix, what it accepts fits in the
// limit and the disk, so its fraction is at most 12 B over the bytes per parameter its plan holds
// (CapacityFigures: states, gradients, weight copies, the rest); one more layer is refused.
TEST(StatePlacementTest, TheH200HostsCapacityPerTierMix) {
  const uint64_t total = uint64_t{132017844} * 1024;
  NodeMemory node;
  node.total = total;
  node.available = total - 2 * kGiB;
  const uint64_t limit = DefaultHostMemoryLimit(0, node).bytes;
  const uint64_t disk = 50 * kGiB;
  struct Mix {
    const char* name;
    StateTier tier;
    bool weights_allowed;
    workers::StateDtype state;
  };
  const Mix mixes[] = {
      {"states in RAM", StateTier::kCpu, false, workers::StateDtype::kFp32},
      {"states per block in RAM or on NVMe", StateTier::kNvme, false, workers::StateDtype::kFp32},
      {"and the 16-bit weights on NVMe where RAM needs it", StateTier::kNvme, true,
       workers::StateDtype::kFp32},
      {"int8 states in RAM (not exact)", StateTier::kCpu, false, workers::StateDtype::kInt8}};
  auto make = [&](const Mix& m, int layers) {
    HostMemoryInputs in = Llama(layers, 4096, 14336, 1024, 128256);
    in.optimizer.tier = m.tier;
    in.optimizer.host_weight_copy = false;  // the trainer's default
    in.optimizer.mode.state = m.state;
    in.nvme_weights_allowed = m.weights_allowed;
    return in;
  };
  auto accepted = [&](HostMemoryInputs* in) {
    if (in->optimizer.tier == StateTier::kNvme && !PlaceStatesUnderLimit(in, limit, disk).ok())
      return false;
    return CheckHostMemory(*in, limit, "host_memory_limit", 0).ok();
  };
  for (const Mix& m : mixes) {
    int layers = 0;
    for (int l = 1; l < 200; ++l) {
      HostMemoryInputs in = make(m, l);
      if (!accepted(&in)) break;
      layers = l;
    }
    ASSERT_GT(layers, 0) << m.name;
    HostMemoryInputs in = make(m, layers);
    ASSERT_TRUE(accepted(&in));
    const CapacityFigures c = JobCapacity(in, limit, disk);
    const HostMemoryPrediction p = PredictHostMemory(in);
    EXPECT_LE(p.total, limit) << m.name;
    EXPECT_LE(p.disk_bytes, disk) << m.name;
    EXPECT_LE(c.fraction, c.floor_bytes / c.held() + 1e-9) << m.name;
    HostMemoryInputs next = make(m, layers + 1);
    EXPECT_FALSE(accepted(&next)) << m.name;
    // Against the exact 12 B too, for the compact mode.
    const double of_exact =
        static_cast<double>(c.params) / (static_cast<double>(limit + disk) / 12);
    std::cout << m.name << ": " << layers << " x 4096, " << c.Describe() << " (" << 100 * of_exact
              << "% of the exact limit); " << p.Describe()
              << (in.optimizer.tier == StateTier::kNvme
                      ? "; " + PlaceStatesUnderLimit(&in, limit, disk)->Describe()
                      : std::string())
              << "\n";
  }
}

// docs/host_memory_and_nvme.md, "On paper": the placement of Llama-2-70B's and GPT-3 175B's
// shapes on a host with 1 TB of RAM (the default limit of an idle one: 990 GB available less the
// 6% reserve) and 8 NVMe drives (disk ample), bf16 compute, CUDA, the trainer's layout (no 16-bit
// copy beside the masters in RAM): how many parameters' states RAM holds, how many go to NVMe, and
// the disk's share of a step at 8 x 6 GB/s (NvmeStepSeconds: 12 B read and 12 B written per NVMe
// parameter, at the store's 97% of each drive). Each block in RAM frees its 16-bit copy, so RAM
// holds more states than at 12 B per parameter: the arithmetic is P_ram = (R - 4 P) / 10 with R the
// RAM left for the model.
TEST(StatePlacementTest, TheSeventyAndHundredSeventyFiveBShapesOnATerabyteHost) {
  NodeMemory node;
  node.total = uint64_t{1000} * 1000 * 1000 * 1000;
  node.available = uint64_t{990} * 1000 * 1000 * 1000;
  const uint64_t limit = DefaultHostMemoryLimit(0, node).bytes;
  const uint64_t disk = uint64_t{8} * 3840 * 1000 * 1000 * 1000;
  const double rate = 8 * 6e9 * 0.97;  // the store at 97% of the drive (bench/storage/RESULTS.md)
  struct Shape {
    const char* name;
    int layers;
    uint64_t h, inter, kv, vocab;
  };
  for (const Shape& sh :
       {Shape{"Llama-2-70B", 80, 8192, 28672, 1024, 32000},
        Shape{"GPT-3 175B (Llama-shaped: FFN 8h/3)", 96, 12288, 32768, 12288, 50257}}) {
    HostMemoryInputs in = Llama(sh.layers, sh.h, sh.inter, sh.kv, sh.vocab);
    in.optimizer.host_weight_copy = false;
    auto placed = PlaceStatesUnderLimit(&in, limit, disk);
    ASSERT_TRUE(placed.ok()) << sh.name << ": " << placed.status().ToString();
    const HostMemoryPrediction p = PredictHostMemory(in);
    const Status fits = CheckHostMemory(in, limit, "the default", limit);
    ASSERT_TRUE(fits.ok()) << sh.name << ": " << fits.ToString();
    const uint64_t params = Params(in);
    const uint64_t ram_params = params - p.nvme_params;
    // Every block's gradients (2 B) and the NVMe blocks' 16-bit copies (2 B) in RAM, and the RAM
    // blocks' master and moments (12 B): within the limit, less the processes and the slots.
    EXPECT_LE(2 * params + 2 * p.nvme_params + 12 * ram_params, limit) << sh.name;
    std::cout << sh.name << ": " << params << " parameters; states of " << ram_params << " in RAM, "
              << p.nvme_params << " on NVMe; " << p.Describe() << "; disk per step "
              << 12 * p.nvme_params / 1000000000 << " GB each way, "
              << NvmeStepSeconds(p.nvme_params, rate, rate)
              << " s at 8 x 6 GB/s (the store at 97%); limit " << FormatByteSize(limit) << "\n";
  }
}

}  // namespace
}  // namespace offloadd::trainer
