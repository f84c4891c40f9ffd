// The Parquet reader (text/parquet_reader.h) on the pyarrow-written files of fuzz/data/parquet
// (make_seeds.py there): every codec (snappy, zstd, gzip, none), dictionary and plain values, v1
// and v2 pages, one row per row group, nulls at each level (a null list, an empty list, a null
// string, a null integer), read to the rows pyarrow wrote. Every prefix of a file, and a file with
// bytes flipped, is an error naming it, never a crash. tests/python/text/test_parquet_dataset.py
// compares whole datasets with JSON Lines.
#include "text/parquet_reader.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/text/columnar_test_util.h"

#include "text/thrift_compact.h"

namespace offloadd::text {
namespace {

using ojson = nlohmann::ordered_json;

using columnar_test::Slurp;

std::filesystem::path SeedDir() { return columnar_test::SeedDir("parquet"); }

StatusOr<std::vector<ojson>> Rows(const std::string& bytes) {
  return columnar_test::ReadRows(ForEachParquetRowInBuffer, bytes, "t.parquet");
}

const char* const kVariants[] = {"snappy_dict_v1", "zstd_plain_v2", "gzip_dict_v2",
                                 "none_plain_v1"};

TEST(ParquetReader, ReadsWhatPyarrowWroteUnderEveryCodecEncodingAndPageVersion) {
  const ojson chat = ojson::parse(R"([
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}]},
    {"messages": null}, {"messages": []}])");
  const ojson alpaca = ojson::parse(R"([
    {"instruction": "Name a colour.", "input": null, "output": "Blue", "n": 1},
    {"instruction": "Add", "input": "2 and 3", "output": "5", "n": null}])");
  const ojson tokens = ojson::parse(R"([
    {"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4], "ok": true},
    {"input_ids": [5, 6], "labels": null, "ok": false}])");
  for (const auto& [name, want] :
       {std::pair{"chat", chat}, std::pair{"alpaca", alpaca}, std::pair{"tokens", tokens}}) {
    for (const char* v : kVariants) {
      // The file path reads the same rows (pread, one row group at a time).
      columnar_test::ExpectSeedRows(ForEachParquetRowInBuffer, ForEachParquetRow,
                                    SeedDir() / (std::string(name) + "_" + v + ".parquet"),
                                    "t.parquet", want);
    }
  }
}

TEST(ParquetReader, EveryPrefixAndFlippedByteIsAnErrorNamingTheFile) {
  const std::string file = Slurp(SeedDir() / "chat_snappy_dict_v1.parquet");
  ASSERT_FALSE(file.empty());
  for (size_t n = 0; n < file.size(); ++n) {
    auto rows = Rows(file.substr(0, n));
    ASSERT_FALSE(rows.ok()) << n;
    EXPECT_NE(rows.status().message().find("t.parquet"), std::string::npos)
        << rows.status().message();
  }
  // Flipped bytes: an error or (where only a value changed) rows; never a crash.
  for (size_t i = 4; i + 8 < file.size(); ++i) {
    std::string bad = file;
    bad[i] = static_cast<char>(bad[i] ^ 0x41);
    auto rows = Rows(bad);
    if (!rows.ok()) {
      EXPECT_NE(rows.status().message().find("t.parquet"), std::string::npos);
    }
  }
}

TEST(ParquetReader, NotParquetIsRefusedNamingTheFile) {
  auto rows = Rows(std::string("{\"text\": \"hello\"}\n{\"text\": \"world\"}\n"));
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(rows.status().message().find("t.parquet: not a Parquet file"), std::string::npos);
  EXPECT_FALSE(HasParquetMagic("PAR"));
  EXPECT_TRUE(HasParquetMagic("PAR1xyz"));
}

TEST(ThriftCompact, ReadsFieldsAndSkipsNestedValuesWithinBounds) {
  // struct { 1: i32 -3, 2: binary "ab", 4: list<i32> [1, 2], 5: struct { 1: bool true } } stop
  const std::string bytes = std::string(
      "\x15\x05\x18\x02"
      "ab"
      "\x29\x25\x02\x04\x1c\x11\x00\x00",
      14);
  ThriftReader t(bytes, "t");
  ASSERT_TRUE(t.BeginStruct().ok());
  int16_t id;
  ThriftType ty;
  ASSERT_TRUE(t.ReadFieldHeader(&id, &ty).ok());
  int32_t v;
  ASSERT_TRUE(t.ReadI32(&v).ok());
  EXPECT_EQ(id, 1);
  EXPECT_EQ(v, -3);
  ASSERT_TRUE(t.ReadFieldHeader(&id, &ty).ok());
  std::string s;
  ASSERT_TRUE(t.ReadBinary(&s).ok());
  EXPECT_EQ(s, "ab");
  ASSERT_TRUE(t.ReadFieldHeader(&id, &ty).ok());
  EXPECT_EQ(id, 4);
  ASSERT_TRUE(t.Skip(ty).ok());
  ASSERT_TRUE(t.ReadFieldHeader(&id, &ty).ok());
  EXPECT_EQ(id, 5);
  ASSERT_TRUE(t.Skip(ty).ok());
  ASSERT_TRUE(t.ReadFieldHeader(&id, &ty).ok());
  EXPECT_EQ(ty, ThriftType::kStop);
  // Nesting past the limit is refused, not recursed into.
  const std::string deep(100, '\x1c');
  ThriftReader d(deep, "deep");
  EXPECT_FALSE(d.Skip(ThriftType::kStruct).ok());
}

}  // namespace
}  // namespace offloadd::text
