// HostOptimizer with the real offloadd-worker and offloadd-store binaries: a step that fails
// (non-finite gradient norm under clipping, a store killed between steps) must reach every wait
// of the step loop with that error, never leave one blocked. Each
// wait runs under a watchdog: a wait that does not return within kBound fails the test and ends
// the process, so a regression shows as a failure, not as a hung CI job. POSIX calls, not
// std::filesystem: this binary links LibTorch (docs/DEVELOPING.md, hazards).
#include "trainer/pipeline/host_optimizer.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/file.h"
#include "tests/trainer/pipeline/host_optimizer_testlib.h"
#include "trainer/pipeline/group_link.h"
#include "workers/adamw_compact.h"
#include "workers/adamw_kernel_impl.h"

namespace offloadd::trainer {
namespace {

TEST_F(HostOptimizerTest, HealthyStepsUpdateEveryBlock) {
  auto h = Make(Options(StateTier::kNvme));
  ASSERT_TRUE(h);
  for (uint64_t s = 1; s <= 2; ++s) {
    Step(h.get(), s, 0.5f);
    for (int b = 0; b < h->num_blocks(); ++b) {
      Status st = Bounded("WaitUpdated", [&] { return h->WaitUpdated(b, s); });
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->skipped);
  }
}

// The arena holds every region the optimizer allocates, its table entries included: with many
// blocks, the entries the optimizer adds beyond the workers' own (4 per block) once outgrew the
// slack of the workers' estimate, and a Llama-3-8B shape failed with "shared arena full:
// region 'worker0.undo' needs 364 KiB but only 360 KiB ... are left".
TEST_F(HostOptimizerTest, ArenaHoldsTheRegionTableOfManyBlocks) {
  for (const StateTier tier : {StateTier::kCpu, StateTier::kNvme}) {
    HostOptimizerOptions o = Options(tier);
    o.compute = HostDtype::kBf16;
    o.host_weight_copy = false;
    o.block_elements.assign(400, 1024);  // whole pages: no rounding slack
    auto h = HostOptimizer::Create(o);
    ASSERT_TRUE(h.ok()) << (tier == StateTier::kCpu ? "cpu: " : "nvme: ") << h.status().ToString();
  }
}

// bf16 compute without the 16-bit weight copy: 14 bytes per parameter instead of 16, the device
// reads the fp32 masters (compute_weights), and training is bit-identical to the layout with the
// copy, whose copy is the round-to-nearest-even of those masters (the device's cast).
TEST_F(HostOptimizerTest, NoWeightCopyArenaIsSmallerAndTrainsTheSame) {
  HostOptimizerOptions with = Options(StateTier::kCpu);
  with.compute = HostDtype::kBf16;
  with.block_elements = {1 << 18, 1 << 19, 1 << 17};  // whole pages: no rounding
  HostOptimizerOptions without = with;
  without.host_weight_copy = false;
  const uint64_t params = 7 << 17;
  EXPECT_EQ(HostOptimizer::BytesPerParameter(with), 16u);
  EXPECT_EQ(HostOptimizer::BytesPerParameter(without), 14u);
  EXPECT_FALSE(HostOptimizer::WeightsAreFp32(with));
  EXPECT_TRUE(HostOptimizer::WeightsAreFp32(without));
  EXPECT_EQ(HostOptimizer::ArenaBytes(with) - HostOptimizer::ArenaBytes(without), 2 * params);
  // 14 bytes per parameter, the step counters (1/128) and a few MiB of rings, table and rounding.
  EXPECT_LE(HostOptimizer::ArenaBytes(without), params * 14 + params / 128 + (8u << 20));
  HostOptimizerOptions nvme = without;  // the NVMe tier keeps its copy: masters are in the store
  nvme.tier = StateTier::kNvme;
  EXPECT_FALSE(HostOptimizer::WeightsAreFp32(nvme));

  auto a = Make(with), b = Make(without);
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(a->weights_fp32());
  EXPECT_TRUE(b->weights_fp32());
  const auto bf16 = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  };
  for (uint64_t s = 1; s <= 3; ++s) {
    for (HostOptimizer* h : {a.get(), b.get()}) {
      ASSERT_TRUE(h->BeginStep(s, 1e-3).ok());
      for (int blk = h->num_blocks() - 1; blk >= 0; --blk) {
        ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return h->WaitStagingFree(blk); }).ok());
        auto* g = static_cast<uint16_t*>(h->grad_staging(blk));
        for (uint64_t i = 0; i < h->elements(blk); ++i)
          g[i] = bf16(1e-3f * static_cast<float>((i * 7 + s + blk) % 13) - 6e-3f);
        ASSERT_TRUE(h->GradsReady(blk, 0, nullptr).ok());
      }
      ASSERT_TRUE(h->FinishStepAsync().ok());
      auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
  }
  for (int blk = 0; blk < a->num_blocks(); ++blk) {
    const uint64_t n = a->elements(blk);
    ASSERT_EQ(b->compute_weights(blk), static_cast<const void*>(b->master_weights(blk)));
    EXPECT_EQ(b->compute_weight_bytes(blk), n * 4);
    EXPECT_EQ(a->compute_weight_bytes(blk), n * 2);
    EXPECT_EQ(b->grad_staging_bytes(blk), n * 2);
    ASSERT_EQ(std::memcmp(a->master_weights(blk), b->master_weights(blk), n * 4), 0) << blk;
    const auto* copy = static_cast<const uint16_t*>(a->compute_weights(blk));
    const float* master = b->master_weights(blk);
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(copy[i], bf16(master[i])) << blk << " " << i;
  }
}

