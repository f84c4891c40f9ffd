#pragma once
// On-disk format of a store (all integers little-endian). See storage/README.md for the prose.
//
// Each store directory holds:
//   STORE     identity: magic, format version, store uuid, this directory's index and the count.
//             Written once (tmp + rename + fsync of the directory), flock()ed while a store runs.
//   data      one file of 4 KiB-aligned extents holding chunk payloads, read and written with
//             O_DIRECT. Extents of committed versions are never handed out again until a newer
//             version of the same key has committed and no read still uses them.
// Directory 0 also holds:
//   MANIFEST  an append-only log of records (the commit point). A version is committed exactly
//             when its record is durable in the manifest; the log replays in order at open.
//
// Frame: u32 magic "OFMR" | u32 payload_len | u32 crc32c(payload) | payload, where payload is
// u32 count | count entries. Each manifest append (one group commit) is exactly one frame, so a
// crash mid-append can only damage the last frame, whatever order its pages reached the disk.
// Entry of a commit: u32 type=1 | u32 layer | u32 kind | u32 part | u64 version | u64 size |
//   u32 chunk_bytes | u32 n_extents | n_extents x (u16 dir, u64 offset, u64 length) |
//   u32 n_chunks | n_chunks x (u16 dir, u32 crc32c of the chunk's payload bytes).
// Entry of a drop: u32 type=2 | u32 layer | u32 kind | u32 part | u64 version.
// Chunk i covers tensor bytes [i*chunk_bytes, min(size, (i+1)*chunk_bytes)) and lives in its
// directory's extent at slot k*chunk_bytes, k = number of earlier chunks on the same directory.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::storage {

inline constexpr uint64_t kAlign = 4096;  // O_DIRECT alignment of offsets, lengths and buffers
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint32_t kRecordMagic = 0x524d464f;  // "OFMR"
inline constexpr uint32_t kMaxRecordPayload = 64u << 20;
inline constexpr char kStoreFileName[] = "STORE";
inline constexpr char kDataFileName[] = "data";
inline constexpr char kManifestFileName[] = "MANIFEST";

// Read the last committed version, whatever it is.
inline constexpr uint64_t kLatestVersion = UINT64_MAX;

inline uint64_t AlignUp(uint64_t v, uint64_t a = kAlign) { return (v + a - 1) / a * a; }

// What a tensor is. Values are stored on disk: append, never renumber.
enum class TensorKind : uint32_t {
  kOther = 0,
  kParamFp32 = 1,  // fp32 master weights
  kAdamM = 2,      // Adam first moment
  kAdamV = 3,      // Adam second moment
  kParamHalf = 4,  // fp16/bf16 working copy of the weights
  kGradient = 5,
  kActivation = 6,
};
std::string TensorKindName(uint32_t kind);

// A tensor's address: (layer, kind) plus `part` for layers split into several tensors.
struct TensorKey {
  uint32_t layer = 0;
  uint32_t kind = 0;  // a TensorKind value (other values are accepted and printed as numbers)
  uint32_t part = 0;
  friend auto operator<=>(const TensorKey&, const TensorKey&) = default;
};
// "(layer 3, adam_m, part 0)"
std::string KeyString(const TensorKey& key);

struct DirExtent {
  uint16_t dir = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct ChunkRef {
  uint16_t dir = 0;
  uint32_t crc = 0;
};

// One committed (or being written) version of a tensor and where its bytes are.
struct TensorRecord {
  TensorKey key;
  uint64_t version = 0;
  uint64_t size = 0;
  uint32_t chunk_bytes = 0;
  std::vector<DirExtent> extents;  // at most one per directory
  std::vector<ChunkRef> chunks;

  uint64_t chunk_len(size_t i) const;
  // Computes chunk i's file offset in its directory's data file (derived, not stored).
  std::vector<uint64_t> ChunkOffsets() const;
  // Checks internal consistency (chunk count, slots inside extents, directory indexes).
  Status Validate(size_t n_dirs) const;
};

enum class RecordType : uint32_t { kCommit = 1, kDrop = 2 };

struct ManifestEntry {
  RecordType type = RecordType::kCommit;
  TensorRecord record;  // for kDrop only key and version are meaningful
};

// Appends the encoding of one entry (unframed) to `out`.
void EncodeEntry(const ManifestEntry& entry, std::vector<uint8_t>* out);
// Appends one frame holding the given encoded entries to `out`.
void EncodeFrame(std::span<const std::vector<uint8_t>> entries, std::vector<uint8_t>* out);
// A frame with one entry.
void EncodeRecord(const ManifestEntry& entry, std::vector<uint8_t>* out);

struct ReplayResult {
  std::vector<ManifestEntry> entries;
  uint64_t valid_bytes = 0;  // length of the well-formed prefix
  bool torn_tail = false;    // bytes after valid_bytes are an incomplete last append
};
// Parses a manifest image. A bad frame followed by no valid frame is a torn tail (an append
// interrupted by a crash): reported, not an error. A bad frame followed by valid ones is
// corruption and fails with DATA_LOSS naming the offset, because truncating would drop commits.
StatusOr<ReplayResult> ReplayManifest(std::span<const uint8_t> image);

struct StoreIdentity {
  uint8_t uuid[16] = {};
  uint32_t dir_index = 0;
  uint32_t dir_count = 0;
};
std::vector<uint8_t> EncodeIdentity(const StoreIdentity& id);
StatusOr<StoreIdentity> DecodeIdentity(std::span<const uint8_t> bytes);

}  // namespace offloadd::storage
