// StepDriver misuse and edge cases (the numerics against PyTorch are in
// tests/python/workers/test_clipping.py).
#include "workers/step_driver.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>

namespace offloadd::workers {
namespace {

std::string WorkerBinary() {
  if (const char* dir = std::getenv("OFFLOADD_BINARY_DIR"))
    return std::string(dir) + "/workers/offloadd-worker";
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
          "../../workers/offloadd-worker")
      .string();
}

TEST(ClipCoefficientTest, FollowsClipGradNormInFp32) {
  float norm = 0;
  EXPECT_EQ(ClipCoefficient(4.0, 1.0, &norm), (1.0f / (2.0f + 1e-6f)) * 1.0f);
  EXPECT_EQ(norm, 2.0f);
  EXPECT_EQ(ClipCoefficient(0.25, 1.0, &norm), 1.0f);  // below max_norm: clamped to 1
  EXPECT_EQ(ClipCoefficient(0.0, 1.0, nullptr), 1.0f);
}

class StepDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seg_ = std::move(ipc::SharedSegment::Create(16 << 20)).value();
    arena_ = std::move(ipc::Arena::Format(&seg_)).value();
    ShardSpec s;
    s.num_elements = kN;
    auto off = [&](const char* name, uint64_t bytes) {
      return std::move(arena_.Allocate(name, ipc::RegionKind::kOther, bytes)).value().offset;
    };
    s.grad_offset = off("g", kN * 2);
    s.master_offset = off("p", kN * 4);
    s.exp_avg_offset = off("m", kN * 4);
    s.exp_avg_sq_offset = off("v", kN * 4);
    s.weights_offset = off("w", kN * 2);
    s.counters_offset = off("c", CountersBytes(kN));
    spec_ = s;
    WorkerPoolOptions o;
    o.worker_binary = WorkerBinary();
    pool_ = std::move(WorkerPool::Start(&seg_, &arena_, o)).value();
  }
  static constexpr uint64_t kN = 5000;
  ipc::SharedSegment seg_;
  ipc::Arena arena_;
  ShardSpec spec_;
  std::unique_ptr<WorkerPool> pool_;
};

TEST_F(StepDriverTest, RejectsMisuse) {
  StepDriver d(pool_.get(), {spec_}, OptimizerConfig{.accumulation_steps = 2});
  EXPECT_EQ(d.GradsReady(0, 0).code(), StatusCode::kFailedPrecondition);  // no step open
  ASSERT_TRUE(d.BeginStep(1, 1e-3).ok());
  EXPECT_EQ(d.BeginStep(2, 1e-3).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d.GradsReady(0, 1).code(), StatusCode::kInvalidArgument);  // micro-batch 0 first
  EXPECT_EQ(d.GradsReady(3, 0).code(), StatusCode::kOutOfRange);
  // accumulation_steps = 2 but no accumulation buffer was given: the worker refuses offset 0.
  ASSERT_TRUE(d.GradsReady(0, 0).ok());
  auto r = d.FinishStep();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange) << r.status().ToString();
}

TEST_F(StepDriverTest, MissingMicroBatchIsAnError) {
  StepDriver d(pool_.get(), {spec_}, OptimizerConfig{});
  ASSERT_TRUE(d.BeginStep(1, 1e-3).ok());
  auto r = d.FinishStep();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("0 of 1 micro-batches"), std::string::npos);
}

TEST_F(StepDriverTest, ReportsEachUpdatedShard) {
  for (double max_norm : {0.0, 1.0}) {
    StepDriver d(pool_.get(), {spec_}, OptimizerConfig{.max_grad_norm = max_norm});
    std::vector<size_t> updated;
    d.SetOnShardUpdated([&](size_t shard) { updated.push_back(shard); });
    const uint64_t step = max_norm > 0 ? 2 : 1;
    ASSERT_TRUE(d.BeginStep(step, 1e-3).ok());
    ASSERT_TRUE(d.GradsReady(0, 0).ok());
    ASSERT_TRUE(d.Poll().ok());  // may or may not have seen the completion yet
    auto r = d.FinishStep();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(updated, std::vector<size_t>{0});
    EXPECT_EQ(r->params_updated, kN);
  }
}