// Compact optimizer states (int8 blocks, bf16): the arena shrinks by the states' bytes, the
// workers update them, their regions come out and go back in as they are (a checkpoint), and the
// restored optimizer continues with the same bits; a bf16 master with other than bf16 compute is
// refused naming the mode (the NVMe tier: nvme_state_tier_compact_test.cc).
TEST_F(HostOptimizerTest, CompactStatesShrinkTheArenaAndRestoreTheirRegionsBitForBit) {
  HostOptimizerOptions exact = Options(StateTier::kCpu);
  exact.compute = HostDtype::kBf16;
  exact.host_weight_copy = false;
  exact.block_elements = {1 << 18, 1 << 19, 1 << 17};  // whole pages: no rounding
  const uint64_t params = 7 << 17;
  for (const workers::StateDtype state : {workers::StateDtype::kInt8, workers::StateDtype::kBf16}) {
    HostOptimizerOptions o = exact;
    o.mode = {state, workers::MasterDtype::kFp32};
    const bool int8 = state == workers::StateDtype::kInt8;
    EXPECT_DOUBLE_EQ(HostOptimizer::BytesPerParameter(o), int8 ? 2 + 4 + 2 * (1 + 4.0 / 256) : 10);
    const double saved = int8 ? 2 * (3 - 4.0 / 256) : 4;  // per parameter, against exact's 14
    EXPECT_NEAR(
        static_cast<double>(HostOptimizer::ArenaBytes(exact) - HostOptimizer::ArenaBytes(o)),
        saved * params, 6 * 4096.0);
    auto a = Make(o), b = Make(o), e = Make(exact);
    ASSERT_TRUE(a && b && e);
    const auto run = [](HostOptimizer* h, uint64_t s) {
      ASSERT_TRUE(h->BeginStep(s, 1e-3).ok());
      for (int blk = h->num_blocks() - 1; blk >= 0; --blk) {
        ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return h->WaitStagingFree(blk); }).ok());
        auto* g = static_cast<uint16_t*>(h->grad_staging(blk));
        for (uint64_t i = 0; i < h->elements(blk); ++i)  // bf16 values of +-1e-3 .. 6e-3
          g[i] = static_cast<uint16_t>(0x3a83 + ((i * 7 + s + blk) % 13) * 0x10 + (i % 2) * 0x8000);
        ASSERT_TRUE(h->GradsReady(blk, 0, nullptr).ok());
      }
      ASSERT_TRUE(h->FinishStepAsync().ok());
      auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    };
    for (uint64_t s = 1; s <= 3; ++s) {
      run(a.get(), s);
      run(e.get(), s);
    }
    std::vector<float> master;
    std::vector<uint8_t> m, v;
    for (int blk = 0; blk < a->num_blocks(); ++blk) {  // a's step-3 state into b (a resume)
      const uint64_t n = a->elements(blk);
      ASSERT_EQ(a->state_region_bytes(blk), workers::StateRegionBytes(state, n));
      master.resize(n);
      m.resize(a->state_region_bytes(blk));
      v.resize(a->state_region_bytes(blk));
      std::vector<float> fp32(n);
      EXPECT_EQ(a->ReadStates(blk, master.data(), fp32.data(), fp32.data()).code(),
                StatusCode::kFailedPrecondition)
          << "compact states are not fp32";
      ASSERT_TRUE(a->ReadStates(blk, master.data(), nullptr, nullptr).ok());
      ASSERT_TRUE(a->ReadStateRegions(blk, m.data(), v.data()).ok());
      EXPECT_NE(std::memcmp(master.data(), e->master_weights(blk), n * 4), 0)
          << "the mode acts: its masters are not exact's";
      ASSERT_TRUE(b->RestoreStates(blk, master.data(), nullptr, nullptr, 3).ok());
      ASSERT_TRUE(b->RestoreStateRegions(blk, m.data(), v.data()).ok());
    }
    ASSERT_TRUE(b->ResumeAt(3, 3).ok());
    run(a.get(), 4);
    run(b.get(), 4);
    for (int blk = 0; blk < a->num_blocks(); ++blk) {
      const uint64_t n = a->elements(blk);
      EXPECT_EQ(std::memcmp(a->master_weights(blk), b->master_weights(blk), n * 4), 0) << blk;
      std::vector<uint8_t> ma(m.size()), va(m.size()), mb(m.size()), vb(m.size());
      ma.resize(a->state_region_bytes(blk));
      va.resize(ma.size());
      mb.resize(ma.size());
      vb.resize(ma.size());
      ASSERT_TRUE(a->ReadStateRegions(blk, ma.data(), va.data()).ok());
      ASSERT_TRUE(b->ReadStateRegions(blk, mb.data(), vb.data()).ok());
      EXPECT_EQ(ma, mb) << blk;
      EXPECT_EQ(va, vb) << blk;
    }
  }
  HostOptimizerOptions bf16_master = Options(StateTier::kCpu);  // fp32 compute
  bf16_master.mode = {workers::StateDtype::kFp32, workers::MasterDtype::kBf16};
  auto fp32_compute = HostOptimizer::Create(bf16_master);
  ASSERT_FALSE(fp32_compute.ok());
  EXPECT_EQ(fp32_compute.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(fp32_compute.status().message().find("bf16 master, fp32 states with fp32 compute"),
            std::string::npos)
      << fp32_compute.status().ToString();
  bf16_master.compute = HostDtype::kFp16;
  EXPECT_EQ(HostOptimizer::Create(bf16_master).status().code(), StatusCode::kUnimplemented);
}

