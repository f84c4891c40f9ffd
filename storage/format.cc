#include "storage/format.h"

#include <algorithm>
#include <cstring>

#include "storage/crc32c.h"

namespace offloadd::storage {
namespace {

constexpr uint64_t kIdentityMagic = 0x3152545344464c4full;  // "OLFDSTR1"
constexpr size_t kFrame = 12;

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  template <typename T>
  void Put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86_64, aarch64)
    out_->insert(out_->end(), b, b + sizeof(T));
  }

 private:
  std::vector<uint8_t>* out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

bool DecodeEntry(Reader& r, ManifestEntry* e) {
  uint32_t type;
  if (!r.Get(&type)) return false;
  TensorRecord& rec = e->record;
  if (!r.Get(&rec.key.layer) || !r.Get(&rec.key.kind) || !r.Get(&rec.key.part) ||
      !r.Get(&rec.version)) {
    return false;
  }
  if (type == static_cast<uint32_t>(RecordType::kDrop)) {
    e->type = RecordType::kDrop;
    return true;
  }
  if (type != static_cast<uint32_t>(RecordType::kCommit)) return false;
  e->type = RecordType::kCommit;
  uint32_t n;
  if (!r.Get(&rec.size) || !r.Get(&rec.chunk_bytes) || !r.Get(&n) || n > 65536) return false;
  rec.extents.resize(n);
  for (auto& x : rec.extents) {
    if (!r.Get(&x.dir) || !r.Get(&x.offset) || !r.Get(&x.length)) return false;
  }
  if (!r.Get(&n) || n > kMaxRecordPayload / 6) return false;
  rec.chunks.resize(n);
  for (auto& c : rec.chunks) {
    if (!r.Get(&c.dir) || !r.Get(&c.crc)) return false;
  }
  return true;
}

bool DecodePayload(std::span<const uint8_t> payload, std::vector<ManifestEntry>* out) {
  Reader r(payload);
  uint32_t count;
  if (!r.Get(&count) || count == 0 || count > payload.size()) return false;
  for (uint32_t i = 0; i < count; ++i) {
    ManifestEntry e;
    if (!DecodeEntry(r, &e)) return false;
    if (out != nullptr) out->push_back(std::move(e));
  }
  return r.done();
}

// Returns the length of a well-formed frame at `pos` (appending its entries to `out`), or 0.
size_t ValidFrameAt(std::span<const uint8_t> image, size_t pos, std::vector<ManifestEntry>* out) {
  if (image.size() - pos < kFrame) return 0;
  uint32_t magic, len, crc;
  std::memcpy(&magic, image.data() + pos, 4);
  std::memcpy(&len, image.data() + pos + 4, 4);
  std::memcpy(&crc, image.data() + pos + 8, 4);
  if (magic != kRecordMagic || len > kMaxRecordPayload || image.size() - pos - kFrame < len)
    return 0;
  auto payload = image.subspan(pos + kFrame, len);
  if (Crc32c(0, payload.data(), payload.size()) != crc) return 0;
  std::vector<ManifestEntry> entries;
  if (!DecodePayload(payload, &entries)) return 0;
  if (out != nullptr) {
    for (auto& e : entries) out->push_back(std::move(e));
  }
  return kFrame + len;
}

}  // namespace

std::string TensorKindName(uint32_t kind) {
  switch (static_cast<TensorKind>(kind)) {
    case TensorKind::kOther:
      return "other";
    case TensorKind::kParamFp32:
      return "param_fp32";
    case TensorKind::kAdamM:
      return "adam_m";
    case TensorKind::kAdamV:
      return "adam_v";
    case TensorKind::kParamHalf:
      return "param_half";
    case TensorKind::kGradient:
      return "gradient";
    case TensorKind::kActivation:
      return "activation";
  }
  return "kind " + std::to_string(kind);
}

std::string KeyString(const TensorKey& key) {
  return "(layer " + std::to_string(key.layer) + ", " + TensorKindName(key.kind) + ", part " +
         std::to_string(key.part) + ")";
}

uint64_t TensorRecord::chunk_len(size_t i) const {
  const uint64_t start = i * uint64_t{chunk_bytes};
  return std::min<uint64_t>(chunk_bytes, size - start);
}

std::vector<uint64_t> TensorRecord::ChunkOffsets() const {
  size_t n_dirs = 0;
  for (const auto& x : extents) n_dirs = std::max<size_t>(n_dirs, x.dir + 1u);
  for (const auto& c : chunks) n_dirs = std::max<size_t>(n_dirs, c.dir + 1u);
  std::vector<uint64_t> next_slot(n_dirs, 0);
  std::vector<uint64_t> base(n_dirs, UINT64_MAX);
  for (const auto& x : extents) base[x.dir] = x.offset;
  std::vector<uint64_t> out(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    out[i] = base[chunks[i].dir] + next_slot[chunks[i].dir]++ * chunk_bytes;
  }
  return out;
}