// Shards of `layers` with their own buffers (zero gradients: the order is what is tested).
std::vector<ShardSpec> LayerShards(ipc::Arena* arena, const std::vector<uint32_t>& layers, uint64_t n) {
  std::vector<ShardSpec> out;
  for (uint32_t layer : layers) {
    ShardSpec s;
    s.layer = layer;
    s.num_elements = n;
    auto off = [&](const char* what, uint64_t bytes) {
      static int serial = 0;  // region names are unique per arena
      const std::string name = std::string(what) + std::to_string(serial++);
      return std::move(arena->Allocate(name, ipc::RegionKind::kOther, bytes)).value().offset;
    };
    s.grad_offset = off("g", n * 2);
    s.master_offset = off("p", n * 4);
    s.exp_avg_offset = off("m", n * 4);
    s.exp_avg_sq_offset = off("v", n * 4);
    s.weights_offset = off("w", n * 2);
    s.counters_offset = off("c", AdamWCountersBytes(n));  // with the corrections' half
    out.push_back(s);
  }
  return out;
}

// Backward hands layers over from the top (3) down; the driver notices completions only while it
// waits, so the order below is deterministic: what runs while the first update is in its worker's
// queue is chosen among everything that has landed by then.
std::vector<uint32_t> UpdateOrder(WorkerPool* pool, ipc::Arena* arena, OptimizerConfig config) {
  auto shards = LayerShards(arena, {3, 2, 1, 0}, 20'000);
  StepDriver d(pool, shards, config);
  std::vector<uint32_t> order;
  d.SetOnShardUpdated([&](size_t shard) { order.push_back(shards[shard].layer); });
  EXPECT_TRUE(d.BeginStep(1, 1e-3).ok());
  for (size_t s = 0; s < shards.size(); ++s) EXPECT_TRUE(d.GradsReady(s, 0).ok());
  auto r = d.FinishStep();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return order;
}

TEST_F(StepDriverTest, UpdatesRunEarliestNeededFirst) {
  // One update queued per worker: layer 3 starts at once; of 2, 1, 0 (landed meanwhile) the next
  // forward needs 0 first.
  EXPECT_EQ(UpdateOrder(pool_.get(), &arena_, OptimizerConfig{.update_depth = 1}),
            (std::vector<uint32_t>{3, 0, 1, 2}));
  // Two queued: 3 and 2 are in the worker's queue before 1 and 0 land.
  EXPECT_EQ(UpdateOrder(pool_.get(), &arena_, OptimizerConfig{}), (std::vector<uint32_t>{3, 2, 0, 1}));
}

TEST_F(StepDriverTest, AHookWaitingForAShardNotYetDispatchedDoesNotHang) {
  // The NVMe tier's slot reuse: the hook of layer 0's update waits for layer 1, whose update of
  // this step is still in the ready set (it runs after 0): only submitted commands count there.
  auto shards = LayerShards(&arena_, {2, 1, 0}, 20'000);
  for (double max_norm : {0.0, 1.0}) {
    StepDriver d(pool_.get(), shards, OptimizerConfig{.max_grad_norm = max_norm, .update_depth = 1});
    std::vector<uint32_t> order;
    d.SetOnShardUpdated([&](size_t shard) { order.push_back(shards[shard].layer); });
    d.SetBeforeUpdate([&](size_t shard, ShardSpec*) { return shard == 2 ? d.WaitShardIdle(1) : OkStatus(); });
    ASSERT_TRUE(d.BeginStep(max_norm > 0 ? 2 : 1, 1e-3).ok());
    for (size_t s = 0; s < shards.size(); ++s) ASSERT_TRUE(d.GradsReady(s, 0).ok());
    auto r = d.FinishStep();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // Without clipping layer 2 runs at once; then 0 (whose hook found 1 not yet dispatched), 1.
    EXPECT_EQ(order, max_norm > 0 ? (std::vector<uint32_t>{0, 1, 2}) : (std::vector<uint32_t>{2, 0, 1}));
  }
}

TEST_F(StepDriverTest, LspTransitionHoldsTheLowerLayers) {
  // defer_below_layer = 2: layers 3 and 2 first-come-first-served, 0 and 1 held to FinishStep and
  // then run in ascending order, whatever the queue depth.
  EXPECT_EQ(UpdateOrder(pool_.get(), &arena_, OptimizerConfig{.defer_below_layer = 2, .update_depth = 1}),
            (std::vector<uint32_t>{3, 2, 0, 1}));
}

TEST_F(StepDriverTest, NonFiniteGradientsApplyNothing) {
  uint16_t* g = arena_.At<uint16_t>(spec_.grad_offset);
  for (uint64_t i = 0; i < kN; ++i) g[i] = 0x3c00;  // bf16 0.0078125
  g[1234] = 0x7f80;                                 // +inf
  float* p = arena_.At<float>(spec_.master_offset);
  for (uint64_t i = 0; i < kN; ++i) p[i] = 1.0f;
  StepDriver d(pool_.get(), {spec_}, OptimizerConfig{.max_grad_norm = 1.0});
  ASSERT_TRUE(d.BeginStep(1, 1e-3).ok());
  ASSERT_TRUE(d.GradsReady(0, 0).ok());
  auto r = d.FinishStep();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(p[i], 1.0f);
  EXPECT_EQ(arena_.At<uint64_t>(spec_.counters_offset)[0], 0u);  // step 1 can still be applied
}

// Speculation updates before the norm is known, with grad scale 1: a chunk with an inf gradient
// stays untouched (no inf/NaN reaches the states), the step fails as in hold mode.
TEST_F(StepDriverTest, SpeculationLeavesNonFiniteChunksUntouched) {
  uint16_t* g = arena_.At<uint16_t>(spec_.grad_offset);
  for (uint64_t i = 0; i < kN; ++i) g[i] = 0x3c00;  // bf16 0.0078125
  g[1234] = 0x7f80;                                 // +inf, in chunk 0
  float* p = arena_.At<float>(spec_.master_offset);
  float* m = arena_.At<float>(spec_.exp_avg_offset);
  float* v = arena_.At<float>(spec_.exp_avg_sq_offset);
  for (uint64_t i = 0; i < kN; ++i) p[i] = 1.0f, m[i] = 0.0f, v[i] = 0.0f;
  StepDriver d(pool_.get(), {spec_},
               OptimizerConfig{.max_grad_norm = 1.0, .speculation = Speculation::kAlways});
  ASSERT_TRUE(d.BeginStep(1, 1e-3).ok());
  ASSERT_TRUE(d.GradsReady(0, 0).ok());
  auto r = d.FinishStep();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  for (uint64_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(std::isfinite(p[i]) && std::isfinite(m[i]) && std::isfinite(v[i])) << i;
  }
  for (uint64_t i = 0; i < kChunkElements; ++i) ASSERT_EQ(p[i], 1.0f) << i;  // the inf's chunk
  EXPECT_EQ(arena_.At<uint64_t>(spec_.counters_offset)[0], 0u);
  EXPECT_EQ(arena_.At<uint64_t>(spec_.counters_offset)[1], 1u);  // a finite chunk went ahead
}

// ---- norms given with the gradients (measured on the GPU beside the copy) ----

class GivenNormTest : public StepDriverTest {
 protected:
  static constexpr uint64_t kElems = 20'000;
  // Every gradient is bf16 2^-7: each square is 2^-14, so every summation order gives the exact
  // ||g||^2 = kElems * 2^-14 (what a GPU measured is then what the workers would measure).
  static constexpr double kShardSq = kElems / 16384.0;

  void SetUp() override {
    StepDriverTest::SetUp();
    shards_ = LayerShards(&arena_, {3, 2, 1, 0}, kElems);
  }
  struct Run {
    StepResult result;
    std::vector<size_t> reported;     // on_updated, in order
    std::vector<uint8_t> states;      // every shard's master, moments, weights, as bytes
  };
  // One step over fresh states; given[s] (if any) is handed over with shard s's gradients.
  Run Step(OptimizerConfig config, const std::vector<std::optional<double>>& given,
           std::function<StatusOr<double>(double)> combine = nullptr) {
    for (const ShardSpec& s : shards_) {
      std::fill_n(arena_.At<uint16_t>(s.grad_offset), kElems, uint16_t{0x3c00});  // bf16 2^-7
      std::fill_n(arena_.At<float>(s.master_offset), kElems, 1.0f);
      std::fill_n(arena_.At<float>(s.exp_avg_offset), kElems, 0.0f);
      std::fill_n(arena_.At<float>(s.exp_avg_sq_offset), kElems, 0.0f);
      std::memset(arena_.At<uint8_t>(s.counters_offset), 0, AdamWCountersBytes(kElems));
    }
    StepDriver d(pool_.get(), shards_, config);
    Run run;
    d.SetOnShardUpdated([&](size_t shard) { run.reported.push_back(shard); });
    if (combine) d.SetCombineSquaredNorm(combine);
    EXPECT_TRUE(d.BeginStep(1, 1e-3).ok());
    for (size_t s = 0; s < shards_.size(); ++s) EXPECT_TRUE(d.GradsReady(s, 0, given[s]).ok());
    auto r = d.FinishStep();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) run.result = *r;
    for (const ShardSpec& s : shards_) {
      for (uint64_t off : {s.master_offset, s.exp_avg_offset, s.exp_avg_sq_offset}) {
        const uint8_t* p = arena_.At<uint8_t>(off);
        run.states.insert(run.states.end(), p, p + kElems * 4);
      }
      const uint8_t* w = arena_.At<uint8_t>(s.weights_offset);
      run.states.insert(run.states.end(), w, w + kElems * 2);
    }
    std::sort(run.reported.begin(), run.reported.end());
    return run;
  }
  std::vector<std::optional<double>> Exact() const {
    return std::vector<std::optional<double>>(shards_.size(), kShardSq);
  }
  std::vector<std::optional<double>> Measured() const {
    return std::vector<std::optional<double>>(shards_.size());
  }
  std::vector<ShardSpec> shards_;
};

TEST_F(GivenNormTest, GivenNormsGiveTheMeasuredStepBitForBit) {
  // 4 shards of ||g||^2 = 1.22: max_grad_norm 100 never clips, 1.0 clips at the first shard.
  for (double max_norm : {100.0, 1.0}) {
    for (Speculation spec : {Speculation::kNever, Speculation::kAlways}) {
      for (uint32_t depth : {1u, 2u}) {
        SCOPED_TRACE(testing::Message() << "max_grad_norm " << max_norm << ", speculation "
                                        << SpeculationName(spec) << ", depth " << depth);
        const OptimizerConfig c{.max_grad_norm = max_norm, .update_depth = depth, .speculation = spec};
        const Run measured = Step(c, Measured()), given = Step(c, Exact());
        EXPECT_EQ(given.result.grad_norm, measured.result.grad_norm);
        EXPECT_EQ(given.result.clip_coef, measured.result.clip_coef);
        EXPECT_EQ(given.result.clipped, max_norm < 2.0);
        // Each shard is reported once, when its final update is in the arena.
        EXPECT_EQ(given.reported, (std::vector<size_t>{0, 1, 2, 3}));
        EXPECT_EQ(given.result.params_updated, 4 * kElems);
        if (max_norm < 2.0 && spec == Speculation::kNever) {
          EXPECT_EQ(given.result.speculated_shards, 0u);
          EXPECT_EQ(given.result.params_corrected, 0u);
        } else if (max_norm < 2.0) {
          // kAlways speculates every shard, the given norms making clipping certain or not, and
          // corrects each: the same updates as measured, whatever came back when.
          EXPECT_EQ(given.result.speculated_shards, 4u);
          EXPECT_EQ(measured.result.speculated_shards, 4u);
          EXPECT_EQ(given.result.corrected_shards, 4u);
        }
        EXPECT_TRUE(given.states == measured.states);
      }
    }
  }
}

TEST_F(GivenNormTest, ClippingDecidedWhileSpeculativeUpdatesRunCorrectsEachAfterItsUpdate) {
  // Small norms for the first three shards (speculated), a large one for the last: the step
  // clips, decided at FinishStep without waiting for the speculative updates. Each speculated
  // shard is corrected after its own update; against holding every update (the same given
  // norms) the result differs by the correction's rounding only: |dp| <= 4 ulp(1.0) for masters
  // at 1.0 (the correction re-derives m and v from the speculative update and redoes it).
  std::vector<std::optional<double>> given = {0.01, 0.01, 0.01, 25.0};
  // Queue depth 4: the first three are dispatched (speculatively) as they land. kAuto (its first
  // step speculates): kAlways drains before deciding (see TimingDoesNotChangeAnAlwaysStep).
  const OptimizerConfig spec{
      .max_grad_norm = 1.0, .update_depth = 4, .speculation = Speculation::kAuto};
  const OptimizerConfig hold{.max_grad_norm = 1.0, .update_depth = 4};
  const Run s = Step(spec, given), h = Step(hold, given);
  EXPECT_TRUE(s.result.clipped);
  EXPECT_EQ(s.result.speculated_shards, 3u);
  EXPECT_EQ(s.result.corrected_shards, 3u);
  EXPECT_EQ(s.result.clip_coef, h.result.clip_coef);
  EXPECT_EQ(s.reported, (std::vector<size_t>{0, 1, 2, 3}));  // once each: after the correction
  const float* ps = reinterpret_cast<const float*>(s.states.data());
  const float* ph = reinterpret_cast<const float*>(h.states.data());
  const size_t per_shard = kElems * 4 * 3 + kElems * 2;
  float worst = 0;
  for (size_t shard = 0; shard < 4; ++shard) {
    const size_t base = shard * per_shard / 4;  // the master weights lead each shard's bytes
    for (uint64_t i = 0; i < kElems; ++i) worst = std::max(worst, std::abs(ps[base + i] - ph[base + i]));
  }
  EXPECT_LE(worst, 4 * std::numeric_limits<float>::epsilon()) << worst;
  EXPECT_NE(ps[0], 1.0f);  // an update happened
}

TEST_F(GivenNormTest, TimingDoesNotChangeAnAlwaysStep) {
  // Measured norms, a step that clips at its first shard (||g||^2 ~ 1.3 each, max 1.0). Fast
  // workers (each shard's update is back before the next shard lands) against slow ones (every
  // shard lands at once): kAlways speculates and corrects every shard in both, and the bits are
  // the same. (Stopping at the first norm back, the fast run speculated 1 shard and the slow one
  // more; a corrected update differs from a direct AdamW(c) by rounding: a resident and a
  // streamed GPU run, whose timings differ, then trained apart.)
  const OptimizerConfig c{.max_grad_norm = 1.0,
                          .accumulation_steps = 1,
                          .update_depth = 4,
                          .speculation = Speculation::kAlways};
  auto run = [&](bool fast) {
    for (const ShardSpec& s : shards_) {
      // Varied gradients around 2^-7 (bf16: the upper half of the fp32 bits), so that a corrected
      // update and a direct AdamW(c) round apart.
      for (uint64_t i = 0; i < kElems; ++i) {
        const float g =
            (i % 2 ? -1.0f : 1.0f) * (0.5f + static_cast<float>(i * 7919 % 1000) / 1000) / 128;
        uint32_t bits;
        std::memcpy(&bits, &g, 4);
        arena_.At<uint16_t>(s.grad_offset)[i] = static_cast<uint16_t>(bits >> 16);
      }
      std::fill_n(arena_.At<float>(s.master_offset), kElems, 1.0f);
      std::fill_n(arena_.At<float>(s.exp_avg_offset), kElems, 0.0f);
      std::fill_n(arena_.At<float>(s.exp_avg_sq_offset), kElems, 0.0f);
      std::memset(arena_.At<uint8_t>(s.counters_offset), 0, AdamWCountersBytes(kElems));
    }
    StepDriver d(pool_.get(), shards_, c);
    EXPECT_TRUE(d.BeginStep(1, 1e-3).ok());
    // Slow: the workers are stopped while the shards land (a loaded host), so no norm is back.
    if (!fast) {
      for (pid_t pid : pool_->Pids()) EXPECT_EQ(kill(pid, SIGSTOP), 0);
    }
    for (size_t s = 0; s < shards_.size(); ++s) {
      EXPECT_TRUE(d.GradsReady(s, 0).ok());
      if (fast) {
        EXPECT_TRUE(d.WaitShardIdle(s).ok());  // its update and norm are back
      }
    }
    if (!fast) {
      for (pid_t pid : pool_->Pids()) EXPECT_EQ(kill(pid, SIGCONT), 0);
    }
    auto r = d.FinishStep();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    std::vector<uint8_t> states;
    for (const ShardSpec& s : shards_) {
      for (uint64_t off : {s.master_offset, s.exp_avg_offset, s.exp_avg_sq_offset}) {
        const uint8_t* p = arena_.At<uint8_t>(off);
        states.insert(states.end(), p, p + kElems * 4);
      }
      const uint8_t* w = arena_.At<uint8_t>(s.weights_offset);
      states.insert(states.end(), w, w + kElems * 2);
    }
    return std::make_pair(r.ok() ? *r : StepResult{}, states);
  };
  const auto [fast, fast_states] = run(true);
  const auto [slow, slow_states] = run(false);
  EXPECT_TRUE(fast.clipped);
  EXPECT_EQ(fast.speculated_shards, 4u);
  EXPECT_EQ(fast.corrected_shards, 4u);
  EXPECT_EQ(slow.speculated_shards, 4u);
  EXPECT_EQ(slow.corrected_shards, 4u);
  EXPECT_EQ(fast.clip_coef, slow.clip_coef);
  EXPECT_TRUE(fast_states == slow_states);
  EXPECT_NE(arena_.At<float>(shards_[0].master_offset)[0], 1.0f);  // an update happened
}

TEST_F(GivenNormTest, APartOfTheModelDecidesOnEveryPartsNorm) {
  // ZeRO-1 across hosts: these 4 shards (||g||^2 = 4 x 1.22) are one host's slice; the other
  // hosts' 100 come back from the combine, once per step. Clipping, and the reported norm, are
  // the whole model's; an unclipped step reports it too.
  for (double max_norm : {1.0, 0.0}) {
    for (const auto& given : {Exact(), Measured()}) {
      int calls = 0;
      double local = 0;
      const Run r = Step(OptimizerConfig{.max_grad_norm = max_norm}, given,
                         [&](double sq) -> StatusOr<double> {
                           ++calls;
                           local = sq;
                           return sq + 100.0;
                         });
      EXPECT_EQ(calls, 1);
      EXPECT_NEAR(local, 4 * kShardSq, 1e-9);
      float norm = 0;
      const float coef = ClipCoefficient(local + 100.0, 1.0, &norm);
      EXPECT_EQ(r.result.grad_norm,
                max_norm > 0 ? norm : static_cast<float>(std::sqrt(local + 100.0)));
      EXPECT_EQ(r.result.clip_coef, max_norm > 0 ? coef : 1.0f);
      EXPECT_EQ(r.reported, (std::vector<size_t>{0, 1, 2, 3}));
    }
  }
}

TEST_F(StepDriverTest, AFailedCombineFailsTheStepWithItsReason) {
  StepDriver d(pool_.get(), {spec_}, OptimizerConfig{.max_grad_norm = 1.0});
  d.SetCombineSquaredNorm(
      [](double) -> StatusOr<double> { return UnavailableError("host 1 is gone"); });
  ASSERT_TRUE(d.BeginStep(1, 1e-3).ok());
  ASSERT_TRUE(d.GradsReady(0, 0).ok());
  auto r = d.FinishStep();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("host 1 is gone"), std::string::npos);
}

