// The Arrow IPC reader (text/arrow_ipc_reader.h) on the pyarrow-written files of fuzz/data/arrow
// (make_seeds.py there): streams (as datasets' save_to_disk writes them) with one row per record
// batch, plain and with ZSTD-compressed buffers, and IPC files; nulls at each level, a list of
// lists (Alpaca's history), floats and booleans, read to the rows pyarrow wrote. Every prefix of a
// stream and a stream with bytes flipped is an error naming it, never a crash.
// tests/python/text/test_save_to_disk_dataset.py compares whole datasets with JSON Lines.
#include "text/arrow_ipc_reader.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/text/columnar_test_util.h"

namespace offloadd::text {
namespace {

using ojson = nlohmann::ordered_json;

using columnar_test::Slurp;

std::filesystem::path SeedDir() { return columnar_test::SeedDir("arrow"); }

StatusOr<std::vector<ojson>> Rows(const std::string& bytes) {
  return columnar_test::ReadRows(ForEachArrowRowInBuffer, bytes, "t.arrow");
}

TEST(ArrowIpcReader, ReadsWhatPyarrowWroteAsStreamsCompressedStreamsAndFiles) {
  const ojson chat = ojson::parse(R"([
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                  {"role": "assistant", "content": "4"}]},
    {"messages": null}, {"messages": []}])");
  const ojson alpaca = ojson::parse(R"([
    {"instruction": "Name a colour.", "input": null, "output": "Blue", "n": 1, "history": [["a", "b"]]},
    {"instruction": "Add", "input": "2 and 3", "output": "5", "n": null, "history": []}])");
  const ojson tokens = ojson::parse(R"([
    {"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4], "ok": true, "w": 0.5},
    {"input_ids": [5, 6], "labels": null, "ok": false, "w": null}])");
  for (const auto& [name, want] :
       {std::pair{"chat", chat}, std::pair{"alpaca", alpaca}, std::pair{"tokens", tokens}}) {
    for (const char* kind : {"plain", "zstd", "file"}) {
      columnar_test::ExpectSeedRows(ForEachArrowRowInBuffer, ForEachArrowRow,
                                    SeedDir() / (std::string(name) + "_" + kind + ".arrow"),
                                    "t.arrow", want);
    }
  }
}

TEST(ArrowIpcReader, EveryPrefixAndFlippedByteIsAnErrorNamingTheFile) {
  for (const char* seed : {"chat_plain.arrow", "alpaca_zstd.arrow"}) {
    const std::string file = Slurp(SeedDir() / seed);
    ASSERT_FALSE(file.empty());
    // A prefix that ends exactly between messages is a shorter stream without its end marker:
    // its rows are read. Every other prefix is an error naming the file.
    for (size_t n = 0; n < file.size(); ++n) {
      auto rows = Rows(file.substr(0, n));
      if (!rows.ok()) {
        EXPECT_NE(rows.status().message().find("t.arrow"), std::string::npos)
            << rows.status().message();
      }
    }
    EXPECT_FALSE(Rows(file.substr(0, 12)).ok());
    for (size_t i = 0; i < file.size(); ++i) {
      std::string bad = file;
      bad[i] = static_cast<char>(bad[i] ^ 0x5a);
      auto rows = Rows(bad);
      if (!rows.ok()) {
        EXPECT_NE(rows.status().message().find("t.arrow"), std::string::npos)
            << rows.status().message();
      }
    }
  }
}

// A Null column has no buffers: a 344-byte stream (pyarrow's list<null> of 2^31 - 2 elements,
// its null count zeroed) once decoded one row of two billion JSON nulls and was killed for memory
// (the arrow fuzzer's OOM). Every column's length is bounded by its batch body's bits.
TEST(ArrowIpcReader, ANullColumnLongerThanItsBodyCanDescribeIsRefused) {
  const std::string file = Slurp(SeedDir().parent_path().parent_path() / "regressions" / "arrow" /
                                 "list-of-two-billion-nulls");
  ASSERT_EQ(file.size(), 344u);
  auto rows = Rows(file);
  ASSERT_FALSE(rows.ok());
  EXPECT_NE(rows.status().message().find("column \"x.item\": a length of 2147483646 for a body"),
            std::string::npos)
      << rows.status().message();
}

TEST(ArrowIpcReader, SaveToDiskFilesFollowStateJsonAndRefuseADatasetDict) {
  const std::string dir = testing::TempDir() + "/hf_save";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/state.json")
      << R"({"_data_files": [{"filename": "data-00001-of-00002.arrow"},
                                             {"filename": "data-00000-of-00002.arrow"}]})";
  auto files = SaveToDiskFiles(dir);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  EXPECT_EQ(*files, (std::vector<std::string>{dir + "/data-00001-of-00002.arrow",
                                              dir + "/data-00000-of-00002.arrow"}));
  std::ofstream(dir + "/state.json") << R"({"_data_files": [{"filename": "../etc/passwd"}]})";
  EXPECT_FALSE(SaveToDiskFiles(dir).ok());
  std::ofstream(dir + "/dataset_dict.json") << R"({"splits": ["train", "test"]})";
  auto dict = SaveToDiskFiles(dir);
  ASSERT_FALSE(dict.ok());
  EXPECT_NE(dict.status().message().find(dir + "/train"), std::string::npos)
      << dict.status().message();
}

}  // namespace
}  // namespace offloadd::text
