// The worker pool running the compact optimizer modes on arena shards (workers/adamw_compact.h):
// the shard layout sizes the regions by the mode, the executor steps each chunk with the compact
// kernel (through its redo slot), and the result is the kernel's over the whole shard, bit for
// bit, with and without clipping and across a worker killed in the middle of a chunk's commit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ipc/arena.h"
#include "ipc/shm_segment.h"
#include "workers/adamw_compact.h"
#include "workers/adamw_kernel_impl.h"
#include "workers/shard_executor.h"
#include "workers/shard_layout.h"
#include "workers/step_driver.h"

namespace offloadd::workers {
namespace {

std::string WorkerBinary() {
  if (const char* dir = std::getenv("OFFLOADD_BINARY_DIR"))
    return std::string(dir) + "/workers/offloadd-worker";
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
          "../../workers/offloadd-worker")
      .string();
}

std::vector<OptimizerMode> CompactModes() {
  std::vector<OptimizerMode> out;
  for (StateDtype s : {StateDtype::kFp32, StateDtype::kBf16, StateDtype::kInt8}) {
    for (MasterDtype m : {MasterDtype::kFp32, MasterDtype::kBf16}) {
      if (!(OptimizerMode{s, m}.Exact())) out.push_back({s, m});
    }
  }
  return out;
}

// One shard's master and state regions as local bytes (the reference), in the arena's layout.
struct Regions {
  std::vector<uint8_t> master, m, v;
  std::vector<uint16_t> weights;
};

// Initial masters (fp32 values, encoded in the mode's master format), zero states.
Regions InitialRegions(OptimizerMode mode, uint64_t n, uint32_t seed) {
  Regions r;
  r.master.assign(MasterRegionBytes(mode.master, n), 0);
  r.m.assign(StateRegionBytes(mode.state, n), 0);
  r.v.assign(StateRegionBytes(mode.state, n), 0);
  r.weights.assign(n, 0);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  for (uint64_t i = 0; i < n; ++i) {
    const float x = dist(rng);
    if (mode.master == MasterDtype::kFp32) {
      std::memcpy(r.master.data() + 4 * i, &x, 4);
    } else {
      const uint16_t hi = internal::FloatToBf16(x);
      std::memcpy(r.master.data() + 2 * i, &hi, 2);
    }
  }
  return r;
}

std::vector<uint16_t> Grads(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> g(n);
  for (auto& x : g) x = internal::FloatToBf16(dist(rng));
  return g;
}

class CompactModesTest : public ::testing::TestWithParam<OptimizerMode> {
 protected:
  // Runs `steps` steps over layers {5000, 3000} (shards of at most 4096) in the pool and in the
  // kernel directly, and compares every region and the weight copies bit for bit.
  void RunAndCompare(double max_grad_norm, WorkerPoolOptions pool_options, int steps = 3) {
    const OptimizerMode mode = GetParam();
    const std::vector<uint64_t> layers = {5000, 3000};
    ShardLayoutOptions lo{.mode = mode};
    lo.max_shard_elements = 4096;
    pool_options.worker_binary = WorkerBinary();
    pool_options.threads_per_process = 2;
    pool_options.pin_threads = false;
    auto seg = ipc::SharedSegment::Create(ArenaBytesFor(layers, lo, pool_options));
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    auto arena = ipc::Arena::Format(&*seg, {.max_regions = RegionsFor(layers, lo, 1)});
    ASSERT_TRUE(arena.ok()) << arena.status().ToString();
    auto shards = AllocateShards(&*arena, layers, lo, 1);
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    ASSERT_EQ(shards->size(), 3u);
    std::vector<Regions> want;
    for (size_t s = 0; s < shards->size(); ++s) {
      const ShardSpec& spec = (*shards)[s];
      EXPECT_EQ(spec.mode, mode);
      want.push_back(InitialRegions(mode, spec.num_elements, static_cast<uint32_t>(s)));
      std::memcpy(arena->At<uint8_t>(spec.master_offset), want[s].master.data(),
                  want[s].master.size());
    }
    auto pool = WorkerPool::Start(&*seg, &*arena, pool_options);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    StepDriver driver(pool->get(), *shards,
                      OptimizerConfig{.weight_decay = 0.01,
                                      .max_grad_norm = max_grad_norm,
                                      .speculation = Speculation::kAlways});
    for (int step = 1; step <= steps; ++step) {
      ASSERT_TRUE(driver.BeginStep(step, 1e-3).ok());
      std::vector<std::vector<uint16_t>> grads;
      double total_sq = 0;
      for (size_t s = 0; s < shards->size(); ++s) {
        const ShardSpec& spec = (*shards)[s];
        grads.push_back(Grads(spec.num_elements, 100 * step + static_cast<uint32_t>(s)));
        std::memcpy(arena->At<uint8_t>(spec.grad_offset), grads[s].data(), 2 * spec.num_elements);
        for (uint16_t g : grads[s])
          total_sq += double(internal::Bf16ToFloat(g)) * internal::Bf16ToFloat(g);
        ASSERT_TRUE(driver.GradsReady(s, 0).ok());
      }
      auto result = driver.FinishStep();
      ASSERT_TRUE(result.ok()) << result.status().ToString();
      EXPECT_EQ(result->speculated_shards, 0u) << "a compact mode never speculates";
      // The kernels sum squares in fp32 lanes of at most 2048 / 16 = 128 terms (a relative error
      // below 128 * 2^-24 = 7.6e-6), and the norm is reported in fp32.
      EXPECT_NEAR(result->grad_norm, std::sqrt(total_sq), 7.7e-6 * std::sqrt(total_sq));
      const float scale = result->clip_coef;
      if (max_grad_norm > 0) {
        EXPECT_LT(scale, 1.0f) << "the test's gradients clip";
      }
      for (size_t s = 0; s < shards->size(); ++s) {
        const ShardSpec& spec = (*shards)[s];
        Regions& r = want[s];
        CompactSpan span = CompactSpanAt(mode, r.master.data(), r.m.data(), r.v.data(),
                                         spec.num_elements, 0, spec.num_elements);
        span.grad = grads[s].data();
        span.weights = r.weights.data();
        span.seed = spec.layer;
        AdamWHyper hyper{1e-3, 0.9, 0.999, 1e-8, 0.01, static_cast<uint64_t>(step), scale};
        ASSERT_TRUE(CompactAdamW(span, mode, hyper, KernelPath::kPortable).ok());
        const std::string where =
            mode.Describe() + ", step " + std::to_string(step) + ", shard " + std::to_string(s);
        EXPECT_EQ(0, std::memcmp(arena->At<uint8_t>(spec.master_offset), r.master.data(),
                                 r.master.size()))
            << where << ": master";
        EXPECT_EQ(0, std::memcmp(arena->At<uint8_t>(spec.exp_avg_offset), r.m.data(), r.m.size()))
            << where << ": exp_avg";
        EXPECT_EQ(0,
                  std::memcmp(arena->At<uint8_t>(spec.exp_avg_sq_offset), r.v.data(), r.v.size()))
            << where << ": exp_avg_sq";
        EXPECT_EQ(0, std::memcmp(arena->At<uint8_t>(spec.weights_offset), r.weights.data(),
                                 2 * spec.num_elements))
            << where << ": weights";
      }
    }
  }
};

TEST_P(CompactModesTest, PoolStepsAreTheKernelsBitForBit) { RunAndCompare(0.0, {}); }

TEST_P(CompactModesTest, ClippedStepsWaitForTheNormAndMatchTheKernel) {
  RunAndCompare(1.0, {});  // speculation asked for, not done
}

TEST_P(CompactModesTest, AWorkerKilledMidCommitReplaysToTheSameBits) {
  for (CrashPoint at : {CrashPoint::kAfterKernel, CrashPoint::kMidCopy, CrashPoint::kAfterCommit}) {
    WorkerPoolOptions o;
    o.crash_point = at;
    o.crash_after_chunks = 5;  // step 2, inside the first shard
    RunAndCompare(0.0, o, 2);
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CompactModesTest, ::testing::ValuesIn(CompactModes()),
                         [](const auto& p) {
                           return std::string(StateDtypeName(p.param.state)) + "States" +
                                  std::string(MasterDtypeName(p.param.master)) + "Master";
                         });

TEST(CompactLayoutTest, TheArenaShrinksWithTheMode) {
  const std::vector<uint64_t> layers = {1'000'000, 1'000'000};
  WorkerPoolOptions pool;
  const uint64_t exact = ArenaBytesFor(layers, {}, pool);
  const uint64_t bf16 = ArenaBytesFor(layers, {.mode = {StateDtype::kBf16}}, pool);
  const uint64_t int8 = ArenaBytesFor(layers, {.mode = {StateDtype::kInt8}}, pool);
  // 4 of exact's 16 bytes per parameter saved with bf16 states, 5.97 with int8 (their scales).
  EXPECT_NEAR(static_cast<double>(exact - bf16), 4.0 * 2'000'000, 2 * 3 * 4096.0);
  EXPECT_NEAR(static_cast<double>(exact - int8), (6 - 8.0 / 256) * 2'000'000, 2 * 3 * 4096.0);
  EXPECT_DOUBLE_EQ(BytesPerParameter({}), 16);
  EXPECT_DOUBLE_EQ(BytesPerParameter({.mode = {StateDtype::kBf16}}), 12);
  EXPECT_DOUBLE_EQ(BytesPerParameter({.mode = {StateDtype::kInt8}}), 2 + 4 + 2 + 2 + 8.0 / 256);
  // A bf16 master with its compensation takes an fp32 master's 4 bytes.
  EXPECT_DOUBLE_EQ(BytesPerParameter({.mode = {StateDtype::kInt8, MasterDtype::kBf16}}),
                   BytesPerParameter({.mode = {StateDtype::kInt8}}));
}

// The executor refuses what a compact mode cannot do, naming it.
class CompactCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seg_ = std::move(ipc::SharedSegment::Create(8 << 20)).value();
    arena_ = std::move(ipc::Arena::Format(&seg_)).value();
    auto off = [&](const char* name, uint64_t bytes) {
      return std::move(arena_.Allocate(name, ipc::RegionKind::kOther, bytes)).value().offset;
    };
    cmd_ = AdamWCommand{kN,
                        off("g", 2 * kN),
                        off("p", 4 * kN),
                        off("m", kN),
                        off("v", kN),
                        off("w", 2 * kN),
                        off("c", AdamWCountersBytes(kN)),
                        1,
                        1e-3,
                        0.9,
                        0.999,
                        1e-8,
                        0,
                        1.0f,
                        0};
    undo_ = off("undo", UndoRegionBytes(1));
    ExecutorOptions o;
    o.undo_offset = undo_;
    executor_ = std::make_unique<ShardExecutor>(&arena_, o);
    ASSERT_TRUE(executor_->Start().ok());
  }
  WorkerCompletion Run(CommandKind kind, uint32_t flags) {
    ipc::CommandRecord r{};
    r.kind = static_cast<uint32_t>(kind);
    r.flags = flags;
    r.id = 1;
    r.Pack(cmd_);
    return executor_->Execute(r);
  }
  static constexpr uint64_t kN = 4096;
  ipc::SharedSegment seg_;
  ipc::Arena arena_;
  AdamWCommand cmd_{};
  uint64_t undo_ = 0;
  std::unique_ptr<ShardExecutor> executor_;
};

TEST_F(CompactCommandTest, RefusesWhatTheModeCannotDo) {
  WorkerCompletion c = Run(CommandKind::kAdamW, kFlagStateBf16 | kFlagStateInt8);
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(c.message).find("both bf16 and int8"), std::string::npos) << c.message;
  c = Run(CommandKind::kAdamWCorrect, kFlagStateInt8);
  EXPECT_EQ(c.status_code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(c.message).find("int8 states"), std::string::npos) << c.message;
  // The int8 regions hold the codes and the block scales: kN bytes are too few.
  c = Run(CommandKind::kAdamW, kFlagStateInt8);
  EXPECT_NE(c.status_code, 0);
  EXPECT_NE(std::string(c.message).find("exp_avg"), std::string::npos) << c.message;
  // bf16 states fit in... not kN bytes either (2 per element); fp32 ones need 4.
  c = Run(CommandKind::kAdamW, kFlagStateBf16);
  EXPECT_NE(c.status_code, 0);
}

}  // namespace
}  // namespace offloadd::workers
