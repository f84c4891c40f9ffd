#include "text/arrow_ipc_reader.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>

#include "common/safe_path.h"
#include "text/byte_source.h"

namespace offloadd::text {

namespace {

using ojson = nlohmann::ordered_json;

constexpr int kMaxNesting = 16;

uint64_t Le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// A flatbuffer table, every read checked against the buffer.
class Table {
 public:
  static StatusOr<Table> Root(std::string_view buf) {
    if (buf.size() < 4) return DataLossError("flatbuffer shorter than its root offset");
    return At(buf, Le(buf.data(), 4));
  }
  static StatusOr<Table> At(std::string_view buf, uint64_t pos) {
    if (pos + 4 > buf.size()) return DataLossError("flatbuffer table outside the message");
    const auto soff = static_cast<int32_t>(Le(buf.data() + pos, 4));
    const int64_t vt = static_cast<int64_t>(pos) - soff;
    if (vt < 0 || static_cast<uint64_t>(vt) + 4 > buf.size())
      return DataLossError("flatbuffer vtable outside the message");
    const uint64_t vsize = Le(buf.data() + vt, 2);
    if (vsize < 4 || static_cast<uint64_t>(vt) + vsize > buf.size())
      return DataLossError("flatbuffer vtable size");
    return Table(buf, pos, static_cast<uint64_t>(vt), vsize);
  }

  // The field's absolute position, 0 when absent.
  StatusOr<uint64_t> Field(int id, uint64_t size) const {
    const uint64_t slot = 4 + 2 * static_cast<uint64_t>(id);
    if (slot + 2 > vsize_) return uint64_t{0};
    const uint64_t off = Le(buf_.data() + vt_ + slot, 2);
    if (off == 0) return uint64_t{0};
    if (pos_ + off + size > buf_.size())
      return DataLossError("flatbuffer field outside the message");
    return pos_ + off;
  }
  StatusOr<int64_t> Int(int id, int bytes, int64_t dflt) const {
    ASSIGN_OR_RETURN(uint64_t at, Field(id, bytes));
    if (at == 0) return dflt;
    const uint64_t raw = Le(buf_.data() + at, bytes);
    // Sign-extend: the fields read here are signed except ubyte union types and bools (small).
    const int shift = 64 - 8 * bytes;
    return static_cast<int64_t>(raw << shift) >> shift;
  }
  StatusOr<uint64_t> UInt(int id, int bytes, uint64_t dflt) const {
    ASSIGN_OR_RETURN(uint64_t at, Field(id, bytes));
    return at == 0 ? dflt : Le(buf_.data() + at, bytes);
  }
  // An offset field's target: 0 when absent.
  StatusOr<uint64_t> Target(int id) const {
    ASSIGN_OR_RETURN(uint64_t at, Field(id, 4));
    if (at == 0) return uint64_t{0};
    const uint64_t t = at + Le(buf_.data() + at, 4);
    if (t + 4 > buf_.size()) return DataLossError("flatbuffer offset outside the message");
    return t;
  }
  StatusOr<std::optional<Table>> Child(int id) const {
    ASSIGN_OR_RETURN(uint64_t t, Target(id));
    if (t == 0) return std::optional<Table>();
    ASSIGN_OR_RETURN(Table c, At(buf_, t));
    return std::optional<Table>(c);
  }
  StatusOr<std::string> String(int id) const {
    ASSIGN_OR_RETURN(uint64_t t, Target(id));
    if (t == 0) return std::string();
    const uint64_t n = Le(buf_.data() + t, 4);
    if (n > buf_.size() - t - 4) return DataLossError("flatbuffer string outside the message");
    return std::string(buf_.substr(t + 4, n));
  }
  // A vector field: its first element's position and length (0, 0 when absent), elements of
  // `element_size` bytes checked to lie inside the buffer.
  StatusOr<std::pair<uint64_t, uint64_t>> Vector(int id, uint64_t element_size) const {
    ASSIGN_OR_RETURN(uint64_t t, Target(id));
    if (t == 0) return std::pair<uint64_t, uint64_t>{0, 0};
    const uint64_t n = Le(buf_.data() + t, 4);
    if (n > (buf_.size() - t - 4) / element_size)
      return DataLossError("flatbuffer vector outside the message");
    return std::pair<uint64_t, uint64_t>{t + 4, n};
  }
  StatusOr<Table> VectorTable(uint64_t first, uint64_t i) const {
    const uint64_t at = first + 4 * i;
    return At(buf_, at + Le(buf_.data() + at, 4));
  }
  std::string_view buffer() const { return buf_; }

