#include "storage/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace offloadd::storage {
namespace {

struct Vector {
  std::string data;
  uint32_t crc;
};

// Known answers: the "check" value of CRC-32C and the iSCSI test patterns of RFC 3720 B.4.
std::vector<Vector> KnownVectors() {
  return {
      {"", 0x00000000u},
      {"a", 0xC1D04330u},
      {"123456789", 0xE3069283u},
      {std::string(32, '\0'), 0x8A9136AAu},
      {std::string(32, '\xff'), 0x62A8AB43u},
      {[] {
         std::string s(32, 0);
         for (int i = 0; i < 32; ++i) s[i] = static_cast<char>(i);
         return s;
       }(),
       0x46DD794Eu},
      {[] {
         std::string s(32, 0);
         for (int i = 0; i < 32; ++i) s[i] = static_cast<char>(31 - i);
         return s;
       }(),
       0x113FDB5Cu},
  };
}

TEST(Crc32cTest, PortableMatchesKnownVectors) {
  for (const auto& v : KnownVectors()) {
    EXPECT_EQ(Crc32cPortable(0, v.data.data(), v.data.size()), v.crc) << "size " << v.data.size();
  }
}

TEST(Crc32cTest, HardwareMatchesKnownVectors) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "CPU has no SSE4.2 crc32 instruction";
  for (const auto& v : KnownVectors()) {
    EXPECT_EQ(Crc32cHardware(0, v.data.data(), v.data.size()), v.crc) << "size " << v.data.size();
  }
}

TEST(Crc32cTest, ImplementationsAgreeOnRandomBuffersAtOddOffsetsAndSplits) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> buf(1 << 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (int trial = 0; trial < 200; ++trial) {
    const size_t off = rng() % 64;
    const size_t len = rng() % (buf.size() - off);
    const uint32_t whole = Crc32cPortable(0, buf.data() + off, len);
    EXPECT_EQ(Crc32cHardware(0, buf.data() + off, len), whole);
    EXPECT_EQ(Crc32c(0, buf.data() + off, len), whole);
    // Extending a running value equals checksumming the concatenation.
    const size_t cut = len == 0 ? 0 : rng() % len;
    EXPECT_EQ(Crc32c(Crc32c(0, buf.data() + off, cut), buf.data() + off + cut, len - cut), whole);
  }
}

// Buffers long enough for the three-stream paths (3 x 8 KiB and 3 x 256 B blocks), at lengths
// around their boundaries.
TEST(Crc32cTest, InterleavedPathsMatchPortableAroundBlockBoundaries) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> buf((1 << 20) + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t len : {size_t{767}, size_t{768}, size_t{769}, size_t{24575}, size_t{24576},
                     size_t{24577}, size_t{24576 + 768 + 9}, size_t{1} << 20}) {
    for (size_t off : {size_t{0}, size_t{3}}) {
      EXPECT_EQ(Crc32c(0, buf.data() + off, len), Crc32cPortable(0, buf.data() + off, len))
          << "len " << len << " off " << off;
    }
  }
}

}  // namespace
}  // namespace offloadd::storage
