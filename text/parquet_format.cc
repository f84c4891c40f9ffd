#include "text/parquet_format.h"

#include <functional>

#include "text/thrift_compact.h"

namespace offloadd::text::parquet {

namespace {

constexpr int kMaxSchemaDepth = 16;
constexpr size_t kMaxSchemaNodes = 100000;

// ConvertedType and LogicalType members that the reader accepts or names.
enum Converted {
  kUtf8 = 0,
  kMap = 1,
  kMapKeyValue = 2,
  kList = 3,
  kEnum = 4,
  kUint8 = 11,
  kUint16 = 12,
  kUint32 = 13,
  kUint64 = 14,
  kInt8 = 15,
  kInt16 = 16,
  kInt32C = 17,
  kInt64C = 18,
  kJson = 19
};
enum Logical { kLString = 1, kLMap = 2, kLList = 3, kLEnum = 4, kLInteger = 10, kLJson = 12 };

const char* const kPhysical[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                 "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
const char* const kConverted[] = {"UTF8",
                                  "MAP",
                                  "MAP_KEY_VALUE",
                                  "LIST",
                                  "ENUM",
                                  "DECIMAL",
                                  "DATE",
                                  "TIME_MILLIS",
                                  "TIME_MICROS",
                                  "TIMESTAMP_MILLIS",
                                  "TIMESTAMP_MICROS",
                                  "UINT_8",
                                  "UINT_16",
                                  "UINT_32",
                                  "UINT_64",
                                  "INT_8",
                                  "INT_16",
                                  "INT_32",
                                  "INT_64",
                                  "JSON",
                                  "BSON",
                                  "INTERVAL"};
const char* const kLogical[] = {
    "?",       "STRING", "MAP",  "LIST", "ENUM", "DECIMAL", "DATE",    "TIME",     "TIMESTAMP", "?",
    "INTEGER", "NULL",   "JSON", "BSON", "UUID", "FLOAT16", "VARIANT", "GEOMETRY", "GEOGRAPHY"};

// Calls `field` for each field of the struct the reader is at; `field` reads or skips the value.
Status Fields(ThriftReader& t, const std::function<Status(int16_t, ThriftType)>& field) {
  RETURN_IF_ERROR(t.BeginStruct());
  while (true) {
    int16_t id;
    ThriftType ty;
    RETURN_IF_ERROR(t.ReadFieldHeader(&id, &ty));
    if (ty == ThriftType::kStop) break;
    RETURN_IF_ERROR(field(id, ty));
  }
  t.EndStruct();
  return OkStatus();
}

Status List(ThriftReader& t, ThriftType want, const std::function<Status()>& element) {
  uint32_t n;
  ThriftType et;
  RETURN_IF_ERROR(t.ReadListHeader(&n, &et));
  if (et != want) {
    for (uint32_t i = 0; i < n; ++i) RETURN_IF_ERROR(t.Skip(et));
    return DataLossError("a list of unexpected element type");
  }
  for (uint32_t i = 0; i < n; ++i) RETURN_IF_ERROR(element());
  return OkStatus();
}

Status I32(ThriftReader& t, ThriftType ty, int* out) {
  if (ty != ThriftType::kI32) return t.Skip(ty);
  int32_t v;
  RETURN_IF_ERROR(t.ReadI32(&v));
  *out = v;
  return OkStatus();
}

Status I64(ThriftReader& t, ThriftType ty, int64_t* out) {
  if (ty != ThriftType::kI64 && ty != ThriftType::kI32) return t.Skip(ty);
  return t.ReadI64(out);
}

Status ReadSchemaElement(ThriftReader& t, SchemaNode* n) {
  return Fields(t, [&](int16_t id, ThriftType ty) -> Status {
    switch (id) {
      case 1:
        return I32(t, ty, &n->type);
      case 3:
        return I32(t, ty, &n->repetition);
      case 4:
        return ty == ThriftType::kBinary ? t.ReadBinary(&n->name) : t.Skip(ty);
      case 5:
        return I32(t, ty, &n->num_children);
      case 6:
        return I32(t, ty, &n->converted);
      case 10:
        if (ty != ThriftType::kStruct) return t.Skip(ty);
        // A union: the member that is set is its one field.
        return Fields(t, [&](int16_t member, ThriftType mty) -> Status {
          n->logical = member;
          return t.Skip(mty);
        });
      default:
        return t.Skip(ty);
    }
  });
}

Status ReadColumnMetaData(ThriftReader& t, ColumnChunk* c) {
  return Fields(t, [&](int16_t id, ThriftType ty) -> Status {
    switch (id) {
      case 1:
        return I32(t, ty, &c->type);
      case 3:
        if (ty != ThriftType::kList) return t.Skip(ty);
        return List(t, ThriftType::kBinary, [&]() -> Status {
          std::string part;
          RETURN_IF_ERROR(t.ReadBinary(&part));
          c->path += (c->path.empty() ? "" : ".") + part;
          return OkStatus();
        });
      case 4:
        return I32(t, ty, &c->codec);
      case 5:
        return I64(t, ty, &c->num_values);
      case 6:
        return I64(t, ty, &c->total_uncompressed_size);
      case 7:
        return I64(t, ty, &c->total_compressed_size);
      case 9:
        return I64(t, ty, &c->data_page_offset);
      case 11:
        return I64(t, ty, &c->dictionary_page_offset);
      default:
        return t.Skip(ty);
    }
  });
}

Status ReadColumnChunk(ThriftReader& t, ColumnChunk* c, bool* external, bool* encrypted) {
  return Fields(t, [&](int16_t id, ThriftType ty) -> Status {
    if (id == 1 && ty == ThriftType::kBinary) {
      std::string file;
      RETURN_IF_ERROR(t.ReadBinary(&file));
      *external = !file.empty();
      return OkStatus();
    }
    if (id == 3 && ty == ThriftType::kStruct) return ReadColumnMetaData(t, c);
    if (id == 8 || id == 9) *encrypted = true;
    return t.Skip(ty);
  });
}

std::string TypeName(const SchemaNode& n) {
  std::string s = n.IsLeaf() ? (n.type >= 0 && n.type < 8 ? kPhysical[n.type]
                                                          : "type " + std::to_string(n.type))
                             : "group";
  if (n.logical >= 0) {
    s += std::string(" (") +
         (n.logical < 19 ? kLogical[n.logical] : "logical type " + std::to_string(n.logical)) + ")";
  } else if (n.converted >= 0) {
    s += std::string(" (") +
         (n.converted < 22 ? kConverted[n.converted]
                           : "converted type " + std::to_string(n.converted)) +
         ")";
  }
  return s;
}

class SchemaBuilder {
 public:
  SchemaBuilder(FileMetaData& m, const std::string& name) : m_(m), name_(name) {}

  Status Build() {
    if (m_.schema.empty()) return DataLossError(name_ + ": the Parquet schema is empty");
    size_t next = 1;
    RETURN_IF_ERROR(Link(0, &next, 0));
    if (next != m_.schema.size())
      return DataLossError(name_ + ": the Parquet schema has stray elements");
    m_.schema[0].max_def = m_.schema[0].max_rep = 0;
    for (int c : m_.schema[0].children) {
      RETURN_IF_ERROR(Levels(c, m_.schema[0], ""));
      RETURN_IF_ERROR(Check(c, /*element_of_list=*/false));
    }
    if (m_.leaves.empty()) return DataLossError(name_ + ": the Parquet schema has no columns");
    m_.schema[0].first_leaf = 0;
    m_.schema[0].leaves = static_cast<int>(m_.leaves.size());
    return OkStatus();
  }

 private:
  Status Refuse(const SchemaNode& n, const std::string& why) const {
    return UnimplementedError(name_ + ": column \"" + n.path + "\" of type " + TypeName(n) + ": " +
                              why);
  }

  Status Link(size_t at, size_t* next, int depth) {
    if (depth > kMaxSchemaDepth)
      return DataLossError(name_ + ": the Parquet schema nests too deep");
    const int n = m_.schema[at].num_children;
    if (n < 0 || static_cast<size_t>(n) > m_.schema.size() - *next) {
      return DataLossError(name_ + ": the Parquet schema's child counts run past its elements");
    }
    if (at != 0 && n == 0 && m_.schema[at].type < 0) {
      return DataLossError(name_ + ": schema element \"" + m_.schema[at].name +
                           "\" has neither a type nor children");
    }
    if (n > 0) m_.schema[at].type = -1;  // a group
    for (int i = 0; i < n; ++i) {
      // Checked per child: the earlier children's subtrees took elements too.
      if (*next >= m_.schema.size()) {
        return DataLossError(name_ + ": the Parquet schema's child counts run past its elements");
      }
      const size_t child = (*next)++;
      m_.schema[at].children.push_back(static_cast<int>(child));
      RETURN_IF_ERROR(Link(child, next, depth + 1));
    }
    return OkStatus();
  }

  Status Levels(int i, const SchemaNode& parent, const std::string& prefix) {
    SchemaNode& n = m_.schema[i];
    if (n.repetition < 0 || n.repetition > 2)
      return DataLossError(name_ + ": bad repetition of \"" + n.name + "\"");
    n.path = prefix.empty() ? n.name : prefix + "." + n.name;
    n.max_def = parent.max_def + (n.repetition != kRequired ? 1 : 0);
    n.max_rep = parent.max_rep + (n.repetition == kRepeated ? 1 : 0);
    n.first_leaf = static_cast<int>(m_.leaves.size());
    if (n.IsLeaf()) m_.leaves.push_back(i);
    const std::string path = n.path;
    const std::vector<int> children = n.children;  // m_.schema does not grow: references stay
    for (int c : children) RETURN_IF_ERROR(Levels(c, m_.schema[i], path));
    m_.schema[i].leaves = static_cast<int>(m_.leaves.size()) - m_.schema[i].first_leaf;
    if (m_.schema[i].leaves == 0) return Refuse(m_.schema[i], "a group without columns");
    return OkStatus();
  }

  Status CheckLeaf(SchemaNode& n) {
    const bool plain = n.converted < 0 && n.logical < 0;
    switch (n.type) {
      case kBoolean:
      case kFloat:
      case kDouble:
        if (plain) return OkStatus();
        break;
      case kInt32:
        if (n.converted == kUint8 || n.converted == kUint16 || n.converted == kUint32) {
          n.unsigned_int = true;
          return OkStatus();
        }
        if ((n.converted < 0 || n.converted == kInt8 || n.converted == kInt16 ||
             n.converted == kInt32C) &&
            (n.logical < 0 || n.logical == kLInteger)) {
          return OkStatus();
        }
        break;
      case kInt64:
        if ((n.converted < 0 || n.converted == kInt64C) &&
            (n.logical < 0 || n.logical == kLInteger))
          return OkStatus();
        break;
      case kByteArray:
        if (n.converted == kUtf8 || n.converted == kEnum || n.converted == kJson ||
            n.logical == kLString || n.logical == kLEnum || n.logical == kLJson) {
          return OkStatus();
        }
        return Refuse(
            n, "binary data is not read (strings are: BYTE_ARRAY annotated STRING, ENUM or JSON)");
      default:
        break;
    }
    return Refuse(
        n,
        "not read (datasets are read with strings, integers, floats, booleans, structs and lists "
        "of them)");
  }

  // `element_of_list`: n is a LIST's element (it may be the repeated node itself, 2-level lists).
  Status Check(int i, bool element_of_list) {
    SchemaNode& n = m_.schema[i];
    if (n.repetition == kRepeated && !element_of_list) {
      return Refuse(n, "a repeated field outside a LIST-annotated group is not read");
    }
    if (n.IsLeaf()) return CheckLeaf(n);
    if (n.converted == kMap || n.converted == kMapKeyValue || n.logical == kLMap) {
      return Refuse(n, "maps are not read");
    }
    if (n.converted == kList || n.logical == kLList) {
      if (n.children.size() != 1 || m_.schema[n.children[0]].repetition != kRepeated) {
        return Refuse(n, "a LIST group must hold exactly one repeated field");
      }
      const int r = n.children[0];
      const SchemaNode& rn = m_.schema[r];
      // parquet-format's LogicalTypes.md, backward-compatibility rules for the element.
      int e = r;
      if (!rn.IsLeaf() && rn.children.size() == 1 && rn.name != "array" &&
          rn.name != n.name + "_tuple") {
        e = rn.children[0];
      }
      if (m_.schema[e].max_rep != 1 || n.max_rep != 0)
        return Refuse(n, "lists nested in lists are not read");
      n.list_repeated = r;
      n.list_element = e;
      return Check(e, /*element_of_list=*/true);
    }
    for (int c : std::vector<int>(n.children)) RETURN_IF_ERROR(Check(c, false));
    return OkStatus();
  }

  FileMetaData& m_;
  const std::string& name_;
};

}  // namespace

std::string CodecName(int codec) {
  static const char* const kNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                       "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  return codec >= 0 && codec < 8 ? kNames[codec] : "codec " + std::to_string(codec);
}

std::string EncodingName(int encoding) {
  static const char* const kNames[] = {
      "PLAIN",          "GROUP_VAR_INT",       "PLAIN_DICTIONARY",        "RLE",
      "BIT_PACKED",     "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
  return encoding >= 0 && encoding < 10 ? kNames[encoding] : "encoding " + std::to_string(encoding);
}

StatusOr<FileMetaData> ParseFileMetaData(std::string_view footer, const std::string& name) {
  FileMetaData m;
  ThriftReader t(footer, name + ": Parquet footer");
  bool external = false, encrypted = false;
  RETURN_IF_ERROR(Fields(t, [&](int16_t id, ThriftType ty) -> Status {
                    if (id == 2 && ty == ThriftType::kList) {
                      return List(t, ThriftType::kStruct, [&]() -> Status {
                        if (m.schema.size() >= kMaxSchemaNodes)
                          return DataLossError("too many schema elements");
                        m.schema.emplace_back();
                        return ReadSchemaElement(t, &m.schema.back());
                      });
                    }
                    if (id == 3) return I64(t, ty, &m.num_rows);
                    if (id == 4 && ty == ThriftType::kList) {
                      return List(t, ThriftType::kStruct, [&]() -> Status {
                        RowGroup& g = m.row_groups.emplace_back();
                        return Fields(t, [&](int16_t gid, ThriftType gty) -> Status {
                          if (gid == 1 && gty == ThriftType::kList) {
                            return List(t, ThriftType::kStruct, [&]() -> Status {
                              return ReadColumnChunk(t, &g.columns.emplace_back(), &external,
                                                     &encrypted);
                            });
                          }
                          if (gid == 3) return I64(t, gty, &g.num_rows);
                          return t.Skip(gty);
                        });
                      });
                    }
                    return t.Skip(ty);
                  }).WithContext(name + ": Parquet footer"));
  if (external) return UnimplementedError(name + ": column chunks in other files are not read");
  if (encrypted) return UnimplementedError(name + ": encrypted columns are not read");
  RETURN_IF_ERROR(SchemaBuilder(m, name).Build());
  for (size_t g = 0; g < m.row_groups.size(); ++g) {
    const RowGroup& rg = m.row_groups[g];
    const std::string where = name + ": row group " + std::to_string(g);
    if (rg.num_rows < 0) return DataLossError(where + ": negative row count");
    if (rg.columns.size() != m.leaves.size()) {
      return DataLossError(where + " has " + std::to_string(rg.columns.size()) +
                           " columns, the schema " + std::to_string(m.leaves.size()));
    }
    for (size_t c = 0; c < rg.columns.size(); ++c) {
      const SchemaNode& leaf = m.schema[m.leaves[c]];
      if (rg.columns[c].path != leaf.path || rg.columns[c].type != leaf.type) {
        return DataLossError(where + ": column " + std::to_string(c) + " (\"" + rg.columns[c].path +
                             "\") does not match the schema's \"" + leaf.path + "\"");
      }
      if (rg.columns[c].num_values < rg.num_rows) {
        return DataLossError(where + ", column " + leaf.path + ": fewer values than rows");
      }
    }
  }
  return m;
}

}  // namespace offloadd::text::parquet
