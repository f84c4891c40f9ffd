#include "common/units.h"

#include <gtest/gtest.h>

namespace offloadd {
namespace {

TEST(UnitsTest, ParsesPlainAndSuffixed) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("1MiB"), 1048576u);
  EXPECT_EQ(*ParseByteSize("24 GiB"), 24ull << 30);
  EXPECT_EQ(*ParseByteSize("1.5kib"), 1536u);
  EXPECT_EQ(*ParseByteSize("2GB"), 2000000000u);
}

TEST(UnitsTest, RejectsGarbageWithReason) {
  auto r = ParseByteSize("12 parsecs");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown size unit"), std::string::npos);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("GiB").ok());
  EXPECT_FALSE(ParseByteSize("1.1.1").ok());
  EXPECT_FALSE(ParseByteSize("0.3B").ok());
  EXPECT_FALSE(ParseByteSize("99999999999TiB").ok());
}

TEST(UnitsTest, Formats) {
  EXPECT_EQ(FormatByteSize(24ull << 30), "24 GiB");
  EXPECT_EQ(FormatByteSize(1536), "1.5 KiB");
  EXPECT_EQ(FormatByteSize(7), "7 B");
}

TEST(UnitsTest, ExactSizesParseBackToTheSameBytes) {
  for (uint64_t b : {uint64_t{0}, uint64_t{1}, uint64_t{4096}, uint64_t{24} << 30, uint64_t{2000000000000},
                     (uint64_t{3} << 40) + 1024, uint64_t{1} << 50}) {
    auto back = ParseByteSize(FormatByteSizeExact(b));
    ASSERT_TRUE(back.ok()) << FormatByteSizeExact(b);
    EXPECT_EQ(*back, b) << FormatByteSizeExact(b);
  }
  EXPECT_EQ(FormatByteSizeExact(uint64_t{24} << 30), "24 GiB");
}

}  // namespace
}  // namespace offloadd
