#include "trainer/lr_schedule.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

TEST(LrScheduleTest, WarmupFromRatioRoundsUp) {
  auto s = LrSchedule::Create("linear", 0, 0.1, 25);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->warmup_steps(), 3);  // ceil(2.5)
  EXPECT_DOUBLE_EQ(s->Multiplier(0), 0.0);
  EXPECT_DOUBLE_EQ(s->Multiplier(3), 1.0);
  EXPECT_DOUBLE_EQ(s->Multiplier(25), 0.0);
}

TEST(LrScheduleTest, WarmupStepsWinOverRatio) {
  auto s = LrSchedule::Create("constant_with_warmup", 4, 0.5, 100);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->warmup_steps(), 4);
  EXPECT_DOUBLE_EQ(s->Multiplier(2), 0.5);
  EXPECT_DOUBLE_EQ(s->Multiplier(50), 1.0);
}

TEST(LrScheduleTest, BadInputIsRejected) {
  EXPECT_FALSE(LrSchedule::Create("exponential", 0, 0, 10).ok());
  EXPECT_FALSE(LrSchedule::Create("linear", 0, 0, 0).ok());
  EXPECT_FALSE(LrSchedule::Create("linear", -1, 0, 10).ok());
  EXPECT_FALSE(LrSchedule::Create("linear", 0, 1.5, 10).ok());
}

// transformers' cosine_with_min_lr: the cosine factor f becomes f * (1 - m) + m.
TEST(LrScheduleTest, CosineWithMinLrStopsAtTheFloor) {
  auto s = LrSchedule::Create("cosine_with_min_lr", 0, 0, 10, {.num_cycles = 0.5, .min_lr_rate = 0.1});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_DOUBLE_EQ(s->Multiplier(0), 1.0);
  EXPECT_NEAR(s->Multiplier(5), 0.55, 1e-12);  // halfway: f = 0.5
  EXPECT_NEAR(s->Multiplier(10), 0.1, 1e-12);
  // num_cycles: two waves over the decay come back to 1 halfway.
  auto waves = LrSchedule::Create("cosine", 0, 0, 10, {.num_cycles = 1.0});
  ASSERT_TRUE(waves.ok());
  EXPECT_NEAR(waves->Multiplier(5), 0.0, 1e-12);
  EXPECT_NEAR(waves->Multiplier(10), 1.0, 1e-12);
  // The floor belongs to cosine_with_min_lr only.
  auto plain = LrSchedule::Create("cosine", 0, 0, 10, {.num_cycles = 0.5, .min_lr_rate = 0.1});
  ASSERT_TRUE(plain.ok());
  EXPECT_NEAR(plain->Multiplier(10), 0.0, 1e-12);
  EXPECT_FALSE(LrSchedule::Create("cosine", 0, 0, 10, {.num_cycles = 0}).ok());
  EXPECT_FALSE(LrSchedule::Create("cosine_with_min_lr", 0, 0, 10, {.num_cycles = 0.5, .min_lr_rate = 1.5}).ok());
}

}  // namespace
}  // namespace offloadd::trainer