// A bf16 master (with its Kahan compensation): it is the device's bf16 weights (no 16-bit copy in
// the arena, 2 B per parameter less than exact with the copy), its step tracks exact AdamW's fp32
// master to the compensated master's ~17 bits, it reads out as fp32 (master + compensation) for
// checkpoints and the export, and a resume from its region continues with the same bits.
TEST_F(HostOptimizerTest, ABf16MasterIsTheDevicesWeightsAndResumesFromItsRegionBitForBit) {
  HostOptimizerOptions exact = Options(StateTier::kCpu);
  exact.compute = HostDtype::kBf16;
  exact.host_weight_copy = true;              // exact keeps a bf16 copy beside its fp32 masters
  exact.block_elements = {1 << 18, 1 << 17};  // whole pages: no rounding
  const uint64_t params = 3 << 17;
  HostOptimizerOptions o = exact;
  o.mode = {workers::StateDtype::kFp32, workers::MasterDtype::kBf16};
  EXPECT_DOUBLE_EQ(HostOptimizer::BytesPerParameter(exact), 16);
  EXPECT_DOUBLE_EQ(HostOptimizer::BytesPerParameter(o), 14);  // grads 2, master 4, states 8
  EXPECT_FALSE(HostOptimizer::WeightsAreFp32(o));
  EXPECT_NEAR(static_cast<double>(HostOptimizer::ArenaBytes(exact) - HostOptimizer::ArenaBytes(o)),
              2.0 * params, 4 * 4096.0);
  auto a = Make(o), b = Make(o), e = Make(exact);
  ASSERT_TRUE(a && b && e);
  const auto bf16 = [](float f) { return workers::internal::FloatToBf16(f); };
  for (int blk = 0; blk < a->num_blocks(); ++blk) {  // Make's initial values, 0.01 * (i % 7)
    EXPECT_EQ(a->master_weights(blk), nullptr) << "no fp32 masters in the arena";
    EXPECT_EQ(a->compute_weight_bytes(blk), a->elements(blk) * 2);
    const auto* w = static_cast<const uint16_t*>(a->compute_weights(blk));
    std::vector<float> master(a->elements(blk));
    ASSERT_TRUE(a->ReadStates(blk, master.data(), nullptr, nullptr).ok());
    for (uint64_t i = 0; i < a->elements(blk); ++i) {
      const float p = 0.01f * static_cast<float>(i % 7);
      ASSERT_EQ(w[i], bf16(p)) << i;
      ASSERT_LE(std::fabs(master[i] - p), std::ldexp(p, -16)) << i;  // 17 bits of p
    }
  }
  const auto run = [](HostOptimizer* h, uint64_t s) {
    ASSERT_TRUE(h->BeginStep(s, 1e-3).ok());
    for (int blk = h->num_blocks() - 1; blk >= 0; --blk) {
      ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return h->WaitStagingFree(blk); }).ok());
      auto* g = static_cast<uint16_t*>(h->grad_staging(blk));
      for (uint64_t i = 0; i < h->elements(blk); ++i)  // bf16 values of +-1e-3 .. 6e-3
        g[i] = static_cast<uint16_t>(0x3a83 + ((i * 7 + s + blk) % 13) * 0x10 + (i % 2) * 0x8000);
      ASSERT_TRUE(h->GradsReady(blk, 0, nullptr).ok());
    }
    ASSERT_TRUE(h->FinishStepAsync().ok());
    auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  };
  for (uint64_t s = 1; s <= 3; ++s) {
    run(a.get(), s);
    run(e.get(), s);
  }
  std::vector<uint8_t> w, m, v;
  for (int blk = 0; blk < a->num_blocks(); ++blk) {
    const uint64_t n = a->elements(blk);
    std::vector<float> master(n);
    ASSERT_TRUE(a->ReadStates(blk, master.data(), nullptr, nullptr).ok());
    // Each rounding (the initial values', each of three steps') errs by at most 2^-16 of the
    // value then (half the compensation's ulp); the value moves by at most about lr per step, so
    // by 4e-3 in all. The updates themselves are exact AdamW's (the same fp32 states and
    // gradients; no weight decay to carry the master's error into them).
    const float* ref = e->master_weights(blk);
    const auto* w16 = static_cast<const uint16_t*>(a->compute_weights(blk));
    bool differs = false;
    for (uint64_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(master[i] - ref[i]), 4 * std::ldexp(std::fabs(ref[i]) + 4e-3f, -16))
          << blk << " " << i;
      // The device's weights are the master rounded to bf16: within half a bf16 ulp of it.
      ASSERT_LE(std::fabs(workers::internal::Bf16ToFloat(w16[i]) - master[i]),
                std::ldexp(std::fabs(master[i]), -8))
          << blk << " " << i;
      differs |= master[i] != ref[i];
    }
    EXPECT_TRUE(differs) << "the mode acts: its masters are not exact's";
    // a's step-3 state into b (a resume): the master and state regions as they are.
    ASSERT_EQ(a->master_region_bytes(blk),
              workers::MasterRegionBytes(workers::MasterDtype::kBf16, n));
    w.resize(a->master_region_bytes(blk));
    m.resize(a->state_region_bytes(blk));
    v.resize(m.size());
    ASSERT_TRUE(a->ReadMasterRegion(blk, w.data()).ok());
    ASSERT_TRUE(a->ReadStateRegions(blk, m.data(), v.data()).ok());
    ASSERT_TRUE(b->RestoreStates(blk, master.data(), nullptr, nullptr, 3).ok());
    ASSERT_TRUE(b->RestoreMasterRegion(blk, w.data()).ok());
    ASSERT_TRUE(b->RestoreStateRegions(blk, m.data(), v.data()).ok());
    EXPECT_EQ(e->ReadMasterRegion(blk, w.data()).code(), StatusCode::kFailedPrecondition)
        << "an fp32 master has no bf16 region";
  }
  ASSERT_TRUE(b->ResumeAt(3, 3).ok());
  run(a.get(), 4);
  run(b.get(), 4);
  for (int blk = 0; blk < a->num_blocks(); ++blk) {
    std::vector<uint8_t> wa(a->master_region_bytes(blk)), wb(wa.size());
    std::vector<uint8_t> ma(a->state_region_bytes(blk)), mb(ma.size()), va(ma.size()),
        vb(ma.size());
    ASSERT_TRUE(a->ReadMasterRegion(blk, wa.data()).ok());
    ASSERT_TRUE(b->ReadMasterRegion(blk, wb.data()).ok());
    ASSERT_TRUE(a->ReadStateRegions(blk, ma.data(), va.data()).ok());
    ASSERT_TRUE(b->ReadStateRegions(blk, mb.data(), vb.data()).ok());
    EXPECT_EQ(wa, wb) << blk;
    EXPECT_EQ(ma, mb) << blk;
    EXPECT_EQ(va, vb) << blk;
  }
}

