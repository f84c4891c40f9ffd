// Fuzzes the Parquet reader (text/parquet_reader.h): the Thrift compact footer, the schema and its
// levels, page headers, the RLE/bit-packed hybrid, PLAIN and dictionary values, the Snappy, gzip
// and ZSTD codecs, and record assembly, on the input as a whole file in memory.
// Seeds: pyarrow-written files of chat, Alpaca and pretokenized records under each codec, page
// version and encoding (fuzz/data/parquet, copied by fuzz/make_corpus.py).
// Checked: every row is a JSON object with one key per top-level column of the first row; the
// reader returns a status for everything else (never a crash, an over-long allocation or a hang).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "text/parquet_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  size_t columns = 0, rows = 0;
  const offloadd::Status s = offloadd::text::ForEachParquetRowInBuffer(
      bytes, "fuzz.parquet", [&](size_t row, nlohmann::ordered_json record) -> offloadd::Status {
        FUZZ_CHECK(record.is_object());
        FUZZ_CHECK(row == ++rows);
        if (row == 1) columns = record.size();
        FUZZ_CHECK(record.size() == columns);
        (void)record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
        return offloadd::OkStatus();
      });
  FUZZ_CHECK(s.ok() || !s.message().empty());
  return 0;
}
