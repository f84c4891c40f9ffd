#include "trainer/setup_timing.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace offloadd::trainer {
namespace {

using std::chrono::milliseconds;

// Phase indices into kSetupPhases.
constexpr size_t kCuda = 0, kModel = 1, kPlan = 3, kArena = 4, kWorkers = 5;

TEST(SetupTimingTest, APhaseAddsUpAndKeepsItsFirstStart) {
  SetupTiming t;
  const auto c = t.created();
  t.Add(kPlan, c + milliseconds(1500), c + milliseconds(1750));
  t.Add(kPlan, c + milliseconds(3000), c + milliseconds(3250));  // the plan phase runs twice
  const std::vector<double> seconds = t.seconds(), starts = t.starts();
  ASSERT_EQ(seconds.size(), kSetupPhases.size());
  ASSERT_EQ(starts.size(), kSetupPhases.size());
  EXPECT_DOUBLE_EQ(seconds[kPlan], 0.5);
  EXPECT_DOUBLE_EQ(starts[kPlan], 1.5);
  for (size_t i = 0; i < kSetupPhases.size(); ++i) {
    if (i == kPlan) continue;
    EXPECT_EQ(seconds[i], 0) << kSetupPhases[i];
    EXPECT_EQ(starts[i], -1) << kSetupPhases[i] << " did not run";
  }
}

TEST(SetupTimingTest, TheLineCountsOverlapOnceAndNamesIt) {
  SetupTiming t;
  const auto c = t.created();
  t.Add(kCuda, c, c + milliseconds(1000));
  t.Add(kModel, c + milliseconds(1000), c + milliseconds(1500));  // right after: no overlap
  t.Add(kArena, c + milliseconds(2000), c + milliseconds(5000));
  t.Add(kWorkers, c + milliseconds(2500), c + milliseconds(3500));  // inside the arena's
  t.set_arena_in_background(true);
  // Covered: 1 + 0.5 + 3 (the workers' second lies inside the arena's three) = 4.5 s.
  EXPECT_EQ(t.Describe(4, std::nullopt),
            "set-up 4.5 s (4 threads; the arena populated in the background): cuda 1, model 0.5, "
            "data 0, plan 0, arena 3 (2-5 s, beside workers), workers 1 (2.5-3.5 s, beside arena), "
            "weights 0, device 0");
}

TEST(SetupTimingTest, TheLineNamesTheArenaWhenThereIsOne) {
  SetupTiming t;
  const std::string line = t.Describe(2, uint64_t{3} << 30);
  EXPECT_EQ(line.rfind("set-up 0 s (2 threads): cuda 0,", 0), 0u) << line;
  EXPECT_EQ(line.substr(line.size() - 13), "; arena 3 GiB") << line;
}

}  // namespace
}  // namespace offloadd::trainer