// Per-block placement (nvme_blocks): blocks 0 and 3 keep their states in RAM, the other four (more
// than the three staging slots, so prefetches and reused slots rotate) in the store. Training is
// bit for bit that of every block in RAM, only the NVMe blocks touch the disk (12 B per parameter
// written per step), and a resume into another placement (another host limit) continues with the
// same bits. bf16 and fp32 compute (the fp32 compute copy of NVMe blocks).
// Without host_weight_copy (the trainer's default) a block whose states stay in RAM keeps no 16-bit
// copy beside its master: the device reads the master, as on the RAM tier, and the bits are the
// same.
TEST_F(HostOptimizerTest, MixedPlacementTrainsLikeRamAndResumesIntoAnotherPlacement) {
  for (const auto& [dt, copy] :
       {std::pair{HostDtype::kBf16, true}, std::pair{HostDtype::kBf16, false},
        std::pair{HostDtype::kFp32, true}}) {
    SCOPED_TRACE(std::string(dt == HostDtype::kBf16 ? "bf16" : "fp32") + (copy ? ", copy" : ""));
    HostOptimizerOptions ram = Options(StateTier::kCpu);
    ram.compute = dt;
    ram.host_weight_copy = copy;
    ram.block_elements = {1 << 14, 1 << 15, 1 << 13, 1 << 15, 1 << 14, 1 << 15};  // whole pages
    HostOptimizerOptions mixed = Options(StateTier::kNvme);
    mixed.compute = dt;
    mixed.host_weight_copy = copy;
    mixed.block_elements = ram.block_elements;
    HostOptimizerOptions all_nvme = mixed;
    mixed.nvme_blocks = {false, true, true, false, true, true};
    HostOptimizerOptions other = mixed;  // the resumed run: another placement, its own store
    other.nvme_blocks = {true, false, true, true, false, true};
    other.nvme_dirs = {dir_ + ".other"};
    // The RAM blocks' master and moments join the arena; the slots and the rest are the same.
    const uint64_t ram_params = (1 << 14) + (1 << 15);
    // (And without the copy, their 16-bit regions go.)
    EXPECT_EQ(HostOptimizer::ArenaBytes(mixed) - HostOptimizer::ArenaBytes(all_nvme),
              12 * ram_params + 2 * 4096 * 6 - (dt == HostDtype::kFp32 ? 4 * ram_params : 0) -
                  (copy ? 0 : 2 * ram_params));
    const auto bf16 = [](float f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    };
    const auto run = [&](HostOptimizer* h, uint64_t s) {
      ASSERT_TRUE(h->BeginStep(s, 1e-3).ok());
      for (int blk = h->num_blocks() - 1; blk >= 0; --blk) {
        ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return h->WaitStagingFree(blk); }).ok());
        for (uint64_t i = 0; i < h->elements(blk); ++i) {
          const float g = 1e-3f * static_cast<float>((i * 7 + s + blk) % 13) - 6e-3f;
          if (dt == HostDtype::kBf16) {
            static_cast<uint16_t*>(h->grad_staging(blk))[i] = bf16(g);
          } else {
            static_cast<float*>(h->grad_staging(blk))[i] = g;
          }
        }
        ASSERT_TRUE(h->GradsReady(blk, 0, nullptr).ok());
      }
      ASSERT_TRUE(h->FinishStepAsync().ok());
      auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    };
    using States = std::vector<std::vector<float>>;  // per block: master, exp_avg, exp_avg_sq
    const auto states = [](HostOptimizer* h) {
      States out;
      for (int blk = 0; blk < h->num_blocks(); ++blk) {
        const uint64_t n = h->elements(blk);
        std::vector<float> m(n), a(n), v(n);
        EXPECT_TRUE(h->ReadStates(blk, m.data(), a.data(), v.data()).ok());
        for (auto* x : {&m, &a, &v}) out.push_back(std::move(*x));
      }
      return out;
    };
    auto a = Make(ram), b = Make(mixed);
    ASSERT_TRUE(a && b);
    EXPECT_NE(b->master_weights(0), nullptr);
    EXPECT_EQ(b->master_weights(1), nullptr);
    // Block 0's states are in RAM: without the copy the device reads its master.
    EXPECT_EQ(b->compute_weights(0) == static_cast<const void*>(b->master_weights(0)),
              !copy || dt == HostDtype::kFp32);
    EXPECT_EQ(b->compute_weight_bytes(1), b->elements(1) * (dt == HostDtype::kFp32 ? 4 : 2));
    (void)b->TakeTotals();
    for (uint64_t s = 1; s <= 2; ++s) {
      run(a.get(), s);
      run(b.get(), s);
    }
    const UpdateTotals t = b->TakeTotals();
    const uint64_t nvme_params = (1 << 15) + (1 << 13) + (1 << 14) + (1 << 15);
    EXPECT_EQ(t.nvme_write_bytes, 2 * 12 * nvme_params);
    EXPECT_EQ(t.nvme_read_bytes, 2 * 12 * nvme_params);  // each NVMe block once a step
    const States at2 = states(b.get());
    ASSERT_TRUE(at2 == states(a.get()));
    // Resume step 2's states into the other placement and run step 3 on all three.
    {
      auto c = Make(other);
      ASSERT_TRUE(c);
      for (int blk = 0; blk < c->num_blocks(); ++blk) {
        ASSERT_TRUE(c->RestoreStates(blk, at2[3 * blk].data(), at2[3 * blk + 1].data(),
                                     at2[3 * blk + 2].data(), 2)
                        .ok());
      }
      ASSERT_TRUE(c->ResumeAt(2, 2).ok());
      for (HostOptimizer* h : {a.get(), b.get(), c.get()}) run(h, 3);
      const States want = states(a.get());
      EXPECT_TRUE(states(b.get()) == want);
      EXPECT_TRUE(states(c.get()) == want);
      for (int blk = 0; blk < c->num_blocks(); ++blk) {  // the weights the device reads too
        if (c->compute_weight_bytes(blk) == a->compute_weight_bytes(blk)) {
          ASSERT_EQ(std::memcmp(a->compute_weights(blk), c->compute_weights(blk),
                                a->compute_weight_bytes(blk)),
                    0)
              << blk;
          continue;
        }
        // An NVMe block's 16-bit copy against the RAM tier's master, rounded as the device does.
        ASSERT_EQ(c->compute_weight_bytes(blk), 2 * c->elements(blk)) << blk;
        const auto* master = static_cast<const float*>(a->compute_weights(blk));
        const auto* w16 = static_cast<const uint16_t*>(c->compute_weights(blk));
        for (uint64_t i = 0; i < c->elements(blk); ++i) ASSERT_EQ(w16[i], bf16(master[i])) << blk;
      }
    }
    EXPECT_TRUE(RemoveTree(dir_ + ".other").ok());
  }
}