 private:
  Table(std::string_view b, uint64_t pos, uint64_t vt, uint64_t vsize)
      : buf_(b), pos_(pos), vt_(vt), vsize_(vsize) {}
  std::string_view buf_;
  uint64_t pos_, vt_, vsize_;
};

// Schema.fbs Type union members.
enum TypeId {
  kNull = 1,
  kInt = 2,
  kFloat = 3,
  kUtf8 = 5,
  kBool = 6,
  kList = 12,
  kStruct = 13,
  kLargeUtf8 = 20,
  kLargeList = 21
};
const char* const kTypeNames[] = {"NONE",          "Null",      "Int",           "FloatingPoint",
                                  "Binary",        "Utf8",      "Bool",          "Decimal",
                                  "Date",          "Time",      "Timestamp",     "Interval",
                                  "List",          "Struct",    "Union",         "FixedSizeBinary",
                                  "FixedSizeList", "Map",       "Duration",      "LargeBinary",
                                  "LargeUtf8",     "LargeList", "RunEndEncoded", "BinaryView",
                                  "Utf8View",      "ListView",  "LargeListView"};

struct FieldSpec {
  std::string name, path;
  int type = 0;
  int bit_width = 0;  // Int: 8..64; FloatingPoint: 32 or 64
  bool is_signed = true;
  std::vector<FieldSpec> children;
};

Status ParseField(const Table& f, const std::string& prefix, int depth, const std::string& name,
                  FieldSpec* out) {
  if (depth > kMaxNesting)
    return DataLossError(name + ": Arrow schema nests deeper than " + std::to_string(kMaxNesting));
  ASSIGN_OR_RETURN(out->name, f.String(0));
  out->path = prefix.empty() ? out->name : prefix + "." + out->name;
  ASSIGN_OR_RETURN(const uint64_t type, f.UInt(2, 1, 0));
  out->type = static_cast<int>(type);
  const std::string type_name = type < 27 ? kTypeNames[type] : "type " + std::to_string(type);
  auto refuse = [&](const std::string& why) {
    return UnimplementedError(name + ": column \"" + out->path + "\" of type " + type_name + ": " +
                              why);
  };
  ASSIGN_OR_RETURN(std::optional<Table> dict, f.Child(4));
  if (dict) return refuse("dictionary-encoded columns are not read");
  ASSIGN_OR_RETURN(std::optional<Table> t, f.Child(3));
  switch (out->type) {
    case kInt: {
      if (!t)
        return DataLossError(name + ": column \"" + out->path + "\": Int without its parameters");
      ASSIGN_OR_RETURN(const int64_t bits, t->Int(0, 4, 0));
      ASSIGN_OR_RETURN(const uint64_t sign, t->UInt(1, 1, 0));
      if (bits != 8 && bits != 16 && bits != 32 && bits != 64)
        return refuse("bit width " + std::to_string(bits));
      out->bit_width = static_cast<int>(bits);
      out->is_signed = sign != 0;
      if (bits == 64 && !out->is_signed) return refuse("unsigned 64-bit integers are not read");
      break;
    }
    case kFloat: {
      ASSIGN_OR_RETURN(const int64_t precision,
                       t ? t->Int(0, 2, 0) : StatusOr<int64_t>(int64_t{0}));
      if (precision != 1 && precision != 2) return refuse("half-precision floats are not read");
      out->bit_width = precision == 1 ? 32 : 64;
      break;
    }
    case kNull:
    case kUtf8:
    case kLargeUtf8:
    case kBool:
    case kList:
    case kLargeList:
    case kStruct:
      break;
    default:
      return refuse(
          "not read (datasets are read with strings, integers, floats, booleans, structs and lists "
          "of them)");
  }
  ASSIGN_OR_RETURN(auto children, f.Vector(5, 4));
  for (uint64_t i = 0; i < children.second; ++i) {
    ASSIGN_OR_RETURN(Table c, f.VectorTable(children.first, i));
    RETURN_IF_ERROR(ParseField(c, out->path, depth + 1, name, &out->children.emplace_back()));
  }
  const size_t want = out->type == kList || out->type == kLargeList ? 1
                      : out->type == kStruct                        ? out->children.size()
                                                                    : 0;
  if (out->children.size() != want)
    return DataLossError(name + ": column \"" + out->path + "\": wrong number of children");
  return OkStatus();
}

// The most elements (rows, or a nested column's values) a record batch body of `body` bytes can
// describe: one bit each, plus slack for short batches of Null columns, which have no buffers.
uint64_t MaxElements(uint64_t body) { return 8 * body + (uint64_t{1} << 20); }

// One column of a record batch: its buffers inside the (decompressed) body.
struct Column {
  const FieldSpec* spec = nullptr;
  int64_t length = 0, null_count = 0;
  std::string_view validity, offsets, values;
  std::vector<Column> children;
};

class BatchDecoder {
 public:
  BatchDecoder(const Table& batch, std::string_view body, const std::string& where)
      : batch_(batch), body_(body), where_(where) {}

