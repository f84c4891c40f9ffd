#include "text/parquet_reader.h"

#include <fcntl.h>
#include <snappy-c.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "common/safe_path.h"
#include "text/byte_source.h"
#include "text/parquet_format.h"
#include "text/thrift_compact.h"

namespace offloadd::text {

namespace {

using ojson = nlohmann::ordered_json;
using namespace parquet;  // NOLINT: the format's enums and metadata (parquet_format.h)

constexpr uint64_t kMaxPageBytes = uint64_t{256} << 20;

// ---- decompression -------------------------------------------------------------------------

StatusOr<std::string> Decompress(int codec, std::string_view in, uint64_t size,
                                 const std::string& what) {
  if (size > kMaxPageBytes) {
    return ResourceExhaustedError(what + ": a page of " + std::to_string(size) +
                                  " bytes (more than " + std::to_string(kMaxPageBytes >> 20) +
                                  " MiB)");
  }
  std::string out;
  switch (codec) {
    case kUncompressed:
      if (in.size() != size) return DataLossError(what + ": page sizes disagree");
      return std::string(in);
    case kSnappy: {
      size_t n = 0;
      if (snappy_uncompressed_length(in.data(), in.size(), &n) != SNAPPY_OK || n != size) {
        return DataLossError(what + ": corrupt Snappy data");
      }
      out.resize(size);
      if (snappy_uncompress(in.data(), in.size(), out.data(), &n) != SNAPPY_OK || n != size) {
        return DataLossError(what + ": corrupt Snappy data");
      }
      return out;
    }
    case kGzip: {
      // Deflate expands at most 1032:1: a larger claim is a lie, refused before allocating it.
      if (size > in.size() * 1032 + 1024)
        return DataLossError(what + ": corrupt gzip data (page sizes)");
      out.resize(size);
      z_stream zs{};
      if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK)
        return InternalError("zlib inflateInit2 failed");
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      zs.avail_in = static_cast<uInt>(in.size());
      zs.next_out = reinterpret_cast<Bytef*>(out.data());
      zs.avail_out = static_cast<uInt>(size);
      const int rc = inflate(&zs, Z_FINISH);
      const uint64_t produced = zs.total_out;
      inflateEnd(&zs);
      if (rc != Z_STREAM_END || produced != size)
        return DataLossError(what + ": corrupt gzip data");
      return out;
    }
    case kZstd: {
      // The frame declares its size (Parquet writers use ZSTD's simple API, which writes it).
      const unsigned long long frame = ZSTD_getFrameContentSize(in.data(), in.size());
      if (frame != size)
        return DataLossError(what + ": corrupt ZSTD data (its frame gives another size)");
      out.resize(size);
      const size_t n = ZSTD_decompress(out.data(), size, in.data(), in.size());
      if (ZSTD_isError(n) || n != size) {
        return DataLossError(
            what + ": corrupt ZSTD data" +
            (ZSTD_isError(n) ? std::string(" (") + ZSTD_getErrorName(n) + ")" : ""));
      }
      return out;
    }
    default:
      return UnimplementedError(what + ": compression codec " + CodecName(codec) +
                                " is not read (UNCOMPRESSED, SNAPPY, GZIP and ZSTD are)");
  }
}

// ---- levels and values ----------------------------------------------------------------------

int BitWidth(int max_level) {
  int w = 0;
  while ((1 << w) <= max_level) ++w;
  return w;
}

// Parquet's RLE / bit-packed hybrid: `count` values of `bit_width` bits.
Status DecodeHybrid(std::string_view in, int bit_width, size_t count, std::vector<uint32_t>* out,
                    const std::string& what) {
  out->clear();
  if (bit_width > 32) return DataLossError(what + ": bit width " + std::to_string(bit_width));
  if (bit_width == 0) {
    out->assign(count, 0);
    return OkStatus();
  }
  out->reserve(count);
  size_t pos = 0;
  const size_t value_bytes = (bit_width + 7) / 8;
  while (out->size() < count) {
    uint64_t header = 0;
    int shift = 0;
    while (true) {
      if (pos >= in.size() || shift > 63) return DataLossError(what + ": truncated RLE data");
      const auto b = static_cast<uint8_t>(in[pos++]);
      header |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    if (header & 1) {  // bit-packed: groups of 8 values
      const uint64_t groups = header >> 1;
      if (groups > (in.size() - pos) / static_cast<uint64_t>(bit_width) + 1) {
        return DataLossError(what + ": bit-packed run past the end");
      }
      const uint64_t bytes = groups * static_cast<uint64_t>(bit_width);
      if (bytes > in.size() - pos) return DataLossError(what + ": bit-packed run past the end");
      const uint64_t n = groups * 8;
      for (uint64_t i = 0; i < n && out->size() < count; ++i) {
        uint64_t v = 0;
        const uint64_t bit = i * static_cast<uint64_t>(bit_width);
        for (int k = 0; k < bit_width; ++k) {
          const uint64_t b = bit + k;
          v |= static_cast<uint64_t>((static_cast<uint8_t>(in[pos + b / 8]) >> (b % 8)) & 1) << k;
        }
        out->push_back(static_cast<uint32_t>(v));
      }
      pos += bytes;
    } else {  // a run of one value
      const uint64_t n = header >> 1;
      if (value_bytes > in.size() - pos) return DataLossError(what + ": truncated RLE run");
      uint32_t v = 0;
      for (size_t k = 0; k < value_bytes; ++k)
        v |= static_cast<uint32_t>(static_cast<uint8_t>(in[pos + k])) << (8 * k);
      pos += value_bytes;
      if (n == 0) return DataLossError(what + ": empty RLE run");
      const uint64_t take = std::min<uint64_t>(n, count - out->size());
      out->insert(out->end(), take, v);
    }
  }
  return OkStatus();
}

uint64_t LoadLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// `count` PLAIN-encoded values of the leaf's type.
Status DecodePlain(std::string_view in, const SchemaNode& leaf, size_t count,
                   std::vector<ojson>* out, const std::string& what) {
  size_t pos = 0;
  auto need = [&](size_t n) -> Status {
    if (n > in.size() - pos) return DataLossError(what + ": values run past the end of the page");
    return OkStatus();
  };
  for (size_t i = 0; i < count; ++i) {
    switch (leaf.type) {
      case kBoolean:
        if (i / 8 >= in.size())
          return DataLossError(what + ": values run past the end of the page");
        out->push_back(((static_cast<uint8_t>(in[i / 8]) >> (i % 8)) & 1) != 0);
        break;
      case kInt32: {
        RETURN_IF_ERROR(need(4));
        const auto raw = static_cast<uint32_t>(LoadLe(in.data() + pos, 4));
        pos += 4;
        if (leaf.unsigned_int) {
          out->push_back(static_cast<uint64_t>(raw));
        } else {
          out->push_back(static_cast<int64_t>(static_cast<int32_t>(raw)));
        }
        break;
      }
      case kInt64:
        RETURN_IF_ERROR(need(8));
        out->push_back(static_cast<int64_t>(LoadLe(in.data() + pos, 8)));
        pos += 8;
        break;
      case kFloat: {
        RETURN_IF_ERROR(need(4));
        float f;
        const auto raw = static_cast<uint32_t>(LoadLe(in.data() + pos, 4));
        std::memcpy(&f, &raw, 4);
        pos += 4;
        out->push_back(static_cast<double>(f));
        break;
      }
      case kDouble: {
        RETURN_IF_ERROR(need(8));
        double d;
        const uint64_t raw = LoadLe(in.data() + pos, 8);
        std::memcpy(&d, &raw, 8);
        pos += 8;
        out->push_back(d);
        break;
      }
      case kByteArray: {
        RETURN_IF_ERROR(need(4));
        const uint64_t n = LoadLe(in.data() + pos, 4);
        pos += 4;
        RETURN_IF_ERROR(need(n));
        out->push_back(std::string(in.substr(pos, n)));
        pos += n;
        break;
      }
      default:
        return InternalError(what + ": unexpected physical type");
    }
  }
  return OkStatus();
}

// One leaf column of one row group: its levels, and the values where the level is the maximum.
struct ColumnData {
  std::vector<uint32_t> def, rep;
  std::vector<ojson> values;
};

struct PageHeader {
  int type = -1;
  int32_t uncompressed = -1, compressed = -1;
  int32_t num_values = 0;
  int encoding = 0, def_encoding = kRle, rep_encoding = kRle;
  int32_t def_bytes = 0, rep_bytes = 0;  // v2
  bool v2_compressed = true;
  int32_t dict_values = 0;
  int dict_encoding = 0;
};

Status ReadDataPageHeader(ThriftReader& t, PageHeader* h, bool v2) {
  RETURN_IF_ERROR(t.BeginStruct());
  while (true) {
    int16_t id;
    ThriftType ty;
    RETURN_IF_ERROR(t.ReadFieldHeader(&id, &ty));
    if (ty == ThriftType::kStop) break;
    int32_t v = 0;
    if (ty == ThriftType::kI32 && !(v2 && id == 7)) {
      RETURN_IF_ERROR(t.ReadI32(&v));
      if (!v2) {
        if (id == 1) h->num_values = v;
        if (id == 2) h->encoding = v;
        if (id == 3) h->def_encoding = v;
        if (id == 4) h->rep_encoding = v;
      } else {
        if (id == 1) h->num_values = v;
        if (id == 4) h->encoding = v;
        if (id == 5) h->def_bytes = v;
        if (id == 6) h->rep_bytes = v;
      }
    } else if (v2 && id == 7 && (ty == ThriftType::kTrue || ty == ThriftType::kFalse)) {
      h->v2_compressed = ty == ThriftType::kTrue;
    } else {
      RETURN_IF_ERROR(t.Skip(ty));
    }
  }
  t.EndStruct();
  return OkStatus();
}

Status ReadPageHeader(ThriftReader& t, PageHeader* h) {
  RETURN_IF_ERROR(t.BeginStruct());
  while (true) {
    int16_t id;
    ThriftType ty;
    RETURN_IF_ERROR(t.ReadFieldHeader(&id, &ty));
    if (ty == ThriftType::kStop) break;
    int32_t v = 0;
    if (id == 1 && ty == ThriftType::kI32) {
      RETURN_IF_ERROR(t.ReadI32(&h->type));
    } else if (id == 2 && ty == ThriftType::kI32) {
      RETURN_IF_ERROR(t.ReadI32(&h->uncompressed));
    } else if (id == 3 && ty == ThriftType::kI32) {
      RETURN_IF_ERROR(t.ReadI32(&h->compressed));
    } else if ((id == 5 || id == 8) && ty == ThriftType::kStruct) {
      RETURN_IF_ERROR(ReadDataPageHeader(t, h, id == 8));
    } else if (id == 7 && ty == ThriftType::kStruct) {
      RETURN_IF_ERROR(t.BeginStruct());
      while (true) {
        int16_t fid;
        ThriftType fty;
        RETURN_IF_ERROR(t.ReadFieldHeader(&fid, &fty));
        if (fty == ThriftType::kStop) break;
        if (fty == ThriftType::kI32 && (fid == 1 || fid == 2)) {
          RETURN_IF_ERROR(t.ReadI32(&v));
          (fid == 1 ? h->dict_values : h->dict_encoding) = v;
        } else {
          RETURN_IF_ERROR(t.Skip(fty));
        }
      }
      t.EndStruct();
    } else {
      RETURN_IF_ERROR(t.Skip(ty));
    }
  }
  t.EndStruct();
  if (h->uncompressed < 0 || h->compressed < 0 || h->num_values < 0 || h->def_bytes < 0 ||
      h->rep_bytes < 0 || h->dict_values < 0) {
    return DataLossError("negative size in a page header");
  }
  return OkStatus();
}

// Reads and decodes one column chunk.
Status ReadColumn(const ByteSource& src, const ColumnChunk& cc, const SchemaNode& leaf,
                  ColumnData* out, const std::string& what) {
  const int64_t start =
      cc.dictionary_page_offset > 0 && cc.dictionary_page_offset < cc.data_page_offset
          ? cc.dictionary_page_offset
          : cc.data_page_offset;
  if (start < 4 || cc.total_compressed_size < 0 || static_cast<uint64_t>(start) > src.size() ||
      static_cast<uint64_t>(cc.total_compressed_size) > src.size() - static_cast<uint64_t>(start)) {
    return DataLossError(what + ": the column chunk lies outside the file (truncated?)");
  }
  std::string chunk;
  RETURN_IF_ERROR(src.ReadAt(static_cast<uint64_t>(start),
                             static_cast<uint64_t>(cc.total_compressed_size), &chunk));
  std::vector<ojson> dict;
  bool have_dict = false;
  size_t pos = 0;
  int64_t levels = 0;
  std::vector<uint32_t> idx, lv;
  while (levels < cc.num_values) {
    if (pos >= chunk.size())
      return DataLossError(what + ": the column chunk ends before its values");
    ThriftReader t(std::string_view(chunk).substr(pos), what + " page header");
    PageHeader h;
    Status hs = ReadPageHeader(t, &h);
    if (!hs.ok()) return DataLossError(what + ": " + hs.message());
    pos += t.position();
    if (static_cast<uint64_t>(h.compressed) > chunk.size() - pos) {
      return DataLossError(what + ": a page runs past the column chunk");
    }
    const std::string_view page(chunk.data() + pos, h.compressed);
    pos += h.compressed;
    if (h.type == kDictionaryPage) {
      if (h.dict_encoding != kPlain && h.dict_encoding != kPlainDictionary) {
        return UnimplementedError(what + ": dictionary encoding " + EncodingName(h.dict_encoding));
      }
      ASSIGN_OR_RETURN(std::string data, Decompress(cc.codec, page, h.uncompressed, what));
      if (static_cast<uint64_t>(h.dict_values) > data.size() * 8 + 8)
        return DataLossError(what + ": dictionary size");
      dict.clear();
      RETURN_IF_ERROR(DecodePlain(data, leaf, h.dict_values, &dict, what + " dictionary"));
      have_dict = true;
      continue;
    }
    if (h.type != kDataPage && h.type != kDataPageV2) continue;  // index pages: nothing to read
    const size_t n = h.num_values;
    if (n == 0) continue;
    levels += static_cast<int64_t>(n);
    if (static_cast<uint64_t>(levels) > kMaxParquetRowGroupValues || levels > cc.num_values) {
      return DataLossError(what + ": more values in the pages than the column chunk says");
    }
    std::string data;
    std::string_view rep_in, def_in, values;
    if (h.type == kDataPage) {
      ASSIGN_OR_RETURN(data, Decompress(cc.codec, page, h.uncompressed, what));
      std::string_view rest(data);
      auto take_levels = [&](int encoding, std::string_view* into) -> Status {
        if (encoding != kRle) {
          return UnimplementedError(what + ": level encoding " + EncodingName(encoding) +
                                    " (RLE is read)");
        }
        if (rest.size() < 4) return DataLossError(what + ": truncated levels");
        const uint64_t len = LoadLe(rest.data(), 4);
        if (len > rest.size() - 4) return DataLossError(what + ": levels run past the page");
        *into = rest.substr(4, len);
        rest.remove_prefix(4 + len);
        return OkStatus();
      };
      if (leaf.max_rep > 0) RETURN_IF_ERROR(take_levels(h.rep_encoding, &rep_in));
      if (leaf.max_def > 0) RETURN_IF_ERROR(take_levels(h.def_encoding, &def_in));
      values = rest;
    } else {
      const uint64_t lv_bytes =
          static_cast<uint64_t>(h.rep_bytes) + static_cast<uint64_t>(h.def_bytes);
      if (lv_bytes > page.size() || lv_bytes > static_cast<uint64_t>(h.uncompressed)) {
        return DataLossError(what + ": levels run past the page");
      }
      rep_in = page.substr(0, h.rep_bytes);
      def_in = page.substr(h.rep_bytes, h.def_bytes);
      const std::string_view body = page.substr(lv_bytes);
      const uint64_t body_size = static_cast<uint64_t>(h.uncompressed) - lv_bytes;
      if (h.v2_compressed && cc.codec != kUncompressed) {
        ASSIGN_OR_RETURN(data, Decompress(cc.codec, body, body_size, what));
        values = data;
      } else {
        if (body.size() != body_size) return DataLossError(what + ": page sizes disagree");
        values = body;
      }
    }
    RETURN_IF_ERROR(
        DecodeHybrid(rep_in, BitWidth(leaf.max_rep), n, &lv, what + " repetition levels"));
    out->rep.insert(out->rep.end(), lv.begin(), lv.end());
    RETURN_IF_ERROR(
        DecodeHybrid(def_in, BitWidth(leaf.max_def), n, &lv, what + " definition levels"));
    size_t present = 0;
    for (uint32_t d : lv) {
      if (d > static_cast<uint32_t>(leaf.max_def))
        return DataLossError(what + ": definition level out of range");
      present += d == static_cast<uint32_t>(leaf.max_def);
    }
    for (size_t i = out->rep.size() - n; i < out->rep.size(); ++i) {
      if (out->rep[i] > static_cast<uint32_t>(leaf.max_rep))
        return DataLossError(what + ": repetition level out of range");
    }
    out->def.insert(out->def.end(), lv.begin(), lv.end());
    if (h.encoding == kPlain) {
      RETURN_IF_ERROR(DecodePlain(values, leaf, present, &out->values, what));
    } else if (h.encoding == kRle && leaf.type == kBoolean) {
      // Booleans in v2 pages: a 4-byte length, then the hybrid with bit width 1.
      if (values.size() < 4) return DataLossError(what + ": truncated boolean values");
      const uint64_t len = LoadLe(values.data(), 4);
      if (len > values.size() - 4)
        return DataLossError(what + ": boolean values run past the page");
      RETURN_IF_ERROR(
          DecodeHybrid(values.substr(4, len), 1, present, &idx, what + " boolean values"));
      for (uint32_t b : idx) out->values.push_back(b != 0);
    } else if (h.encoding == kPlainDictionary || h.encoding == kRleDictionary) {
      if (!have_dict)
        return DataLossError(what + ": dictionary-encoded page without a dictionary page");
      if (present > 0) {
        if (values.empty()) return DataLossError(what + ": truncated dictionary indices");
        const int width = static_cast<uint8_t>(values[0]);
        RETURN_IF_ERROR(
            DecodeHybrid(values.substr(1), width, present, &idx, what + " dictionary indices"));
        for (uint32_t i : idx) {
          if (i >= dict.size()) return DataLossError(what + ": dictionary index out of range");
          out->values.push_back(dict[i]);
        }
      }
    } else {
      return UnimplementedError(what + ": value encoding " + EncodingName(h.encoding) +
                                " is not read (PLAIN and dictionary encodings are)");
    }
  }
  if (levels != cc.num_values)
    return DataLossError(what + ": the pages hold fewer values than the column chunk says");
  return OkStatus();
}

// ---- record assembly ------------------------------------------------------------------------

struct Cursor {
  const ColumnData* col = nullptr;
  size_t level = 0, value = 0;
};

class Assembler {
 public:
  Assembler(const FileMetaData& meta, std::vector<ColumnData>& cols, std::string what)
      : meta_(meta), what_(std::move(what)) {
    for (const ColumnData& c : cols) cursors_.push_back(Cursor{&c});
  }

  StatusOr<ojson> Row() {
    ojson row = ojson::object();
    for (int child : meta_.schema[0].children) {
      const SchemaNode& f = meta_.schema[child];
      const Cursor& c = cursors_[f.first_leaf];
      if (c.level >= c.col->def.size())
        return Bad("a column has fewer values than the row group has rows");
      if (c.col->rep[c.level] != 0) return Bad("a row starts inside a list");
      ASSIGN_OR_RETURN(row[f.name], Value(f));
    }
    return row;
  }

  Status Finish() {
    for (const Cursor& c : cursors_) {
      if (c.level != c.col->def.size() || c.value != c.col->values.size()) {
        return Bad("columns hold more values than the row group has rows");
      }
    }
    return OkStatus();
  }

 private:
  Status Bad(const std::string& why) const { return DataLossError(what_ + ": " + why); }

  uint32_t PeekDef(const SchemaNode& n) const {
    const Cursor& c = cursors_[n.first_leaf];
    return c.level < c.col->def.size() ? c.col->def[c.level] : 0;
  }
  Status SkipAll(const SchemaNode& n) {
    for (int l = n.first_leaf; l < n.first_leaf + n.leaves; ++l) {
      if (cursors_[l].level >= cursors_[l].col->def.size()) return Bad("a column ends early");
      ++cursors_[l].level;
    }
    return OkStatus();
  }

  StatusOr<ojson> Value(const SchemaNode& n) {
    if (n.list_element >= 0) return List(n);
    if (n.IsLeaf()) {
      Cursor& c = cursors_[n.first_leaf];
      if (c.level >= c.col->def.size()) return Bad("a column ends early");
      const uint32_t d = c.col->def[c.level++];
      if (d < static_cast<uint32_t>(n.max_def)) return ojson();
      if (c.value >= c.col->values.size())
        return Bad("a column has fewer values than its levels say");
      return c.col->values[c.value++];
    }
    if (n.repetition == kOptional && PeekDef(n) < static_cast<uint32_t>(n.max_def)) {
      RETURN_IF_ERROR(SkipAll(n));
      return ojson();
    }
    ojson obj = ojson::object();
    for (int child : n.children) {
      ASSIGN_OR_RETURN(obj[meta_.schema[child].name], Value(meta_.schema[child]));
    }
    return obj;
  }

  StatusOr<ojson> List(const SchemaNode& n) {
    const SchemaNode& r = meta_.schema[n.list_repeated];
    const SchemaNode& e = meta_.schema[n.list_element];
    const uint32_t d = PeekDef(n);
    if (n.repetition == kOptional && d < static_cast<uint32_t>(n.max_def)) {
      RETURN_IF_ERROR(SkipAll(n));
      return ojson();
    }
    if (d < static_cast<uint32_t>(r.max_def)) {
      RETURN_IF_ERROR(SkipAll(n));
      return ojson::array();
    }
    ojson arr = ojson::array();
    while (true) {
      ASSIGN_OR_RETURN(ojson v, Value(e));
      arr.push_back(std::move(v));
      const Cursor& c = cursors_[n.first_leaf];
      if (c.level >= c.col->rep.size() || c.col->rep[c.level] < static_cast<uint32_t>(r.max_rep))
        break;
    }
    return arr;
  }

  const FileMetaData& meta_;
  std::string what_;
  std::vector<Cursor> cursors_;
};

Status ReadFile(const ByteSource& src, const std::string& name, const ParquetRowFn& each) {
  if (src.size() < 12)
    return DataLossError(name + ": not a Parquet file (shorter than its magic and footer)");
  std::string tail;
  RETURN_IF_ERROR(src.ReadAt(src.size() - 8, 8, &tail));
  std::string head;
  RETURN_IF_ERROR(src.ReadAt(0, 4, &head));
  if (tail.substr(4) == "PARE")
    return UnimplementedError(name + ": an encrypted Parquet file (not read)");
  if (head != "PAR1" || tail.substr(4) != "PAR1") {
    return DataLossError(name + ": not a Parquet file, or truncated (no PAR1 magic at both ends)");
  }
  const uint64_t footer_len = LoadLe(tail.data(), 4);
  if (footer_len > kMaxParquetFooterBytes) {
    return ResourceExhaustedError(name + ": a Parquet footer of " + std::to_string(footer_len) +
                                  " bytes");
  }
  if (footer_len > src.size() - 12)
    return DataLossError(name + ": the footer length runs past the file (truncated?)");
  std::string footer;
  RETURN_IF_ERROR(src.ReadAt(src.size() - 8 - footer_len, footer_len, &footer));
  ASSIGN_OR_RETURN(FileMetaData meta, ParseFileMetaData(footer, name));
  size_t row = 0;
  for (size_t g = 0; g < meta.row_groups.size(); ++g) {
    const RowGroup& rg = meta.row_groups[g];
    const std::string where = name + ": row group " + std::to_string(g);
    uint64_t bytes = 0, values = 0;
    for (const ColumnChunk& cc : rg.columns) {
      bytes += static_cast<uint64_t>(std::max<int64_t>(0, cc.total_uncompressed_size));
      values += static_cast<uint64_t>(std::max<int64_t>(0, cc.num_values));
    }
    if (bytes > kMaxParquetRowGroupBytes || values > kMaxParquetRowGroupValues) {
      return ResourceExhaustedError(where + " holds " + std::to_string(bytes) + " bytes and " +
                                    std::to_string(values) + " values, more than the " +
                                    std::to_string(kMaxParquetRowGroupBytes >> 20) + " MiB and " +
                                    std::to_string(kMaxParquetRowGroupValues) +
                                    " read at once; rewrite it with smaller row groups "
                                    "(pyarrow.parquet.write_table(..., row_group_size=N))");
    }
    std::vector<ColumnData> cols(rg.columns.size());
    for (size_t c = 0; c < rg.columns.size(); ++c) {
      const SchemaNode& leaf = meta.schema[meta.leaves[c]];
      RETURN_IF_ERROR(
          ReadColumn(src, rg.columns[c], leaf, &cols[c], where + ", column " + leaf.path));
    }
    Assembler a(meta, cols, where);
    for (int64_t r = 0; r < rg.num_rows; ++r) {
      ASSIGN_OR_RETURN(ojson record, a.Row());
      RETURN_IF_ERROR(each(++row, std::move(record)));
    }
    RETURN_IF_ERROR(a.Finish());
  }
  return OkStatus();
}

}  // namespace

bool HasParquetMagic(std::string_view head) { return head.substr(0, 4) == "PAR1"; }

Status ForEachParquetRowInBuffer(std::string_view bytes, const std::string& name,
                                 const ParquetRowFn& each) {
  return ReadFile(BufferByteSource(bytes), name, each);
}

Status ForEachParquetRow(const std::string& path, const ParquetRowFn& each) {
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(path, O_RDONLY | O_NONBLOCK, Access::kRead));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, path);
  return ReadFile(FileByteSource(std::move(fd), static_cast<uint64_t>(st.st_size), path), path,
                  each);
}

}  // namespace offloadd::text
