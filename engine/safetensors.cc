#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stack>
#include <utility>

#include "common/file.h"
#include "common/safe_path.h"

namespace offloadd::engine {
namespace {

using json = nlohmann::json;

struct DTypeRow {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeRow, 13> kDTypes = {{
    {DType::kBool, "BOOL", 1},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kI64, "I64", 8},
    {DType::kU64, "U64", 8},
}};

Status Bad(std::string_view origin, const std::string& what) {
  return InvalidArgumentError(std::string(origin) + ": invalid safetensors file: " + what);
}

// Parses the header JSON while rejecting duplicate keys at any depth (nlohmann keeps the last
// one silently; a duplicated tensor name must be an error, not a silent overwrite).
StatusOr<json> ParseUniqueKeys(std::string_view text, std::string_view origin) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  json j = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(origin, "header is not valid JSON");
  if (!duplicate.empty()) return Bad(origin, "duplicate key \"" + duplicate + "\" in header");
  return j;
}

bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const auto& row : kDTypes) {
    if (row.dtype == dtype) return row.name;
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (const auto& row : kDTypes) {
    if (row.name == name) return row.dtype;
  }
  return InvalidArgumentError("unsupported safetensors dtype \"" + std::string(name) + "\"");
}

size_t DTypeSize(DType dtype) {
  for (const auto& row : kDTypes) {
    if (row.dtype == dtype) return row.size;
  }
  return 0;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
    std::string_view text, uint64_t data_size, std::string_view origin,
    std::map<std::string, std::string>* metadata) {
  if (text.empty() || text.front() != '{') return Bad(origin, "header does not start with '{'");
  ASSIGN_OR_RETURN(json j, ParseUniqueKeys(text, origin));
  if (!j.is_object()) return Bad(origin, "header is not a JSON object");

  std::vector<TensorInfo> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad(origin, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return Bad(origin, "__metadata__ value for \"" + m.key() + "\" is not a string");
        }
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\"";
    if (name.empty()) return Bad(origin, "empty tensor name");
    if (!v.is_object()) return Bad(origin, where + " entry is not an object");
    for (auto f = v.begin(); f != v.end(); ++f) {
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets") {
        return Bad(origin, where + " has unknown field \"" + f.key() + "\"");
      }
    }
    TensorInfo info;
    info.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) return Bad(origin, where + " has no string dtype");
    auto parsed_dtype = ParseDType(dt->get<std::string>());
    if (!parsed_dtype.ok()) return Bad(origin, where + ": " + parsed_dtype.status().message());
    info.dtype = *parsed_dtype;

    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) return Bad(origin, where + " has no shape list");
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) {
        return Bad(origin, where + " shape has a non-integer or negative dimension");
      }
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || MulOverflow(numel, dim, &numel)) {
        return Bad(origin, where + " shape overflows");
      }
      info.shape.push_back(static_cast<int64_t>(dim));
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return Bad(origin, where + " data_offsets is not a pair of non-negative integers");
    }
    info.begin = (*off)[0].get<uint64_t>();
    info.end = (*off)[1].get<uint64_t>();
    if (info.begin > info.end) return Bad(origin, where + " data_offsets begin > end");
    if (info.end > data_size) {
      return Bad(origin, where + " data_offsets end " + std::to_string(info.end) +
                             " is past the data buffer (" + std::to_string(data_size) + " bytes)");
    }
    uint64_t nbytes = 0;
    if (MulOverflow(numel, DTypeSize(info.dtype), &nbytes) || nbytes != info.nbytes()) {
      return Bad(origin, where + " byte length " + std::to_string(info.nbytes()) +
                             " does not match dtype " + std::string(DTypeName(info.dtype)) +
                             " x shape");
    }
    out.push_back(std::move(info));
  }

  // Tensors must tile the buffer exactly: no overlaps, no holes, nothing left over.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : out) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < cursor) return Bad(origin, "tensor \"" + t->name + "\" overlaps another tensor");
    if (t->begin > cursor) {
      return Bad(origin, "hole in the data buffer before tensor \"" + t->name + "\"");
    }
    cursor = t->end;
  }
  if (cursor != data_size) {
    return Bad(origin, "data buffer has " + std::to_string(data_size - cursor) +
                           " trailing bytes not covered by any tensor");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // Confined to the allowed roots: a symlink in a model directory must not read elsewhere.
  ASSIGN_OR_RETURN(OwnedFd owned, OpenConfined(path, O_RDONLY, Access::kRead));
  int fd = owned.release();
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError(err, "stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Bad(path, "not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Bad(path, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte prefix");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) return ErrnoError(map_err, "mmap " + path);

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  const auto* bytes = static_cast<const std::byte*>(map);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return Bad(path, "header length " + std::to_string(header_len) + " exceeds the " +
                         std::to_string(kMaxSafetensorsHeaderBytes) + "-byte cap");
  }
  if (header_len > size - 8) {
    return Bad(path, "header length " + std::to_string(header_len) + " is past the end of the " +
                         std::to_string(size) + "-byte file");
  }
  std::string_view header(reinterpret_cast<const char*>(bytes + 8), header_len);
  f->data_start_ = bytes + 8 + header_len;
  ASSIGN_OR_RETURN(f->tensors_,
                   ParseSafetensorsHeader(header, size - 8 - header_len, path, &f->metadata_));
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->index_.emplace(f->tensors_[i].name, i);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const std::byte> SafetensorsFile::data(const TensorInfo& info) const {
  return {data_start_ + info.begin, info.nbytes()};
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  auto ck = std::make_unique<Checkpoint>();
  ck->dir_ = dir;
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  if (PathExists(index_path)) {
    ck->sharded_ = true;
    ASSIGN_OR_RETURN(std::string text, ReadFile(index_path));
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    const std::string& origin = index_path;
    if (index.is_discarded() || !index.is_object()) {
      return InvalidArgumentError(origin + ": not a JSON object");
    }
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object() || wm->empty()) {
      return InvalidArgumentError(origin + ": missing or empty \"weight_map\" object");
    }
    std::map<std::string, size_t> file_idx;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return InvalidArgumentError(origin + ": weight_map entry \"" + it.key() +
                                    "\" is not a file name");
      }
      const std::string file = it.value().get<std::string>();
      // Shards must be plain file names inside dir: no path traversal from a downloaded index.
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        return InvalidArgumentError(origin + ": weight_map entry \"" + it.key() +
                                    "\" names a file outside the checkpoint directory: \"" + file +
                                    "\"");
      }
      auto [pos, inserted] = file_idx.emplace(file, ck->files_.size());
      if (inserted) {
        ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(JoinPath(dir, file)));
        ck->files_.push_back(std::move(f));
        ck->file_names_.push_back(file);
      }
      const SafetensorsFile& shard = *ck->files_[pos->second];
      if (!shard.Find(it.key())) {
        return InvalidArgumentError(origin + ": tensor \"" + it.key() + "\" is mapped to " + file +
                                    " but that shard does not contain it");
      }
      ck->owner_.emplace(it.key(), pos->second);
    }
    // A tensor stored in a shard but absent from the map, or present in two shards, is ambiguous.
    for (size_t i = 0; i < ck->files_.size(); ++i) {
      for (const auto& t : ck->files_[i]->tensors()) {
        auto it = ck->owner_.find(t.name);
        if (it == ck->owner_.end()) {
          return InvalidArgumentError(origin + ": shard " + ck->file_names_[i] +
                                      " holds tensor \"" + t.name + "\" not listed in weight_map");
        }
        if (it->second != i) {
          return InvalidArgumentError(origin + ": tensor \"" + t.name + "\" appears in shards " +
                                      ck->file_names_[it->second] + " and " + ck->file_names_[i]);
        }
      }
    }
    return ck;
  }
  const std::string single = JoinPath(dir, "model.safetensors");
  if (!PathExists(single)) {
    return NotFoundError(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open(single));
  for (const auto& t : f->tensors()) ck->owner_.emplace(t.name, 0);
  ck->files_.push_back(std::move(f));
  ck->file_names_.push_back("model.safetensors");
  return ck;
}