TEST_F(GivenNormTest, AGivenNormNeedsOneMicroBatch) {
  StepDriver d(pool_.get(), shards_, OptimizerConfig{.max_grad_norm = 1.0, .accumulation_steps = 2});
  ASSERT_TRUE(d.BeginStep(1, 1e-3).ok());
  EXPECT_EQ(d.GradsReady(0, 0, 1.0).code(), StatusCode::kInvalidArgument);
}

TEST_F(GivenNormTest, DeviceShardsCountInTheDecisionAndGetNoCommand) {
  // Shards 2 and 3 (layers 1 and 0) are updated on the device: only their given norms reach the
  // driver, which decides the clip coefficient over all four and reports it (SetOnDecided).
  // Their arena states stay untouched.
  for (Speculation spec : {Speculation::kNever, Speculation::kAlways}) {
    SCOPED_TRACE(SpeculationName(spec));
    std::vector<ShardSpec> shards = shards_;
    shards[2].on_device = shards[3].on_device = true;
    for (const ShardSpec& s : shards) {
      std::fill_n(arena_.At<uint16_t>(s.grad_offset), kElems, uint16_t{0x3c00});  // bf16 2^-7
      std::fill_n(arena_.At<float>(s.master_offset), kElems, 1.0f);
      std::fill_n(arena_.At<float>(s.exp_avg_offset), kElems, 0.0f);
      std::fill_n(arena_.At<float>(s.exp_avg_sq_offset), kElems, 0.0f);
      std::memset(arena_.At<uint8_t>(s.counters_offset), 0, AdamWCountersBytes(kElems));
    }
    StepDriver d(pool_.get(), shards, OptimizerConfig{.max_grad_norm = 1.0, .speculation = spec});
    std::vector<size_t> reported;
    d.SetOnShardUpdated([&](size_t shard) { reported.push_back(shard); });
    std::optional<StepResult> decided;
    d.SetOnDecided([&](const StepResult& r) { decided = r; });
    ASSERT_TRUE(d.BeginStep(1, 1e-3).ok());
    ASSERT_TRUE(d.GradsReady(0, 0).ok());  // measured by the workers
    ASSERT_TRUE(d.GradsReady(1, 0).ok());
    EXPECT_EQ(d.GradsReady(2, 0).code(), StatusCode::kInvalidArgument);  // a device shard needs its norm
    ASSERT_TRUE(d.GradsReady(2, 0, 4.0).ok());
    ASSERT_TRUE(d.GradsReady(3, 0, 5.0).ok());
    auto r = d.FinishStep();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(decided.has_value());
    const double total = 2 * kShardSq + 9.0;
    float norm = 0;
    EXPECT_EQ(r->clip_coef, ClipCoefficient(total, 1.0, &norm));
    EXPECT_EQ(r->grad_norm, norm);
    EXPECT_EQ(decided->grad_scale, r->clip_coef);
    EXPECT_EQ(decided->adam_step, 1u);
    std::sort(reported.begin(), reported.end());
    EXPECT_EQ(reported, (std::vector<size_t>{0, 1}));
    EXPECT_EQ(r->params_updated, 2 * kElems);  // one AdamW per CPU shard (corrections apart)
    for (size_t s : {2, 3}) EXPECT_EQ(arena_.At<float>(shards[s].master_offset)[0], 1.0f);
    EXPECT_NE(arena_.At<float>(shards[0].master_offset)[0], 1.0f);
  }
}

