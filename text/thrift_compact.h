#pragma once
// Thrift's compact protocol, read only: what Parquet's footer (FileMetaData) and page headers are
// written in. A cursor over bytes that reads field headers, zigzag varints, binaries and list
// headers, and skips whole values of any type; every read is bounds-checked and nesting is
// limited, so a hostile footer is an error, never a crash or a runaway recursion.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace offloadd::text {

enum class ThriftType : uint8_t {
  kStop = 0,
  kTrue = 1,
  kFalse = 2,
  kByte = 3,
  kI16 = 4,
  kI32 = 5,
  kI64 = 6,
  kDouble = 7,
  kBinary = 8,
  kList = 9,
  kSet = 10,
  kMap = 11,
  kStruct = 12,
};

class ThriftReader {
 public:
  // `what` names the structure in errors ("Parquet footer of data.parquet").
  ThriftReader(std::string_view bytes, std::string what) : data_(bytes), what_(std::move(what)) {}

  // The next field header of the current struct: its id and type (kStop at the struct's end).
  // Begin/EndStruct bracket a nested struct (they keep the last field id of each level).
  Status ReadFieldHeader(int16_t* id, ThriftType* type);
  Status BeginStruct();
  void EndStruct();

  Status ReadBool(ThriftType field_type, bool* out);  // a struct field's bool is in its type
  Status ReadI32(int32_t* out);
  Status ReadI64(int64_t* out);
  Status ReadBinary(std::string* out);
  // A list or set header: element count and type.
  Status ReadListHeader(uint32_t* size, ThriftType* element_type);
  // Skips one value of `type` (a struct to its stop field).
  Status Skip(ThriftType type);

  size_t position() const { return pos_; }

 private:
  Status ReadVarint(uint64_t* out);
  Status Error(const std::string& why) const;

  std::string_view data_;
  std::string what_;
  size_t pos_ = 0;
  int depth_ = 0;
  int16_t last_id_ = 0;
  int16_t saved_ids_[64] = {};
};

}  // namespace offloadd::text
