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

}  // namespace
}  // namespace offloadd::trainer
