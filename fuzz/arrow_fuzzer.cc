// Fuzzes the Arrow IPC reader (text/arrow_ipc_reader.h): message framing, the flatbuffer schema and
// record batch metadata (bounds-checked offsets, vtables, vectors), nested field trees, buffers,
// ZSTD-compressed bodies and row assembly, on the input as a whole stream or file in memory.
// Seeds: pyarrow-written streams (plain and ZSTD) and IPC files of chat, Alpaca and pretokenized
// tables (fuzz/data/arrow, copied by fuzz/make_corpus.py).
// Checked: every row is a JSON object with one key per column; anything else is a status.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "text/arrow_ipc_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  size_t columns = 0, rows = 0;
  const offloadd::Status s = offloadd::text::ForEachArrowRowInBuffer(
      bytes, "fuzz.arrow", [&](size_t row, nlohmann::ordered_json record) -> offloadd::Status {
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