  Status Init() {
    ASSIGN_OR_RETURN(nodes_, batch_.Vector(1, 16));
    ASSIGN_OR_RETURN(buffers_, batch_.Vector(2, 16));
    ASSIGN_OR_RETURN(std::optional<Table> compression, batch_.Child(3));
    if (compression) {
      ASSIGN_OR_RETURN(const int64_t codec, compression->Int(0, 1, 0));
      if (codec != 1)
        return UnimplementedError(where_ +
                                  ": LZ4_FRAME-compressed Arrow buffers are not read (ZSTD is)");
      zstd_ = true;
    }
    return OkStatus();
  }

  Status Build(const FieldSpec& spec, Column* col, int depth) {
    if (depth > kMaxNesting) return Bad("nested too deep");
    col->spec = &spec;
    if (node_ >= nodes_.second) return Bad("fewer field nodes than columns");
    const std::string_view b = batch_.buffer();
    const uint64_t at = nodes_.first + 16 * node_++;
    col->length = static_cast<int64_t>(Le(b.data() + at, 8));
    col->null_count = static_cast<int64_t>(Le(b.data() + at + 8, 8));
    if (col->length < 0 || col->null_count < 0 || col->null_count > col->length)
      return Bad("bad field node");
    // A Null column has no buffers to bound it: a list of them could claim billions of elements
    // from a few bytes. No column holds more elements than its batch has bits (plus slack for
    // short all-null batches), the same bound the batch's row count meets.
    if (static_cast<uint64_t>(col->length) > MaxElements(body_.size()))
      return Bad("column \"" + spec.path + "\": a length of " + std::to_string(col->length) +
                 " for a body of " + std::to_string(body_.size()) + " bytes");
    if (spec.type != kNull) {
      ASSIGN_OR_RETURN(col->validity, NextBuffer());
    }
    const uint64_t n = static_cast<uint64_t>(col->length);
    if (col->null_count > 0 && col->validity.size() < (n + 7) / 8)
      return Bad("validity bitmap shorter than the column");
    switch (spec.type) {
      case kInt:
      case kFloat: {
        ASSIGN_OR_RETURN(col->values, NextBuffer());
        if (col->values.size() / (spec.bit_width / 8) < n)
          return Bad("values shorter than the column");
        break;
      }
      case kBool: {
        ASSIGN_OR_RETURN(col->values, NextBuffer());
        if (col->values.size() < (n + 7) / 8) return Bad("values shorter than the column");
        break;
      }
      case kUtf8:
      case kLargeUtf8:
      case kList:
      case kLargeList: {
        const uint64_t w = spec.type == kUtf8 || spec.type == kList ? 4 : 8;
        ASSIGN_OR_RETURN(col->offsets, NextBuffer());
        if (n > 0 && col->offsets.size() / w < n + 1) return Bad("offsets shorter than the column");
        if (spec.type == kUtf8 || spec.type == kLargeUtf8) {
          ASSIGN_OR_RETURN(col->values, NextBuffer());
        }
        break;
      }
      default:
        break;
    }
    for (const FieldSpec& c : spec.children)
      RETURN_IF_ERROR(Build(c, &col->children.emplace_back(), depth + 1));
    if (!col->offsets.empty() && n > 0) RETURN_IF_ERROR(CheckOffsets(*col));
    return OkStatus();
  }

  // Offsets rise and end inside the data or child: every child element belongs to one row at most,
  // so what a batch decodes to is linear in its size.
  Status CheckOffsets(const Column& c) const {
    const FieldSpec& s = *c.spec;
    const int w = s.type == kUtf8 || s.type == kList ? 4 : 8;
    const uint64_t n = static_cast<uint64_t>(c.length);
    int64_t prev = 0;
    for (uint64_t i = 0; i <= n; ++i) {
      const auto o = static_cast<int64_t>(Le(c.offsets.data() + i * w, w));
      if (o < prev || (i == 0 && o < 0))
        return Bad("column \"" + s.path + "\": offsets out of order");
      prev = o;
    }
    const uint64_t end = static_cast<uint64_t>(prev);
    const uint64_t limit = s.type == kList || s.type == kLargeList
                               ? static_cast<uint64_t>(c.children[0].length)
                               : c.values.size();
    if (end > limit) return Bad("column \"" + s.path + "\": offsets run past the column's data");
    return OkStatus();
  }