// Defect 1: NaN gradients with clipping. The next forward waits for the blocks' update of the
// failed step (WaitUpdated); before the fix only WaitFinished saw the error and this wait hung.
TEST_F(HostOptimizerTest, NonFiniteNormFailsEveryWaitOfTheStep) {
  for (StateTier tier : {StateTier::kCpu, StateTier::kNvme}) {
    auto h = Make(Options(tier));
    ASSERT_TRUE(h);
    Step(h.get(), 1, std::numeric_limits<float>::quiet_NaN());
    Status st = Bounded("WaitUpdated", [&] { return h->WaitUpdated(0, 1); });
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_NE(st.message().find("gradient norm is not finite (nan); step 1 was not applied"),
              std::string::npos)
        << st.ToString();
    auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(1); });
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_FALSE(h->BeginStep(2, 1e-3).ok());  // the optimizer stays failed
  }
}

// fp16 loss scaling: the same non-finite norm is an overflow; the step is skipped, not failed.
TEST_F(HostOptimizerTest, NonFiniteNormSkipsTheStepWithLossScaling) {
  HostOptimizerOptions o = Options(StateTier::kCpu);
  o.skip_nonfinite = true;
  auto h = Make(o);
  ASSERT_TRUE(h);
  Step(h.get(), 1, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(Bounded("WaitUpdated", [&] { return h->WaitUpdated(0, 1); }).ok());
  auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(1); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->skipped);
  EXPECT_EQ(r->adam_step, 0u);
}

