#include "text/thrift_compact.h"

#include <cstring>

namespace offloadd::text {

namespace {
constexpr int kMaxDepth = 32;  // Parquet's structures nest a few levels; deeper is hostile
int64_t Unzigzag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }
}  // namespace

Status ThriftReader::Error(const std::string& why) const {
  return DataLossError(what_ + ": " + why + " at byte " + std::to_string(pos_));
}

Status ThriftReader::ReadVarint(uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos_ >= data_.size()) return Error("truncated varint");
    const auto b = static_cast<uint8_t>(data_[pos_++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return OkStatus();
    }
  }
  return Error("varint longer than 10 bytes");
}

Status ThriftReader::BeginStruct() {
  if (depth_ >= kMaxDepth)
    return Error("structures nested deeper than " + std::to_string(kMaxDepth));
  saved_ids_[depth_++] = last_id_;
  last_id_ = 0;
  return OkStatus();
}

void ThriftReader::EndStruct() {
  if (depth_ > 0) last_id_ = saved_ids_[--depth_];
}

Status ThriftReader::ReadFieldHeader(int16_t* id, ThriftType* type) {
  if (pos_ >= data_.size()) return Error("truncated struct (no stop field)");
  const auto b = static_cast<uint8_t>(data_[pos_++]);
  const uint8_t t = b & 0x0f;
  if (t == 0) {
    *type = ThriftType::kStop;
    *id = 0;
    return OkStatus();
  }
  if (t > 12) return Error("unknown field type " + std::to_string(t));
  *type = static_cast<ThriftType>(t);
  const uint8_t delta = b >> 4;
  if (delta != 0) {
    *id = static_cast<int16_t>(last_id_ + delta);
  } else {
    uint64_t v = 0;
    RETURN_IF_ERROR(ReadVarint(&v));
    *id = static_cast<int16_t>(Unzigzag(v));
  }
  last_id_ = *id;
  return OkStatus();
}

Status ThriftReader::ReadBool(ThriftType field_type, bool* out) {
  if (field_type == ThriftType::kTrue || field_type == ThriftType::kFalse) {
    *out = field_type == ThriftType::kTrue;
    return OkStatus();
  }
  return Error("expected a bool");
}

Status ThriftReader::ReadI32(int32_t* out) {
  uint64_t v = 0;
  RETURN_IF_ERROR(ReadVarint(&v));
  const int64_t s = Unzigzag(v);
  if (s < INT32_MIN || s > INT32_MAX) return Error("i32 out of range");
  *out = static_cast<int32_t>(s);
  return OkStatus();
}

Status ThriftReader::ReadI64(int64_t* out) {
  uint64_t v = 0;
  RETURN_IF_ERROR(ReadVarint(&v));
  *out = Unzigzag(v);
  return OkStatus();
}

Status ThriftReader::ReadBinary(std::string* out) {
  uint64_t n = 0;
  RETURN_IF_ERROR(ReadVarint(&n));
  if (n > data_.size() - pos_)
    return Error("binary of " + std::to_string(n) + " bytes runs past the end");
  out->assign(data_.substr(pos_, n));
  pos_ += n;
  return OkStatus();
}

Status ThriftReader::ReadListHeader(uint32_t* size, ThriftType* element_type) {
  if (pos_ >= data_.size()) return Error("truncated list header");
  const auto b = static_cast<uint8_t>(data_[pos_++]);
  uint64_t n = b >> 4;
  if (n == 15) RETURN_IF_ERROR(ReadVarint(&n));
  const uint8_t t = b & 0x0f;
  if (t == 0 || t > 12) return Error("unknown list element type " + std::to_string(t));
  // Every element takes at least one byte: a larger count is a lie.
  if (n > data_.size() - pos_)
    return Error("list of " + std::to_string(n) + " elements runs past the end");
  *size = static_cast<uint32_t>(n);
  *element_type = static_cast<ThriftType>(t);
  return OkStatus();
}

Status ThriftReader::Skip(ThriftType type) {
  uint64_t v = 0;
  switch (type) {
    case ThriftType::kTrue:
    case ThriftType::kFalse:
      return OkStatus();
    case ThriftType::kByte:
      if (pos_ >= data_.size()) return Error("truncated byte");
      ++pos_;
      return OkStatus();
    case ThriftType::kI16:
    case ThriftType::kI32:
    case ThriftType::kI64:
      return ReadVarint(&v);
    case ThriftType::kDouble:
      if (data_.size() - pos_ < 8) return Error("truncated double");
      pos_ += 8;
      return OkStatus();
    case ThriftType::kBinary: {
      RETURN_IF_ERROR(ReadVarint(&v));
      if (v > data_.size() - pos_) return Error("binary runs past the end");
      pos_ += v;
      return OkStatus();
    }
    case ThriftType::kList:
    case ThriftType::kSet: {
      uint32_t n = 0;
      ThriftType et{};
      RETURN_IF_ERROR(ReadListHeader(&n, &et));
      RETURN_IF_ERROR(BeginStruct());  // bounds the nesting of lists as of structs
      for (uint32_t i = 0; i < n; ++i) {
        // Bools inside lists are one byte each.
        RETURN_IF_ERROR(
            Skip(et == ThriftType::kTrue || et == ThriftType::kFalse ? ThriftType::kByte : et));
      }
      EndStruct();
      return OkStatus();
    }
    case ThriftType::kMap: {
      RETURN_IF_ERROR(ReadVarint(&v));
      if (v == 0) return OkStatus();
      if (v > data_.size() - pos_) return Error("map runs past the end");
      if (pos_ >= data_.size()) return Error("truncated map header");
      const auto kv = static_cast<uint8_t>(data_[pos_++]);
      const uint8_t kt = kv >> 4, vt = kv & 0x0f;
      if (kt == 0 || kt > 12 || vt == 0 || vt > 12) return Error("unknown map element type");
      auto fix = [](uint8_t t) {
        return t == 1 || t == 2 ? ThriftType::kByte : static_cast<ThriftType>(t);
      };
      RETURN_IF_ERROR(BeginStruct());
      for (uint64_t i = 0; i < v; ++i) {
        RETURN_IF_ERROR(Skip(fix(kt)));
        RETURN_IF_ERROR(Skip(fix(vt)));
      }
      EndStruct();
      return OkStatus();
    }
    case ThriftType::kStruct: {
      RETURN_IF_ERROR(BeginStruct());
      while (true) {
        int16_t id = 0;
        ThriftType t{};
        RETURN_IF_ERROR(ReadFieldHeader(&id, &t));
        if (t == ThriftType::kStop) break;
        RETURN_IF_ERROR(Skip(t));
      }
      EndStruct();
      return OkStatus();
    }
    case ThriftType::kStop:
      break;
  }
  return Error("cannot skip a value of type " + std::to_string(static_cast<int>(type)));
}

}  // namespace offloadd::text
