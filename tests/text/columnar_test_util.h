#pragma once
// What the columnar readers' tests share (arrow_ipc_reader_test.cc, parquet_reader_test.cc): the
// pyarrow-written seed files of fuzz/data/<format> (make_seeds.py there), and the rows a reader
// yields from bytes in memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace offloadd::text::columnar_test {

inline std::filesystem::path SeedDir(const std::string& format) {
  const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
  return std::filesystem::path(src != nullptr ? src : ".") / "fuzz" / "data" / format;
}

inline std::string Slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// ForEachArrowRowInBuffer, ForEachParquetRowInBuffer.
using RowReader = Status (*)(std::string_view bytes, const std::string& name,
                             const std::function<Status(size_t, nlohmann::ordered_json)>& each);

// The rows `read` yields from `bytes` (named `name` in errors), each expected to be numbered one
// more than the last.
inline StatusOr<std::vector<nlohmann::ordered_json>> ReadRows(RowReader read,
                                                              const std::string& bytes,
                                                              const std::string& name) {
  std::vector<nlohmann::ordered_json> rows;
  Status s = read(bytes, name, [&](size_t row, nlohmann::ordered_json r) {
    EXPECT_EQ(row, rows.size() + 1);
    rows.push_back(std::move(r));
    return OkStatus();
  });
  if (!s.ok()) return s;
  return rows;
}

// ForEachArrowRow, ForEachParquetRow.
using FileRowReader = Status (*)(const std::string& path,
                                 const std::function<Status(size_t, nlohmann::ordered_json)>& each);

// The seed file at `path` gives the rows `want` both from memory (`read`, its bytes named `name`)
// and from the file (`read_file`: pread, a piece at a time).
inline void ExpectSeedRows(RowReader read, FileRowReader read_file,
                           const std::filesystem::path& path, const std::string& name,
                           const nlohmann::ordered_json& want) {
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto rows = ReadRows(read, Slurp(path), name);
  ASSERT_TRUE(rows.ok()) << path << ": " << rows.status().ToString();
  EXPECT_EQ(nlohmann::ordered_json(*rows), want) << path;
  std::vector<nlohmann::ordered_json> from_file;
  ASSERT_TRUE(read_file(path.string(), [&](size_t, nlohmann::ordered_json r) {
                from_file.push_back(std::move(r));
                return OkStatus();
              }).ok());
  EXPECT_EQ(nlohmann::ordered_json(from_file), want) << path;
}

}  // namespace offloadd::text::columnar_test