// Defect 2: the store dies while the step loop computes (no store I/O in flight); with clipping
// the updates then run in FinishStep, whose first read from the store finds it dead.
TEST_F(HostOptimizerTest, KilledStoreFailsEveryWaitNamingTheStore) {
  auto h = Make(Options(StateTier::kNvme));
  ASSERT_TRUE(h);
  Step(h.get(), 1, 0.5f);
  ASSERT_TRUE(Bounded("WaitFinished", [&] { return h->WaitFinished(1); }).ok());
  const pid_t store = ChildNamed("offloadd-store");
  ASSERT_GT(store, 0);
  ASSERT_EQ(::kill(store, SIGKILL), 0);
  Step(h.get(), 2, 0.5f);
  Status st = Bounded("WaitUpdated", [&] { return h->WaitUpdated(0, 2); });
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("offloadd-store (pid " + std::to_string(store) +
                              ") died: killed by signal 9"),
            std::string::npos)
      << st.ToString();
  EXPECT_FALSE(Bounded("WaitFinished", [&] { return h->WaitFinished(2); }).ok());
  Bounded("destruction", [&] {
    h.reset();
    return 0;
  });
}

// The store stops answering (SIGSTOP) and then the optimizer is destroyed, as a failed or
// cancelled job does: destruction must not wait on the store for ever.
TEST_F(HostOptimizerTest, DestructionIsBoundedWithAStoppedStore) {
  auto h = Make(Options(StateTier::kNvme));
  ASSERT_TRUE(h);
  const pid_t store = ChildNamed("offloadd-store");
  ASSERT_GT(store, 0);
  ASSERT_EQ(::kill(store, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  Bounded("destruction", [&] {
    h.reset();
    return 0;
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("destroyed in %.1f s with the store stopped\n", s);
  EXPECT_EQ(::kill(store, 0), -1);  // killed and reaped
}

// ---- data parallel: one leader, one follower, the same arena ----

// The gradient each rank computes for element i of block b at `step` (rank 0 and 1 each hold a
// part of the batch; their sum is the step's gradient).
float RankGrad(int rank, int b, uint64_t i, uint64_t step) {
  return 0.01f * static_cast<float>((i * 7 + static_cast<uint64_t>(b) * 3 + step + static_cast<uint64_t>(rank)) % 11) - 0.05f;
}

// One step as rank `rank` of two drives it: for each block (reverse order), wait for the staging,
// write this rank's half of the summed gradient (what the reduce-scatter leaves it), hand it over.
void RankStep(HostOptimizer* h, int rank, uint64_t step) {
  ASSERT_TRUE(h->BeginStep(step, 1e-3).ok());
  for (int b = h->num_blocks() - 1; b >= 0; --b) {
    ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return h->WaitStagingFree(b); }).ok());
    const uint64_t n = h->elements(b), chunk = (n + 1) / 2;
    float* g = static_cast<float*>(h->grad_staging(b));
    for (uint64_t i = chunk * rank; i < std::min(n, chunk * (rank + 1)); ++i) {
      g[i] = RankGrad(0, b, i, step) + RankGrad(1, b, i, step);
    }
    ASSERT_TRUE(h->GradsReady(b, 0, nullptr).ok());
  }
  ASSERT_TRUE(h->FinishStepAsync().ok());
}

TEST_F(HostOptimizerTest, DataParallelRanksUpdateOnceLikeOneOptimizer) {
  HostOptimizerOptions o = Options(StateTier::kCpu);
  o.optim.max_grad_norm = 0.05;  // clips: the decision needs every rank's shard
  constexpr uint64_t kSteps = 3;
  // The reference: one optimizer, the whole summed gradient from one caller.
  auto ref = Make(o);
  ASSERT_TRUE(ref);
  for (uint64_t s = 1; s <= kSteps; ++s) {
    ASSERT_TRUE(ref->BeginStep(s, 1e-3).ok());
    for (int b = ref->num_blocks() - 1; b >= 0; --b) {
      ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return ref->WaitStagingFree(b); }).ok());
      float* g = static_cast<float*>(ref->grad_staging(b));
      for (uint64_t i = 0; i < ref->elements(b); ++i) g[i] = RankGrad(0, b, i, s) + RankGrad(1, b, i, s);
      ASSERT_TRUE(ref->GradsReady(b, 0, nullptr).ok());
    }
    ASSERT_TRUE(ref->FinishStepAsync().ok());
  }
  auto ref_result = Bounded("WaitFinished", [&] { return ref->WaitFinished(kSteps); });
  ASSERT_TRUE(ref_result.ok()) << ref_result.status().ToString();

  auto link0 = GroupLink::Create(2, 3, 20);
  ASSERT_TRUE(link0.ok()) << link0.status().ToString();
  o.group = link0->get();
  auto leader = Make(o);
  ASSERT_TRUE(leader);
  auto link1 = GroupLink::Attach((*link0)->Path(), 1, 20);
  ASSERT_TRUE(link1.ok()) << link1.status().ToString();
  HostOptimizerOptions fo = o;
  fo.group = link1->get();
  fo.leader_arena_path = leader->ArenaPath();
  auto follower = Make(fo);  // Initialize waits for the leader's weights, fills nothing
  ASSERT_TRUE(follower);
  ASSERT_TRUE(follower->follower());
  std::vector<int> uploads(3, 0);
  follower->SetOnUpdated([&](int b) {
    ++uploads[b];
    return OkStatus();
  });
  std::thread rank1([&] {
    for (uint64_t s = 1; s <= kSteps; ++s) {
      for (int b = 0; b < 3; ++b) ASSERT_TRUE(Bounded("follower WaitUpdated", [&] { return follower->WaitUpdated(b, s - 1); }).ok());
      RankStep(follower.get(), 1, s);
    }
  });
  for (uint64_t s = 1; s <= kSteps; ++s) {
    for (int b = 0; b < 3; ++b) ASSERT_TRUE(Bounded("WaitUpdated", [&] { return leader->WaitUpdated(b, s - 1); }).ok());
    RankStep(leader.get(), 0, s);
  }
  rank1.join();
  auto lr = Bounded("WaitFinished", [&] { return leader->WaitFinished(kSteps); });
  auto fr = Bounded("follower WaitFinished", [&] { return follower->WaitFinished(kSteps); });
  ASSERT_TRUE(lr.ok() && fr.ok());
  EXPECT_TRUE(lr->clipped);
  EXPECT_EQ(lr->grad_norm, ref_result->grad_norm);  // every shard counted once
  EXPECT_EQ(fr->grad_norm, lr->grad_norm);
  EXPECT_EQ(fr->clip_coef, lr->clip_coef);
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE(Bounded("follower WaitUpdated", [&] { return follower->WaitUpdated(b, kSteps); }).ok());
    EXPECT_EQ(uploads[b], static_cast<int>(kSteps)) << "block " << b;  // the follower uploads each update
    const uint64_t n = leader->elements(b);
    std::vector<float> m1(n), a1(n), v1(n), m2(n), a2(n), v2(n);
    ASSERT_TRUE(ref->ReadStates(b, m1.data(), a1.data(), v1.data()).ok());
    ASSERT_TRUE(leader->ReadStates(b, m2.data(), a2.data(), v2.data()).ok());
    EXPECT_EQ(m1, m2) << "block " << b;  // bit for bit: the same AdamW on the same gradients
    EXPECT_EQ(a1, a2);
    EXPECT_EQ(v1, v2);
    // The follower computes with the leader's weights, in the same memory.
    EXPECT_EQ(std::memcmp(follower->compute_weights(b), leader->compute_weights(b), leader->compute_weight_bytes(b)), 0);
  }
  // Between steps a follower reads the states from the leader's arena (RAM tier): what a block
  // whose states move to the GPUs starts from on every rank.
  for (int b = 0; b < 3; ++b) {
    const uint64_t n = leader->elements(b);
    std::vector<float> m1(n), a1(n), v1(n), m2(n), a2(n), v2(n);
    ASSERT_TRUE(leader->ReadStates(b, m1.data(), a1.data(), v1.data()).ok());
    ASSERT_TRUE(follower->ReadStates(b, m2.data(), a2.data(), v2.data()).ok());
    EXPECT_EQ(m1, m2);
    EXPECT_EQ(a1, a2);
    EXPECT_EQ(v1, v2);
  }
}