  Status Bad(const std::string& why) const { return DataLossError(where_ + ": " + why); }

 private:
  StatusOr<std::string_view> NextBuffer() {
    if (buffer_ >= buffers_.second) return Bad("fewer buffers than the columns need");
    const std::string_view b = batch_.buffer();
    const uint64_t at = buffers_.first + 16 * buffer_++;
    const uint64_t off = Le(b.data() + at, 8), len = Le(b.data() + at + 8, 8);
    if (off > body_.size() || len > body_.size() - off)
      return Bad("a buffer lies outside the message body");
    std::string_view raw = body_.substr(off, len);
    if (!zstd_ || raw.empty()) return raw;
    if (raw.size() < 8) return Bad("compressed buffer without its length");
    const auto size = static_cast<int64_t>(Le(raw.data(), 8));
    if (size == -1) return raw.substr(8);
    if (size < 0 || static_cast<uint64_t>(size) > kMaxArrowMessageBytes)
      return Bad("compressed buffer size");
    // Allocated only for the size the frame itself declares (Arrow's ZSTD codec writes it): a few
    // bytes never claim a gigabyte.
    const unsigned long long frame = ZSTD_getFrameContentSize(raw.data() + 8, raw.size() - 8);
    if (frame != static_cast<unsigned long long>(size))
      return Bad("corrupt ZSTD buffer (its frame gives another size)");
    if (static_cast<uint64_t>(size) > kMaxArrowMessageBytes - inflated_)
      return Bad("compressed buffers inflate past " + std::to_string(kMaxArrowMessageBytes) +
                 " bytes in one batch");
    inflated_ += static_cast<uint64_t>(size);
    std::string& out = owned_.emplace_back(static_cast<size_t>(size), '\0');
    const size_t got = ZSTD_decompress(out.data(), out.size(), raw.data() + 8, raw.size() - 8);
    if (ZSTD_isError(got) || got != out.size()) return Bad("corrupt ZSTD buffer");
    return std::string_view(out);
  }