// ---- fp16 dynamic loss scaling (skip_nonfinite) ----

class StepDriverFp16Test : public StepDriverTest {
 protected:
  void SetUp() override {
    StepDriverTest::SetUp();
    spec_.grad_dtype = GradDtype::kFp16;
    spec_.weight_dtype = WeightDtype::kFp16;
    second_ = spec_;
    second_.layer = 1;
    auto off = [&](const char* name, uint64_t bytes) {
      return std::move(arena_.Allocate(name, ipc::RegionKind::kOther, bytes)).value().offset;
    };
    second_.grad_offset = off("g2", kN * 2);
    second_.master_offset = off("p2", kN * 4);
    second_.exp_avg_offset = off("m2", kN * 4);
    second_.exp_avg_sq_offset = off("v2", kN * 4);
    second_.weights_offset = off("w2", kN * 2);
    second_.counters_offset = off("c2", CountersBytes(kN));
    for (const ShardSpec* s : {&spec_, &second_}) {
      float* p = arena_.At<float>(s->master_offset);
      for (uint64_t i = 0; i < kN; ++i) p[i] = 1.0f;
      FillGrad(*s, 0.25f * kScale);
    }
  }
  void FillGrad(const ShardSpec& s, float value) {
    const _Float16 h = static_cast<_Float16>(value);
    uint16_t u;
    std::memcpy(&u, &h, 2);
    std::fill_n(arena_.At<uint16_t>(s.grad_offset), kN, u);
  }
  // Everything a skipped step must leave alone, as bytes.
  std::vector<uint8_t> Snapshot(const ShardSpec& s) {
    std::vector<uint8_t> out;
    auto add = [&](uint64_t offset, uint64_t bytes) {
      const uint8_t* p = arena_.At<uint8_t>(offset);
      out.insert(out.end(), p, p + bytes);
    };
    add(s.master_offset, kN * 4);
    add(s.exp_avg_offset, kN * 4);
    add(s.exp_avg_sq_offset, kN * 4);
    add(s.weights_offset, kN * 2);
    add(s.counters_offset, CountersBytes(kN));
    return out;
  }
  static constexpr float kScale = 1024.0f;  // loss scale; the driver gets 1 / kScale
  ShardSpec second_;
};