Status TensorRecord::Validate(size_t n_dirs) const {
  const std::string what = "record of " + KeyString(key) + " version " + std::to_string(version);
  if (chunk_bytes == 0 || chunk_bytes % kAlign != 0) {
    return DataLossError(what + ": chunk_bytes " + std::to_string(chunk_bytes) +
                         " not 4 KiB aligned");
  }
  // Not (size + chunk_bytes - 1) / chunk_bytes: that wraps for sizes near 2^64 (fuzz regression
  // store_format/commit-size-overflows-chunk-count).
  const uint64_t n = size / chunk_bytes + (size % chunk_bytes != 0 ? 1 : 0);
  if (n != chunks.size()) {
    return DataLossError(what + ": " + std::to_string(chunks.size()) + " chunks for " +
                         std::to_string(size) + " bytes");
  }
  std::vector<uint64_t> slots(n_dirs, 0), room(n_dirs, 0);
  std::vector<bool> seen(n_dirs, false);
  for (const auto& x : extents) {
    uint64_t end;
    if (x.dir >= n_dirs || seen[x.dir] || x.offset % kAlign != 0 ||
        __builtin_add_overflow(x.offset, x.length, &end)) {
      return DataLossError(what + ": bad extent for directory index " + std::to_string(x.dir));
    }
    seen[x.dir] = true;
    room[x.dir] = x.length;
  }
  for (const auto& c : chunks) {
    if (c.dir >= n_dirs || !seen[c.dir]) {
      return DataLossError(what + ": chunk on directory index " + std::to_string(c.dir) +
                           " without an extent there");
    }
    ++slots[c.dir];
  }
  for (size_t d = 0; d < n_dirs; ++d) {
    if (slots[d] * chunk_bytes > room[d]) {
      return DataLossError(what + ": extent on directory index " + std::to_string(d) +
                           " smaller than its chunks");
    }
  }
  return OkStatus();
}

void EncodeEntry(const ManifestEntry& entry, std::vector<uint8_t>* out) {
  Writer w(out);
  const TensorRecord& rec = entry.record;
  w.Put(static_cast<uint32_t>(entry.type));
  w.Put(rec.key.layer);
  w.Put(rec.key.kind);
  w.Put(rec.key.part);
  w.Put(rec.version);
  if (entry.type == RecordType::kCommit) {
    w.Put(rec.size);
    w.Put(rec.chunk_bytes);
    w.Put(static_cast<uint32_t>(rec.extents.size()));
    for (const auto& x : rec.extents) {
      w.Put(x.dir);
      w.Put(x.offset);
      w.Put(x.length);
    }
    w.Put(static_cast<uint32_t>(rec.chunks.size()));
    for (const auto& c : rec.chunks) {
      w.Put(c.dir);
      w.Put(c.crc);
    }
  }
}

void EncodeFrame(std::span<const std::vector<uint8_t>> entries, std::vector<uint8_t>* out) {
  std::vector<uint8_t> payload;
  Writer w(&payload);
  w.Put(static_cast<uint32_t>(entries.size()));
  for (const auto& e : entries) payload.insert(payload.end(), e.begin(), e.end());
  Writer f(out);
  f.Put(kRecordMagic);
  f.Put(static_cast<uint32_t>(payload.size()));
  f.Put(Crc32c(0, payload.data(), payload.size()));
  out->insert(out->end(), payload.begin(), payload.end());
}

void EncodeRecord(const ManifestEntry& entry, std::vector<uint8_t>* out) {
  std::vector<uint8_t> e;
  EncodeEntry(entry, &e);
  EncodeFrame({&e, 1}, out);
}

StatusOr<ReplayResult> ReplayManifest(std::span<const uint8_t> image) {
  ReplayResult result;
  size_t pos = 0;
  while (pos < image.size()) {
    const size_t n = ValidFrameAt(image, pos, &result.entries);
    if (n == 0) break;
    pos += n;
  }
  result.valid_bytes = pos;
  if (pos < image.size()) {
    // Anything valid after the bad spot means the damage is not an interrupted final append.
    for (size_t scan = pos + 1; scan + kFrame <= image.size(); ++scan) {
      uint32_t magic;
      std::memcpy(&magic, image.data() + scan, 4);
      if (magic == kRecordMagic && ValidFrameAt(image, scan, nullptr) != 0) {
        return DataLossError("manifest record at byte " + std::to_string(pos) +
                             " is corrupt but a valid record follows at byte " +
                             std::to_string(scan) +
                             "; refusing to truncate committed history (restore the manifest "
                             "from backup or move it aside to inspect)");
      }
    }
    result.torn_tail = true;
  }
  return result;
}

std::vector<uint8_t> EncodeIdentity(const StoreIdentity& id) {
  std::vector<uint8_t> out;
  Writer w(&out);
  w.Put(kIdentityMagic);
  w.Put(kFormatVersion);
  w.Put(id.dir_index);
  w.Put(id.dir_count);
  for (uint8_t b : id.uuid) w.Put(b);
  w.Put(Crc32c(0, out.data(), out.size()));
  return out;
}

StatusOr<StoreIdentity> DecodeIdentity(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  uint64_t magic = 0;
  uint32_t version = 0;
  StoreIdentity id;
  if (!r.Get(&magic) || magic != kIdentityMagic) {
    return FailedPreconditionError("not an offloadd store identity file (bad magic)");
  }
  if (!r.Get(&version) || version != kFormatVersion) {
    return FailedPreconditionError("store format version " + std::to_string(version) +
                                   " but this binary reads version " +
                                   std::to_string(kFormatVersion));
  }
  if (!r.Get(&id.dir_index) || !r.Get(&id.dir_count))
    return DataLossError("truncated identity file");
  for (uint8_t& b : id.uuid) {
    if (!r.Get(&b)) return DataLossError("truncated identity file");
  }
  const size_t body = 8 + 4 + 4 + 4 + 16;
  uint32_t crc;
  if (!r.Get(&crc) || crc != Crc32c(0, bytes.data(), body)) {
    return DataLossError("identity file checksum mismatch");
  }
  return id;
}

}  // namespace offloadd::storage
