// HostOptimizer with compact optimizer states on the NVMe tier (NvmeStateTier stores and stages the
// mode's own regions: bf16 or int8 states with their block scales, a bf16 master with its
// compensation).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "job/arena_layout.h"
#include "tests/trainer/pipeline/host_optimizer_testlib.h"
#include "trainer/pipeline/host_optimizer.h"
#include "workers/adamw_compact.h"

namespace offloadd::trainer {
namespace {

using workers::MasterDtype;
using workers::OptimizerMode;
using workers::StateDtype;

uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void StepAll(HostOptimizer* h, uint64_t s) {
  ASSERT_TRUE(h->BeginStep(s, 1e-3).ok());
  for (int blk = h->num_blocks() - 1; blk >= 0; --blk) {
    ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return h->WaitStagingFree(blk); }).ok());
    auto* g = static_cast<uint16_t*>(h->grad_staging(blk));
    for (uint64_t i = 0; i < h->elements(blk); ++i)
      g[i] = Bf16(1e-3f * static_cast<float>((i * 7 + s + blk) % 13) - 6e-3f);
    ASSERT_TRUE(h->GradsReady(blk, 0, nullptr).ok());
  }
  ASSERT_TRUE(h->FinishStepAsync().ok());
  auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

// A block's checkpoint in a compact mode: the master as fp32 values, the state regions and (a
// bf16 master) the master region, byte for byte.
struct BlockState {
  std::vector<float> master;
  std::vector<uint8_t> m, v, master_region;
  bool operator==(const BlockState&) const = default;
};