StatusOr<Checkpoint::Entry> Checkpoint::Get(std::string_view name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    return NotFoundError(dir_ + ": checkpoint has no tensor \"" + std::string(name) + "\"");
  }
  const SafetensorsFile* f = files_[it->second].get();
  return Entry{f, f->Find(name)};
}

bool Checkpoint::Contains(std::string_view name) const { return owner_.count(name) > 0; }

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  for (const auto& [n, _] : owner_) names.push_back(n);
  return names;
}

StatusOr<std::string> Checkpoint::ShardOf(std::string_view name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    return NotFoundError(dir_ + ": checkpoint has no tensor \"" + std::string(name) + "\"");
  }
  return file_names_[it->second];
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// The padded header of a file holding `tensors` (in name order, returned in *order); errors name
// `where`.
StatusOr<std::string> BuildHeader(const std::string& where, const std::vector<TensorToWrite>& tensors,
                                  const std::map<std::string, std::string>& metadata,
                                  std::vector<const TensorToWrite*>* order) {
  for (const auto& t : tensors) order->push_back(&t);
  std::sort(order->begin(), order->end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < order->size(); ++i) {
    const TensorToWrite& t = *(*order)[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return InvalidArgumentError(where + ": invalid tensor name \"" + t.name + "\"");
    }
    if (i > 0 && (*order)[i - 1]->name == t.name) {
      return InvalidArgumentError(where + ": duplicate tensor name \"" + t.name + "\"");
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return InvalidArgumentError(where + ": negative dimension in \"" + t.name + "\"");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * DTypeSize(t.dtype) != t.data.size()) {
      return InvalidArgumentError(where + ": tensor \"" + t.name + "\" has " +
                                  std::to_string(t.data.size()) + " bytes, shape needs " +
                                  std::to_string(numel * DTypeSize(t.dtype)));
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// The 8-byte little-endian header length.
std::string LengthPrefix(uint64_t n) {
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return prefix;
}

}  // namespace

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> order;
  ASSIGN_OR_RETURN(const std::string text, BuildHeader(path, tensors, metadata, &order));
  // Atomic and durable, and never through a symlink planted at the name (common/safe_path.h).
  return WriteFileAtomically(path, [&](int fd) -> Status {
    const std::string prefix = LengthPrefix(text.size());
    RETURN_IF_ERROR(WriteAll(fd, prefix.data(), prefix.size(), path));
    RETURN_IF_ERROR(WriteAll(fd, text.data(), text.size(), path));
    for (const TensorToWrite* t : order) {
      RETURN_IF_ERROR(WriteAll(fd, t->data.data(), t->data.size(), path));
    }
    return OkStatus();
  });
}

StatusOr<std::string> EncodeSafetensors(const std::vector<TensorToWrite>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> order;
  ASSIGN_OR_RETURN(const std::string text, BuildHeader("safetensors", tensors, metadata, &order));
  std::string out = LengthPrefix(text.size()) + text;
  for (const TensorToWrite* t : order) out.append(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  return out;
}

}  // namespace offloadd::engine