TEST_F(StepDriverFp16Test, OverflowSkipsEveryShardAndKeepsTheAdamStep) {
  for (uint16_t bad : {uint16_t{0x7c00}, uint16_t{0x7e00}}) {  // +inf, NaN (in the second shard)
    SCOPED_TRACE(bad);
    pool_.reset();  // a fresh arena and pool per case
    SetUp();
    arena_.At<uint16_t>(second_.grad_offset)[kN - 3] = bad;
    const auto before0 = Snapshot(spec_), before1 = Snapshot(second_);
    // No clipping: without skip_nonfinite shard 0 would be updated as soon as it lands.
    StepDriver d(pool_.get(), {spec_, second_},
                 OptimizerConfig{.max_grad_norm = 0.0, .skip_nonfinite = true});
    int updates = 0;
    d.SetOnShardUpdated([&](size_t) { ++updates; });
    ASSERT_TRUE(d.BeginStep(1, 1e-3, 1.0f / kScale).ok());
    ASSERT_TRUE(d.GradsReady(0, 0).ok());
    ASSERT_TRUE(d.WaitShardIdle(0).ok());  // its norm pass only
    EXPECT_EQ(updates, 0);
    EXPECT_EQ(Snapshot(spec_), before0);
    ASSERT_TRUE(d.GradsReady(1, 0).ok());
    auto r = d.FinishStep();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->skipped);
    EXPECT_FALSE(std::isfinite(r->grad_norm));
    EXPECT_EQ(r->params_updated, 0u);
    EXPECT_EQ(r->adam_step, 0u);
    EXPECT_EQ(updates, 0);
    EXPECT_EQ(Snapshot(spec_), before0);
    EXPECT_EQ(Snapshot(second_), before1);

    // The next step is AdamW step 1 of both shards.
    FillGrad(second_, 0.25f * kScale);
    ASSERT_TRUE(d.BeginStep(2, 1e-3, 1.0f / kScale).ok());
    ASSERT_TRUE(d.GradsReady(0, 0).ok());
    ASSERT_TRUE(d.GradsReady(1, 0).ok());
    r = d.FinishStep();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->skipped);
    EXPECT_EQ(r->adam_step, 1u);
    EXPECT_EQ(d.skipped_steps(), 1u);
    EXPECT_EQ(updates, 2);
    for (const ShardSpec* s : {&spec_, &second_}) {
      EXPECT_EQ(arena_.At<uint64_t>(s->counters_offset)[0], 1u);
      EXPECT_NE(arena_.At<float>(s->master_offset)[0], 1.0f);
    }
  }
}