std::vector<BlockState> Read(HostOptimizer* h) {
  std::vector<BlockState> out;
  for (int blk = 0; blk < h->num_blocks(); ++blk) {
    BlockState s;
    s.master.resize(h->elements(blk));
    s.m.resize(h->state_region_bytes(blk));
    s.v.resize(h->state_region_bytes(blk));
    EXPECT_TRUE(h->ReadStates(blk, s.master.data(), nullptr, nullptr).ok());
    EXPECT_TRUE(h->ReadStateRegions(blk, s.m.data(), s.v.data()).ok());
    if (h->mode().master == MasterDtype::kBf16) {
      s.master_region.resize(h->master_region_bytes(blk));
      EXPECT_TRUE(h->ReadMasterRegion(blk, s.master_region.data()).ok());
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The weights the device reads for block `blk`: from RAM, or read back from the store.
std::vector<uint8_t> DeviceWeights(HostOptimizer* h, int blk) {
  const void* w = h->compute_weights(blk);
  if (w == nullptr) {
    auto fetched = h->FetchWeights(blk, 0);
    EXPECT_TRUE(fetched.ok()) << fetched.status().ToString();
    if (!fetched.ok()) return {};
    w = *fetched;
  }
  const auto* p = static_cast<const uint8_t*>(w);
  return std::vector<uint8_t>(p, p + h->compute_weight_bytes(blk));
}

// Every compact mode with its states split between RAM and the store (four NVMe blocks, more than
// the three staging slots, so prefetches and reused slots rotate) trains bit for bit as with every
// block in RAM: masters, state regions (int8 block scales, a bf16 master's compensation) and the
// weights the device reads. The store holds each NVMe block's regions in the mode's bytes, read
// and written once a step; the arena's slots and in-RAM blocks shrink with the mode. A checkpoint
// of the regions resumes into another placement, with the bf16 master's weights on NVMe too, and
// continues with the same bits.
TEST_F(HostOptimizerTest, CompactStatesOnNvmeTrainLikeRamAndResumeIntoAnotherPlacement) {
  const OptimizerMode modes[] = {{StateDtype::kBf16, MasterDtype::kFp32},
                                 {StateDtype::kInt8, MasterDtype::kFp32},
                                 {StateDtype::kFp32, MasterDtype::kBf16},
                                 {StateDtype::kInt8, MasterDtype::kBf16}};
  for (const OptimizerMode mode : modes) {
    SCOPED_TRACE(mode.Describe());
    HostOptimizerOptions ram = Options(StateTier::kCpu);
    ram.compute = HostDtype::kBf16;
    ram.mode = mode;
    ram.block_elements = {1 << 14, 1 << 15, 1 << 13, 1 << 15, 1 << 14, 1 << 15 | 100};
    HostOptimizerOptions mixed = Options(StateTier::kNvme);
    mixed.compute = HostDtype::kBf16;
    mixed.mode = mode;
    mixed.block_elements = ram.block_elements;
    mixed.nvme_blocks = {false, true, true, false, true, true};
    HostOptimizerOptions other = mixed;  // the resumed run: another placement, its own store
    other.nvme_blocks = {true, false, true, true, false, true};
    if (mode.master == MasterDtype::kBf16)  // the bf16 master's own half goes to the store
      other.nvme_weight_blocks = {true, false, false, true, false, true};
    other.nvme_dirs = {dir_ + ".other"};

    // The arena: the exact mode's layout less the bytes the mode saves in the slots and the RAM
    // blocks (a bf16 master keeps its bf16 half in RAM for the device instead of a 16-bit copy).
    HostOptimizerOptions exact = mixed;
    exact.mode = {};
    uint64_t saved = 0;
    const uint64_t slots = std::max<uint32_t>(2, mixed.nvme_slots);
    const uint64_t largest_nvme = 1 << 15 | 100;
    saved += slots * (internal::ArenaStateBytes({}, largest_nvme) -
                      internal::ArenaStateBytes(mode, largest_nvme));
    for (uint64_t n : {uint64_t{1} << 14, uint64_t{1} << 15})  // blocks 0 and 3, in RAM
      saved += internal::ArenaStateBytes({}, n) - internal::ArenaStateBytes(mode, n);
    if (mode.master == MasterDtype::kBf16) {  // no 16-bit copy region; NVMe blocks' bf16 halves
      uint64_t copies = 0;
      for (size_t b = 0; b < mixed.block_elements.size(); ++b) {
        const uint64_t n = mixed.block_elements[b];
        saved += (n * 2 + 4095) / 4096 * 4096;
        if (mixed.nvme_blocks[b]) copies += (n * 2 + 4095) / 4096 * 4096;
      }
      saved -= copies;
    }
    EXPECT_EQ(HostOptimizer::ArenaBytes(exact) - HostOptimizer::ArenaBytes(mixed), saved);

    mixed.nvme_dirs = {dir_ + ".mixed"};
    auto a = Make(ram), b = Make(mixed);
    ASSERT_TRUE(a && b);
    (void)b->TakeTotals();
    for (uint64_t s = 1; s <= 2; ++s) {
      StepAll(a.get(), s);
      StepAll(b.get(), s);
    }
    uint64_t stored = 0;  // the NVMe blocks' regions in the mode's bytes
    for (size_t blk = 0; blk < mixed.block_elements.size(); ++blk) {
      if (mixed.nvme_blocks[blk])
        stored += internal::StoredStateBytes(mode, mixed.block_elements[blk]);
    }
    if (mode.state != StateDtype::kFp32) {  // a bf16 master is 4 B like an fp32 one (+ padding)
      EXPECT_LT(stored, 12 * ((1 << 15) + (1 << 13) + (1 << 14) + (1 << 15 | 100)));
    }
    const UpdateTotals t = b->TakeTotals();
    EXPECT_EQ(t.nvme_write_bytes, 2 * stored);
    EXPECT_EQ(t.nvme_read_bytes, 2 * stored);  // each NVMe block once a step
    const std::vector<BlockState> at2 = Read(b.get());
    ASSERT_TRUE(at2 == Read(a.get()));
    for (int blk = 0; blk < a->num_blocks(); ++blk)
      EXPECT_EQ(DeviceWeights(a.get(), blk), DeviceWeights(b.get(), blk)) << blk;
    {
      auto c = Make(other);
      ASSERT_TRUE(c);
      for (int blk = 0; blk < c->num_blocks(); ++blk) {
        const BlockState& s = at2[static_cast<size_t>(blk)];
        ASSERT_TRUE(c->RestoreStates(blk, s.master.data(), nullptr, nullptr, 2).ok());
        ASSERT_TRUE(c->RestoreStateRegions(blk, s.m.data(), s.v.data()).ok());
        if (mode.master == MasterDtype::kBf16) {
          ASSERT_TRUE(c->RestoreMasterRegion(blk, s.master_region.data()).ok());
        }
      }
      ASSERT_TRUE(c->ResumeAt(2, 2).ok());
      for (HostOptimizer* h : {a.get(), b.get(), c.get()}) StepAll(h, 3);
      const std::vector<BlockState> want = Read(a.get());
      EXPECT_TRUE(Read(b.get()) == want);
      EXPECT_TRUE(Read(c.get()) == want);
      EXPECT_FALSE(want == at2) << "step 3 updates";
      for (int blk = 0; blk < c->num_blocks(); ++blk)
        EXPECT_EQ(DeviceWeights(a.get(), blk), DeviceWeights(c.get(), blk)) << blk;
    }
    a.reset();
    b.reset();  // its store stops before its directory goes
    EXPECT_TRUE(RemoveTree(dir_ + ".other").ok());
    EXPECT_TRUE(RemoveTree(dir_ + ".mixed").ok());
  }
}

}  // namespace
}  // namespace offloadd::trainer
