// StepDriver misuse and edge cases (the numerics against PyTorch are in
// tests/python/workers/test_clipping.py).
#include "workers/step_driver.h"

#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace offloadd::workers
