#include "job/grad_scaler.h"

#include <gtest/gtest.h>

#include <limits>

namespace offloadd::trainer {
namespace {

TEST(GradScalerTest, BacksOffOnOverflowAndGrowsAfterTheInterval) {
  GradScaler s(LossScaleConfig{.init_scale = 1024, .growth_interval = 3});
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.grad_unscale(), 1.0f / 1024.0f);
  s.Update(true);
  EXPECT_EQ(s.scale(), 512.0f);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.growth_tracker(), 2);
  s.Update(true);  // an overflow resets the clean-step count
  EXPECT_EQ(s.scale(), 256.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  for (int i = 0; i < 3; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 512.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScalerTest, DoesNotGrowToInfinity) {  // as _amp_update_scale_: keep the finite scale
  GradScaler s(LossScaleConfig{.init_scale = 0x1p127, .growth_interval = 1});
  s.Update(false);
  EXPECT_EQ(s.scale(), 0x1p127f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScalerTest, RestoresAndValidates) {
  GradScaler s(LossScaleConfig{});
  ASSERT_TRUE(s.Restore({.scale = 8.0f, .growth_tracker = 5}).ok());
  EXPECT_EQ(s.scale(), 8.0f);
  EXPECT_EQ(s.growth_tracker(), 5);
  EXPECT_EQ(s.Restore({.scale = 0.0f}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Restore({.scale = std::numeric_limits<float>::infinity()}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(GradScaler::Validate(LossScaleConfig{}).ok());
  Status st = GradScaler::Validate(LossScaleConfig{.backoff_factor = 1.0});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("backoff_factor"), std::string::npos) << st.message();
  EXPECT_FALSE(GradScaler::Validate(LossScaleConfig{.init_scale = 1e39}).ok());  // inf in fp32
  EXPECT_FALSE(GradScaler::Validate(LossScaleConfig{.growth_factor = 1.0}).ok());
  EXPECT_FALSE(GradScaler::Validate(LossScaleConfig{.growth_interval = 0}).ok());
}

}  // namespace
}  // namespace offloadd::trainer