// A failed step on the leader (a non-finite norm under clipping) reaches the follower's waits,
// and a follower whose leader never comes gives up after the group timeout, naming the wait.
TEST_F(HostOptimizerTest, DataParallelFailuresReachTheFollower) {
  HostOptimizerOptions o = Options(StateTier::kCpu);
  auto link0 = GroupLink::Create(2, 3, 2);
  ASSERT_TRUE(link0.ok());
  o.group = link0->get();
  auto leader = Make(o);
  ASSERT_TRUE(leader);
  auto link1 = GroupLink::Attach((*link0)->Path(), 1, 2);
  ASSERT_TRUE(link1.ok());
  HostOptimizerOptions fo = o;
  fo.group = link1->get();
  fo.leader_arena_path = leader->ArenaPath();
  auto follower = Make(fo);
  ASSERT_TRUE(follower);
  // Nobody lands block 2 on the leader's side: the follower's staging wait times out.
  ASSERT_TRUE(follower->GradsReady(2, 0, nullptr).ok());
  Status st = Bounded("follower WaitStagingFree", [&] { return follower->WaitStagingFree(2); });
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("rank 0 to consume block 2"), std::string::npos) << st.ToString();
  // A NaN gradient: the leader's step fails and so does every wait of the follower.
  std::thread rank1([&] {
    for (int b = 1; b >= 0; --b) {
      (void)follower->WaitStagingFree(b);
      (void)follower->GradsReady(b, 0, nullptr);
    }
  });
  ASSERT_TRUE(leader->BeginStep(1, 1e-3).ok());
  for (int b = 2; b >= 0; --b) {
    float* g = static_cast<float*>(leader->grad_staging(b));
    for (uint64_t i = 0; i < leader->elements(b); ++i) g[i] = b == 1 ? std::numeric_limits<float>::quiet_NaN() : 0.1f;
    ASSERT_TRUE(leader->GradsReady(b, 0, nullptr).ok());
  }
  ASSERT_TRUE(leader->FinishStepAsync().ok());
  rank1.join();
  EXPECT_FALSE(Bounded("WaitFinished", [&] { return leader->WaitFinished(1); }).ok());
  EXPECT_FALSE(Bounded("follower WaitFinished", [&] { return follower->WaitFinished(1); }).ok());
  EXPECT_FALSE(Bounded("follower WaitUpdated", [&] { return follower->WaitUpdated(0, 1); }).ok());
}