TEST_F(StepDriverFp16Test, UnscaleIsFoldedIntoTheClipCoefficient) {
  // Scaled fp16 gradients 0.25 * S with grad_unscale 1/S must update exactly as fp32 gradients
  // 0.25 clipped to 0.5 do (S is a power of two, so unscaling is exact).
  StepDriver d(pool_.get(), {spec_},
               OptimizerConfig{.weight_decay = 0.1, .max_grad_norm = 0.5, .skip_nonfinite = true});
  ASSERT_TRUE(d.BeginStep(1, 1e-3, 1.0f / kScale).ok());
  ASSERT_TRUE(d.GradsReady(0, 0).ok());
  auto r = d.FinishStep();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  float norm = 0;
  const float coef = ClipCoefficient(kN * 0.0625, 0.5, &norm);
  EXPECT_EQ(r->grad_norm, norm);  // unscaled
  EXPECT_EQ(r->clip_coef, coef);
  EXPECT_LT(coef, 1.0f);

  std::vector<float> g(kN, 0.25f), p(kN, 1.0f), m(kN, 0.0f), v(kN, 0.0f);
  AdamWSpan span;
  span.grad = g.data();
  span.grad_dtype = GradDtype::kFp32;
  span.master = p.data();
  span.exp_avg = m.data();
  span.exp_avg_sq = v.data();
  span.weight_dtype = WeightDtype::kNone;
  span.n = kN;
  FusedAdamW(span, AdamWHyper{.lr = 1e-3, .weight_decay = 0.1, .step = 1, .grad_scale = coef},
             KernelPath::kPortable);
  const float* got = arena_.At<float>(spec_.master_offset);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(got[i], p[i]) << i;
}

TEST_F(StepDriverFp16Test, ResumedRunCountsItsSkippedSteps) {
  StepDriver d(pool_.get(), {spec_}, OptimizerConfig{.skip_nonfinite = true});
  d.set_skipped_steps(3);  // checkpoint of global step 5 with AdamW step 2
  std::fill_n(arena_.At<uint64_t>(spec_.counters_offset), NumChunks(kN), 2u);
  EXPECT_EQ(d.BeginStep(3, 1e-3).code(), StatusCode::kInvalidArgument);  // step <= skipped
  ASSERT_TRUE(d.BeginStep(6, 1e-3, 1.0f / kScale).ok());
  ASSERT_TRUE(d.GradsReady(0, 0).ok());
  auto r = d.FinishStep();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->adam_step, 3u);
  EXPECT_EQ(arena_.At<uint64_t>(spec_.counters_offset)[0], 3u);
}

}  // namespace
}  // namespace offloadd::workers
