// HostOptimizer with blocks' 16-bit weights in the NVMe store beside their states
// (HostOptimizerOptions::nvme_weight_blocks; NvmeStateTier, nvme_state_tier_weights.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/trainer/pipeline/host_optimizer_testlib.h"
#include "trainer/pipeline/host_optimizer.h"

namespace offloadd::trainer {
namespace {

// offload_param: {device: nvme}: blocks whose 16-bit weights live in the store beside their states
// train bit for bit as with every weight in RAM; the weights read back (FetchWeights) are the ones
// the RAM run's device reads; a resume restores them into another placement. Their arena regions
// are gone (2 B per parameter), replaced by a weight region per staging slot and two read buffers.
TEST_F(HostOptimizerTest, WeightsOnNvmeTrainLikeRamBitForBit) {
  HostOptimizerOptions ram = Options(StateTier::kCpu);
  ram.compute = HostDtype::kBf16;
  ram.block_elements = {1 << 14, 1 << 15, 1 << 13, 1 << 15, 1 << 14, 1 << 15};  // whole pages
  HostOptimizerOptions w = Options(StateTier::kNvme);
  w.compute = HostDtype::kBf16;
  w.block_elements = ram.block_elements;
  w.nvme_blocks = {false, true, true, false, true, true};
  HostOptimizerOptions no_weights = w;
  w.nvme_weight_blocks = {false, true, false, false, true, true};
  const uint64_t weight_params = (1 << 15) + (1 << 14) + (1 << 15);
  const uint64_t per_buffer = 2 * (1 << 15) + 2 * 4096;  // the largest block, and its padding
  EXPECT_EQ(HostOptimizer::ArenaBytes(w) + 2 * weight_params,
            HostOptimizer::ArenaBytes(no_weights) +
                (w.nvme_slots + HostOptimizer::kWeightBuffers) * per_buffer);
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
        const float g = 1e-3f * static_cast<float>((i * 5 + s + blk) % 11) - 5e-3f;
        static_cast<uint16_t*>(h->grad_staging(blk))[i] = bf16(g);
      }
      ASSERT_TRUE(h->GradsReady(blk, 0, nullptr).ok());
    }
    ASSERT_TRUE(h->FinishStepAsync().ok());
    auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  };
  using States = std::vector<std::vector<float>>;
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
  // Every block's 16-bit weights as the device would read them: NVMe ones through the two
  // buffers in turn, the next one's read issued ahead while this one is fetched.
  const auto weights = [](HostOptimizer* h) {
    std::vector<std::vector<uint16_t>> out;
    std::vector<int> on_nvme;
    for (int blk = 0; blk < h->num_blocks(); ++blk) {
      if (h->weights_on_nvme(blk)) on_nvme.push_back(blk);
    }
    for (int blk = 0, i = 0; blk < h->num_blocks(); ++blk) {
      const void* src = h->compute_weights(blk);
      if (h->weights_on_nvme(blk)) {
        EXPECT_EQ(src, nullptr);
        if (i + 1 < static_cast<int>(on_nvme.size())) {
          EXPECT_TRUE(h->PrefetchWeights(on_nvme[i + 1], (i + 1) % 2).ok());
        }
        auto fetched = h->FetchWeights(blk, i % 2);
        EXPECT_TRUE(fetched.ok()) << fetched.status().ToString();
        src = fetched.ok() ? *fetched : nullptr;
        ++i;
      }
      const auto* p = static_cast<const uint16_t*>(src);
      out.emplace_back(p, p + (p != nullptr ? h->elements(blk) : 0));
    }
    return out;
  };
  auto a = Make(ram), b = Make(w);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(b->weights_on_nvme(1));
  EXPECT_FALSE(b->weights_on_nvme(2));                // its states on NVMe, its weights in RAM
  EXPECT_TRUE(weights(b.get()) == weights(a.get()));  // initialised into the store
  (void)b->TakeTotals();
  for (uint64_t s = 1; s <= 2; ++s) {
    run(a.get(), s);
    run(b.get(), s);
  }
  const UpdateTotals t = b->TakeTotals();
  const uint64_t nvme_params = (1 << 15) + (1 << 13) + (1 << 14) + (1 << 15);
  EXPECT_EQ(t.nvme_read_bytes, 2 * 12 * nvme_params);  // the update reads no old weights
  EXPECT_EQ(t.nvme_write_bytes, 2 * (12 * nvme_params + 2 * weight_params));
  const States at2 = states(b.get());
  ASSERT_TRUE(at2 == states(a.get()));
  ASSERT_TRUE(weights(b.get()) == weights(a.get()));
  // Resume step 2's states into another placement (every NVMe block's weights on NVMe) and run
  // step 3 on all three.
  HostOptimizerOptions other = w;
  other.nvme_blocks = {true, false, true, true, false, true};
  other.nvme_weight_blocks = {true, false, true, true, false, true};
  other.nvme_dirs = {dir_ + ".other"};
  {
    auto c = Make(other);
    ASSERT_TRUE(c);
    for (int blk = 0; blk < c->num_blocks(); ++blk) {
      ASSERT_TRUE(c->RestoreStates(blk, at2[3 * blk].data(), at2[3 * blk + 1].data(),
                                   at2[3 * blk + 2].data(), 2)
                      .ok());
    }
    ASSERT_TRUE(c->ResumeAt(2, 2).ok());
    EXPECT_TRUE(weights(c.get()) == weights(a.get()));  // derived from the restored masters
    // Read ahead before step 3 updates block 1: the update overtakes the read, which is dropped.
    const uint64_t hits = b->weight_prefetch_hits();
    ASSERT_TRUE(b->PrefetchWeights(1, 0).ok());
    for (HostOptimizer* h : {a.get(), b.get(), c.get()}) run(h, 3);
    const States want = states(a.get());
    EXPECT_TRUE(states(b.get()) == want);
    EXPECT_TRUE(states(c.get()) == want);
    EXPECT_TRUE(weights(b.get()) == weights(a.get()));
    EXPECT_EQ(b->weight_prefetch_hits(), hits + 2);  // blocks 4 and 5, read ahead; 1 read again
    EXPECT_TRUE(weights(c.get()) == weights(a.get()));
  }
  EXPECT_TRUE(RemoveTree(dir_ + ".other").ok());
  EXPECT_FALSE(a->FetchWeights(0, 0).ok());  // nothing on NVMe there
  EXPECT_EQ(b->FetchWeights(1, HostOptimizer::kWeightBuffers).status().code(),
            StatusCode::kInvalidArgument);
}