  const Table& batch_;
  std::string_view body_;
  std::string where_;
  std::pair<uint64_t, uint64_t> nodes_{}, buffers_{};
  uint64_t node_ = 0, buffer_ = 0;
  bool zstd_ = false;
  uint64_t inflated_ = 0;          // bytes decompressed into owned_, at most one message's worth
  std::deque<std::string> owned_;  // decompressed buffers: a deque never moves them
};

bool Valid(const Column& c, uint64_t i) {
  if (c.null_count == 0 || c.validity.empty()) return true;
  return (static_cast<uint8_t>(c.validity[i / 8]) >> (i % 8)) & 1;
}

StatusOr<ojson> Value(const Column& c, uint64_t i, const std::string& where) {
  if (i >= static_cast<uint64_t>(c.length))
    return DataLossError(where + ": an offset points past its column");
  if (c.spec->type == kNull || !Valid(c, i)) return ojson();
  const FieldSpec& s = *c.spec;
  switch (s.type) {
    case kInt: {
      const int bytes = s.bit_width / 8;
      const uint64_t raw = Le(c.values.data() + i * bytes, bytes);
      if (!s.is_signed) return ojson(raw);
      const int shift = 64 - s.bit_width;
      return ojson(static_cast<int64_t>(raw << shift) >> shift);
    }
    case kFloat: {
      if (s.bit_width == 32) {
        float f;
        const auto raw = static_cast<uint32_t>(Le(c.values.data() + i * 4, 4));
        std::memcpy(&f, &raw, 4);
        return ojson(static_cast<double>(f));
      }
      double d;
      const uint64_t raw = Le(c.values.data() + i * 8, 8);
      std::memcpy(&d, &raw, 8);
      return ojson(d);
    }
    case kBool:
      return ojson(((static_cast<uint8_t>(c.values[i / 8]) >> (i % 8)) & 1) != 0);
    case kUtf8:
    case kLargeUtf8:
    case kList:
    case kLargeList: {
      const int w = s.type == kUtf8 || s.type == kList ? 4 : 8;
      const auto lo = static_cast<int64_t>(Le(c.offsets.data() + i * w, w));
      const auto hi = static_cast<int64_t>(Le(c.offsets.data() + (i + 1) * w, w));
      if (lo < 0 || hi < lo) return DataLossError(where + ": offsets out of order");
      if (s.type == kUtf8 || s.type == kLargeUtf8) {
        if (static_cast<uint64_t>(hi) > c.values.size())
          return DataLossError(where + ": a string runs past its data");
        return ojson(std::string(c.values.substr(lo, hi - lo)));
      }
      ojson arr = ojson::array();
      for (int64_t j = lo; j < hi; ++j) {
        ASSIGN_OR_RETURN(ojson v, Value(c.children[0], static_cast<uint64_t>(j), where));
        arr.push_back(std::move(v));
      }
      return arr;
    }
    case kStruct: {
      ojson obj = ojson::object();
      for (const Column& child : c.children) {
        ASSIGN_OR_RETURN(obj[child.spec->name], Value(child, i, where));
      }
      return obj;
    }
    default:
      return InternalError(where + ": unexpected type");
  }
}

Status ReadStream(const ByteSource& src, const std::string& name, const ArrowRowFn& each) {
  uint64_t pos = 0;
  std::string head;
  if (src.size() >= 8) {
    RETURN_IF_ERROR(src.ReadAt(0, 8, &head));
    if (head.compare(0, 6, "ARROW1") == 0)
      pos = 8;  // an IPC file: the stream follows the padded magic
  }
  std::vector<FieldSpec> schema;
  bool have_schema = false;
  size_t row = 0, batch = 0;
  while (true) {
    if (pos + 4 > src.size()) {
      if (pos == src.size() && have_schema) return OkStatus();  // a stream without its end marker
      return DataLossError(name + ": truncated Arrow stream (a message header is cut off)");
    }
    std::string word;
    RETURN_IF_ERROR(src.ReadAt(pos, 4, &word));
    pos += 4;
    uint64_t len = Le(word.data(), 4);
    if (len == 0xffffffffu) {  // continuation marker, then the length
      if (pos + 4 > src.size())
        return DataLossError(name + ": truncated Arrow stream (message length cut off)");
      RETURN_IF_ERROR(src.ReadAt(pos, 4, &word));
      pos += 4;
      len = Le(word.data(), 4);
    }
    if (len == 0) {
      if (!have_schema) return DataLossError(name + ": an Arrow stream without a schema");
      return OkStatus();  // end of stream (an IPC file's footer follows)
    }
    if (len > kMaxArrowMessageBytes || len > src.size() - pos) {
      return DataLossError(name + ": an Arrow message of " + std::to_string(len) +
                           " bytes runs past the file (truncated?)");
    }
    std::string meta;
    RETURN_IF_ERROR(src.ReadAt(pos, len, &meta));
    pos += len;
    auto parsed = [&]() -> Status {
      ASSIGN_OR_RETURN(Table msg, Table::Root(meta));
      ASSIGN_OR_RETURN(const uint64_t header_type, msg.UInt(1, 1, 0));
      ASSIGN_OR_RETURN(std::optional<Table> header, msg.Child(2));
      ASSIGN_OR_RETURN(const int64_t body_len, msg.Int(3, 8, 0));
      if (body_len < 0 || static_cast<uint64_t>(body_len) > kMaxArrowMessageBytes ||
          static_cast<uint64_t>(body_len) > src.size() - pos) {
        return DataLossError("a message body of " + std::to_string(body_len) +
                             " bytes runs past the file (truncated?)");
      }
      std::string body;
      RETURN_IF_ERROR(src.ReadAt(pos, static_cast<uint64_t>(body_len), &body));
      pos += static_cast<uint64_t>(body_len);
      if (!header) return DataLossError("a message without its header");
      if (header_type == 1) {  // Schema
        if (have_schema) return DataLossError("a second schema");
        ASSIGN_OR_RETURN(auto fields, header->Vector(1, 4));
        for (uint64_t i = 0; i < fields.second; ++i) {
          ASSIGN_OR_RETURN(Table f, header->VectorTable(fields.first, i));
          RETURN_IF_ERROR(ParseField(f, "", 0, name, &schema.emplace_back()));
        }
        have_schema = true;
        return OkStatus();
      }
      if (header_type == 2) return UnimplementedError("dictionary batches are not read");
      if (header_type != 3)
        return UnimplementedError("message type " + std::to_string(header_type) + " is not read");
      if (!have_schema) return DataLossError("a record batch before the schema");
      const std::string where = "record batch " + std::to_string(batch++);
      ASSIGN_OR_RETURN(const int64_t rows, header->Int(0, 8, 0));
      // Null columns have no buffers: a length far beyond the body is a lie, not a batch to loop
      // over.
      if (rows < 0 || static_cast<uint64_t>(rows) > MaxElements(body.size())) {
        return DataLossError(where + ": a length of " + std::to_string(rows) +
                             " rows for a body of " + std::to_string(body.size()) + " bytes");
      }
      BatchDecoder dec(*header, body, where);
      RETURN_IF_ERROR(dec.Init());
      std::vector<Column> cols(schema.size());
      for (size_t c = 0; c < schema.size(); ++c) {
        RETURN_IF_ERROR(dec.Build(schema[c], &cols[c], 0));
        if (cols[c].length < rows)
          return dec.Bad("column \"" + schema[c].path + "\" is shorter than the batch");
      }
      for (int64_t r = 0; r < rows; ++r) {
        ojson record = ojson::object();
        for (const Column& c : cols) {
          ASSIGN_OR_RETURN(record[c.spec->name],
                           Value(c, static_cast<uint64_t>(r), where + ", column " + c.spec->path));
        }
        RETURN_IF_ERROR(each(++row, std::move(record)));
      }
      return OkStatus();
    }();
    if (!parsed.ok()) {
      const std::string& m = parsed.message();
      return Status(parsed.code(), m.rfind(name, 0) == 0 ? m : name + ": " + m);
    }
  }
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool HasArrowMagic(std::string_view head) {
  return head.substr(0, 6) == "ARROW1" ||
         head.substr(0, 4) == std::string_view("\xff\xff\xff\xff", 4);
}

Status ForEachArrowRowInBuffer(std::string_view bytes, const std::string& name,
                               const ArrowRowFn& each) {
  return ReadStream(BufferByteSource(bytes), name, each);
}

Status ForEachArrowRow(const std::string& path, const ArrowRowFn& each) {
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(path, O_RDONLY | O_NONBLOCK, Access::kRead));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, path);
  return ReadStream(FileByteSource(std::move(fd), static_cast<uint64_t>(st.st_size), path), path,
                    each);
}

StatusOr<std::vector<std::string>> SaveToDiskFiles(const std::string& dir) {
  if (::access((dir + "/dataset_dict.json").c_str(), F_OK) == 0) {
    std::string splits;
    if (auto text = ReadFileConfined(dir + "/dataset_dict.json"); text.ok()) {
      const ojson j = ojson::parse(*text, nullptr, false);
      if (j.is_object() && j.contains("splits") && j["splits"].is_array()) {
        for (const ojson& s : j["splits"]) {
          if (s.is_string())
            splits += (splits.empty() ? "" : ", ") + dir + "/" + s.get<std::string>();
        }
      }
    }
    return InvalidArgumentError(
        dir + ": a DatasetDict (save_to_disk of several splits); give one split's directory" +
        (splits.empty() ? std::string() : ": " + splits));
  }
  std::vector<std::string> out;
  if (auto text = ReadFileConfined(dir + "/state.json"); text.ok()) {
    const ojson j = ojson::parse(*text, nullptr, false);
    if (!j.is_object() || !j.contains("_data_files") || !j["_data_files"].is_array()) {
      return DataLossError(dir +
                           "/state.json: no \"_data_files\" list (not a save_to_disk directory?)");
    }
    for (const ojson& f : j["_data_files"]) {
      if (!f.is_object() || !f.contains("filename") || !f["filename"].is_string()) {
        return DataLossError(dir + "/state.json: a \"_data_files\" entry without a \"filename\"");
      }
      const std::string name = f["filename"].get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
        return InvalidArgumentError(dir + "/state.json: data file \"" + name +
                                    "\" is not a file name in the directory");
      }
      out.push_back(dir + "/" + name);
    }
    if (out.empty()) return InvalidArgumentError(dir + "/state.json lists no data files");
    return out;
  }
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(dir, O_RDONLY | O_DIRECTORY, Access::kRead));
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return ErrnoError(errno, dir);
  fd.release();
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("data-", 0) == 0 && EndsWith(name, ".arrow")) out.push_back(dir + "/" + name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  if (out.empty()) return InvalidArgumentError(dir + ": no state.json and no data-*.arrow files");
  return out;
}

}  // namespace offloadd::text
