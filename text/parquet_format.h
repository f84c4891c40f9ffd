#pragma once
// Parquet's file metadata as parquet_reader.cc needs it: the footer (FileMetaData, parquet.thrift)
// parsed from Thrift's compact protocol, its schema resolved into a tree with each node's
// definition and repetition levels, and every column checked against what the reader supports
// (parquet_reader.h lists it); unsupported columns are refused here, naming the column and type.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::text::parquet {

// parquet.thrift's enums (the values that matter here).
enum PhysicalType {
  kBoolean = 0,
  kInt32 = 1,
  kInt64 = 2,
  kInt96 = 3,
  kFloat = 4,
  kDouble = 5,
  kByteArray = 6,
  kFixedLenByteArray = 7
};
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum Codec {
  kUncompressed = 0,
  kSnappy = 1,
  kGzip = 2,
  kLzo = 3,
  kBrotli = 4,
  kLz4 = 5,
  kZstd = 6,
  kLz4Raw = 7
};
enum Encoding { kPlain = 0, kPlainDictionary = 2, kRle = 3, kBitPacked = 4, kRleDictionary = 8 };
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };

std::string CodecName(int codec);
std::string EncodingName(int encoding);

struct SchemaNode {
  std::string name;
  std::string path;  // dotted, from the root's children ("messages.list.element.role")
  int type = -1;     // PhysicalType of a leaf; -1 for a group
  int repetition = kRequired;
  int num_children = 0;
  int converted = -1;  // ConvertedType, -1 when unset
  int logical = -1;    // the LogicalType union's member (its field id), -1 when unset
  std::vector<int> children;
  int max_def = 0, max_rep = 0;
  int first_leaf = 0, leaves = 0;             // this subtree's leaf columns, in column order
  int list_repeated = -1, list_element = -1;  // a LIST: its repeated node and its element
  bool unsigned_int = false;
  bool IsLeaf() const { return type >= 0; }
};

struct ColumnChunk {
  int type = -1;
  int codec = 0;
  int64_t num_values = 0;
  int64_t total_uncompressed_size = 0, total_compressed_size = 0;
  int64_t data_page_offset = -1, dictionary_page_offset = -1;
  std::string path;  // path_in_schema, dotted
};

struct RowGroup {
  std::vector<ColumnChunk> columns;
  int64_t num_rows = 0;
};

struct FileMetaData {
  std::vector<SchemaNode> schema;  // [0] is the root
  std::vector<int> leaves;         // schema indices of the leaf columns, in column order
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
};

// Parses and checks the footer; `name` names the file in errors.
StatusOr<FileMetaData> ParseFileMetaData(std::string_view footer, const std::string& name);

}  // namespace offloadd::text::parquet
