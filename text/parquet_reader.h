#pragma once
// Parquet datasets (*.parquet files, and directories of them), read without Apache Arrow: Debian
// packages no Arrow C++, so this follows the format's specification (parquet-format's
// parquet.thrift) for what datasets use:
//   footer     FileMetaData in Thrift's compact protocol (thrift_compact.h), its schema, row groups
//              and column chunks
//   pages      DATA_PAGE (v1) and DATA_PAGE_V2, a DICTIONARY_PAGE before them (index pages skipped)
//   encodings  PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY values (RLE for booleans); RLE/bit-packed
//   hybrid
//              definition and repetition levels
//   codecs     UNCOMPRESSED, SNAPPY (libsnappy), GZIP (zlib), ZSTD (libzstd)
//   columns    BOOLEAN; INT32 / INT64 (plain, or annotated as signed or 8..32-bit unsigned
//              integers); FLOAT / DOUBLE; BYTE_ARRAY annotated as a string (STRING/UTF8, ENUM,
//              JSON: kept as text); groups as objects; LIST-annotated groups (3-level, and the
//              legacy 2-level forms) of any of those, e.g. chat datasets' messages:
//              list<struct<role: string, content: string>> or pretokenized input_ids: list<int32>
// Anything else (lists of lists, maps, decimals, timestamps, dates, binary without a string
// annotation, FIXED_LEN_BYTE_ARRAY, INT96, other encodings and codecs, encrypted files) is refused
// naming the file and the column with its type. A null value is a JSON null (the record readers
// treat a null field as absent).
//
// Memory is bounded by one row group: its column chunks are read (pread) and decoded, its rows
// assembled and handed out, then dropped. Row groups over kMaxParquetRowGroupBytes of data or
// kMaxParquetRowGroupValues levels are refused, as are footers over kMaxParquetFooterBytes.
// Every offset and size of the file is checked against the file: a truncated or corrupt file is
// DATA_LOSS naming the file (and column), never a crash.

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace offloadd::text {

inline constexpr uint64_t kMaxParquetFooterBytes = uint64_t{64} << 20;
inline constexpr uint64_t kMaxParquetRowGroupBytes = uint64_t{1} << 30;
inline constexpr uint64_t kMaxParquetRowGroupValues = uint64_t{64} << 20;

// Called with each row (1-based within the file) as a JSON object of the top-level columns.
using ParquetRowFn = std::function<Status(size_t row, nlohmann::ordered_json record)>;

// Whether `head` (a file's first bytes) is Parquet's magic "PAR1".
bool HasParquetMagic(std::string_view head);

// Reads the Parquet file at `path` (opened confined for reading, common/safe_path.h).
Status ForEachParquetRow(const std::string& path, const ParquetRowFn& each);
// The same over bytes in memory; `name` names them in errors (the fuzz harness, tests).
Status ForEachParquetRowInBuffer(std::string_view bytes, const std::string& name,
                                 const ParquetRowFn& each);

}  // namespace offloadd::text