// A store killed under NVMe weights: the next read of them fails at once, naming the store and the
// block, never blocks.
TEST_F(HostOptimizerTest, WeightsOnNvmeFromAKilledStoreFailNamingIt) {
  HostOptimizerOptions o = Options(StateTier::kNvme);
  o.compute = HostDtype::kBf16;
  o.nvme_weight_blocks = {true, false, true};
  auto h = Make(o);
  ASSERT_TRUE(h);
  ASSERT_TRUE(Bounded("FetchWeights", [&] { return h->FetchWeights(2, 1).status(); }).ok());
  const pid_t store = ChildNamed("offloadd-store");
  ASSERT_GT(store, 0);
  ASSERT_EQ(::kill(store, SIGKILL), 0);
  const Status st = Bounded("FetchWeights", [&] { return h->FetchWeights(0, 0).status(); });
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("reading block 0's weights from NVMe"), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("offloadd-store (pid " + std::to_string(store) + ") died"),
            std::string::npos)
      << st.ToString();
  Bounded("destruction", [&] {
    h.reset();
    return 0;
  });
}

TEST_F(HostOptimizerTest, WeightsOnNvmeAreRefusedWhereTheyCannotAct) {
  HostOptimizerOptions o = Options(StateTier::kNvme);
  o.compute = HostDtype::kBf16;
  o.nvme_blocks = {true, false, true};
  o.nvme_weight_blocks = {false, true, false};  // block 1's states are in RAM
  auto h = HostOptimizer::Create(o);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("block 1 keeps its optimizer states in RAM"),
            std::string::npos)
      << h.status().message();
  o.nvme_weight_blocks = {true, false, true};
  o.compute = HostDtype::kFp32;
  h = HostOptimizer::Create(o);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("need 16-bit compute"), std::string::npos)
      << h.status().message();
  o.compute = HostDtype::kBf16;
  o.nvme_weight_blocks = {true, false};
  EXPECT_FALSE(HostOptimizer::Create(o).ok());  // two names for three blocks
  HostOptimizerOptions r = Options(StateTier::kCpu);
  r.nvme_weight_blocks = {true, true, true};
  h = HostOptimizer::Create(r);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("need the optimizer states on NVMe"), std::string::npos);
}

}  // namespace
}  // namespace offloadd::trainer
