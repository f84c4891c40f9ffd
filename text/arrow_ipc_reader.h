#pragma once
// Arrow IPC datasets: Hugging Face `datasets` save_to_disk directories (state.json listing
// data-*.arrow files in Arrow's streaming format) and single Arrow files (*.arrow streams, or IPC
// files starting with "ARROW1"), read without Apache Arrow (Debian packages no Arrow C++), after
// the format's specification (Message.fbs, Schema.fbs): each message's flatbuffer metadata is
// read with bounds-checked offsets, then its body.
//   types      Int (8..64 bits, signed or unsigned), FloatingPoint (single, double), Bool, Utf8,
//              LargeUtf8, List, LargeList, Struct, and any nesting of them (chat datasets'
//              messages: list<struct<role, content>>, Alpaca's history: list<list<string>>)
//   bodies     uncompressed, or ZSTD-compressed buffers (BodyCompression); LZ4_FRAME is refused
// Anything else (binary, timestamps, dates, decimals, maps, unions, dictionary-encoded columns) is
// refused naming the file, the column and its type. A null is a JSON null.
//
// Memory is bounded by one record batch (at most kMaxArrowMessageBytes of body); rows are handed
// out as they are decoded. Every offset, length and buffer is checked against the message: a
// truncated or corrupt file is DATA_LOSS naming the file, never a crash.

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::text {

inline constexpr uint64_t kMaxArrowMessageBytes = uint64_t{1} << 30;

// Called with each row (1-based within the file) as a JSON object of the top-level columns.
using ArrowRowFn = std::function<Status(size_t row, nlohmann::ordered_json record)>;

// Whether `head` starts an Arrow IPC stream (0xFFFFFFFF continuation) or file ("ARROW1").
bool HasArrowMagic(std::string_view head);

// Reads one Arrow IPC stream or file (opened confined for reading).
Status ForEachArrowRow(const std::string& path, const ArrowRowFn& each);
// The same over bytes in memory; `name` names them in errors (the fuzz harness, tests).
Status ForEachArrowRowInBuffer(std::string_view bytes, const std::string& name,
                               const ArrowRowFn& each);

// The data files of a save_to_disk directory, in order: state.json's "_data_files" (each
// {"filename"} inside the directory), else its data-*.arrow files by name. A DatasetDict
// directory (dataset_dict.json) is refused naming its splits' directories.
StatusOr<std::vector<std::string>> SaveToDiskFiles(const std::string& dir);

}  // namespace offloadd::text
