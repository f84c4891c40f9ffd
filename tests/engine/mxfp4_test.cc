// MXFP4 dequantisation (engine/mxfp4.h) against hand-computed values of the OCP MX format.
#include "engine/mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

namespace offloadd::engine {
namespace {

std::vector<std::byte> Bytes(std::vector<int> v) {
  std::vector<std::byte> out;
  for (int x : v) out.push_back(static_cast<std::byte>(x));
  return out;
}

// A parameter [1, 32, 2]: column b of the stored blocks is element [0, a, b] for a in 0..31.
TEST(Mxfp4Test, DequantisesNibblesLowFirstTimesTheScaleAndTransposes) {
  std::vector<int> raw(2 * 16, 0);
  raw[0] = 0x21;   // b = 0: a = 0 -> nibble 1 (0.5), a = 1 -> nibble 2 (1.0)
  raw[1] = 0xF9;   // a = 2 -> nibble 9 (-0.5), a = 3 -> nibble 15 (-6)
  raw[16] = 0x07;  // b = 1: a = 0 -> 6, a = 1 -> 0
  const auto blocks = Bytes(raw);
  const auto scales = Bytes({127 + 2, 127 - 1});  // b = 0: x4, b = 1: x0.5
  std::vector<float> out(64, -1);
  ASSERT_TRUE(
      DequantizeMxfp4("p", {1, 32, 2}, blocks.data(), scales.data(), 0, 64, out.data()).ok());
  EXPECT_EQ(out[0 * 2 + 0], 2.0f);   // [0, 0, 0]
  EXPECT_EQ(out[1 * 2 + 0], 4.0f);   // [0, 1, 0]
  EXPECT_EQ(out[2 * 2 + 0], -2.0f);  // [0, 2, 0]
  EXPECT_EQ(out[3 * 2 + 0], -24.0f);
  EXPECT_EQ(out[0 * 2 + 1], 3.0f);  // [0, 0, 1]
  EXPECT_EQ(out[1 * 2 + 1], 0.0f);
  EXPECT_EQ(out[31 * 2 + 1], 0.0f);
  // A range gives the same elements.
  std::vector<float> part(3);
  ASSERT_TRUE(
      DequantizeMxfp4("p", {1, 32, 2}, blocks.data(), scales.data(), 2, 3, part.data()).ok());
  EXPECT_EQ(part, (std::vector<float>{4.0f, 0.0f, -2.0f}));
}

TEST(Mxfp4Test, RefusesNanScalesBadShapesAndRangesNamingTheTensor) {
  const auto blocks = Bytes(std::vector<int>(16, 0x11));
  const auto nan = Bytes({255});
  std::vector<float> out(32);
  Status s = DequantizeMxfp4("w", {1, 32, 1}, blocks.data(), nan.data(), 0, 32, out.data());
  EXPECT_NE(s.ToString().find("\"w_scales\": scale byte 255"), std::string::npos) << s.ToString();
  EXPECT_NE(Mxfp4ShapesFor("w", {2, 33, 4}).status().ToString().find("\"w\""), std::string::npos);
  EXPECT_FALSE(Mxfp4ShapesFor("w", {32, 4}).ok());
  const auto ok = Bytes({127});
  s = DequantizeMxfp4("w", {1, 32, 1}, blocks.data(), ok.data(), 30, 3, out.data());
  EXPECT_NE(s.ToString().find("outside its 32"), std::string::npos) << s.ToString();
  auto shapes = Mxfp4ShapesFor("w", {4, 64, 96});
  ASSERT_TRUE(shapes.ok());
  EXPECT_EQ(shapes->blocks, (std::vector<int64_t>{4, 96, 2, 16}));
  EXPECT_EQ(shapes->scales, (std::vector<int64_t>{4, 96, 2}));
}

}  // namespace
}  // namespace offloadd::engine