// Rank 0 waiting for the other ranks' shards of a block gives up after the group's timeout
// (parallel.timeout_seconds, 2 s here), as the GroupLink waits do: it was a fixed 600 s.
TEST_F(HostOptimizerTest, DataParallelLeaderWaitsForPeersAtMostTheGroupTimeout) {
  HostOptimizerOptions o = Options(StateTier::kCpu);
  auto link0 = GroupLink::Create(2, 3, 2);
  ASSERT_TRUE(link0.ok());
  o.group = link0->get();
  auto leader = Make(o);
  ASSERT_TRUE(leader);
  ASSERT_TRUE(leader->BeginStep(1, 1e-3).ok());
  const auto t0 = std::chrono::steady_clock::now();
  for (int b = 2; b >= 0; --b) {
    float* g = static_cast<float*>(leader->grad_staging(b));
    for (uint64_t i = 0; i < leader->elements(b); ++i) g[i] = 0.1f;
    ASSERT_TRUE(leader->GradsReady(b, 0, nullptr).ok());
  }
  ASSERT_TRUE(leader->FinishStepAsync().ok());
  auto r = Bounded("leader WaitFinished", [&] { return leader->WaitFinished(1); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_NE(r.status().message().find("waited 2 s (parallel timeout)"), std::string::npos) << r.status().ToString();
  EXPECT_LT(waited, 30.0);
}

}  // namespace
}  // namespace offloadd::trainer
