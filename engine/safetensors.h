#pragma once
// safetensors (https://github.com/huggingface/safetensors) reader and writer. No LibTorch here:
// tensors are exposed as raw little-endian byte spans plus dtype and shape; engine/tensor_bridge.h
// turns them into at::Tensor.
//
// File layout: u64 LE header length N, N bytes of JSON header
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data buffer; offsets are relative to its start.
//
// The reader is strict (it follows the Rust reference implementation's validation): header size
// capped, header must be a JSON object with unique keys, every dtype known, every shape a list of
// non-negative integers, dtype size x element count == byte length (overflow-checked), offsets in
// bounds, tensors neither overlapping nor leaving holes, buffer fully covered. Any violation is an
// INVALID_ARGUMENT / DATA_LOSS error whose message starts with the file path.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::engine {

enum class DType { kBool, kU8, kI8, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64 };

// "F32", "BF16", ... as written in safetensors headers.
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; INVALID_ARGUMENT for unknown names (F8 variants are not supported).
StatusOr<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType dtype);

// Largest JSON header accepted (same cap as the reference implementation).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets inside the data buffer
  uint64_t end = 0;
  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

// Parses and validates a header (the JSON text) against a data buffer of `data_size` bytes.
// `origin` names the file in error messages. Exposed for fuzz-style tests.
StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
    std::string_view json, uint64_t data_size, std::string_view origin,
    std::map<std::string, std::string>* metadata);

// One memory-mapped .safetensors file. Immutable after Open; thread-safe for concurrent reads.
// Spans returned by data() stay valid as long as the SafetensorsFile lives.
class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr if absent.
  const TensorInfo* Find(std::string_view name) const;
  std::span<const std::byte> data(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const std::byte* data_start_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, size_t, std::less<>> index_;
};

// A model checkpoint: either `dir/model.safetensors` or the shards listed by
// `dir/model.safetensors.index.json` ({"weight_map": {tensor: file}}). Every shard is opened and
// validated; a weight_map entry missing from its shard, a shard outside `dir`, or a tensor name
// present in two shards is an error. Thread-safe for concurrent reads after Open.
class Checkpoint {
 public:
  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  // NOT_FOUND naming the tensor and the directory if absent.
  StatusOr<Entry> Get(std::string_view name) const;
  bool Contains(std::string_view name) const;
  std::vector<std::string> Names() const;  // sorted
  // Shard file name (relative to dir) holding `name`; "model.safetensors" if not sharded.
  StatusOr<std::string> ShardOf(std::string_view name) const;
  bool sharded() const { return sharded_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::string> file_names_;
  std::map<std::string, size_t, std::less<>> owner_;  // tensor -> index in files_
};

// A tensor to write; `data` must hold exactly numel * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// Writes a .safetensors file atomically and durably (common/safe_path.h WriteFileAtomically: a
// hidden temporary file, fsync, rename, directory fsync). Header padded with spaces to a
// multiple of 8 bytes; tensors laid out in name order. Names must be unique and non-empty.
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
// The same file's bytes, in memory (for a file a caller writes itself, e.g. into a checkpoint).
StatusOr<std::string> EncodeSafetensors(const std::vector<TensorToWrite>& tensors,
                                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace offloadd::engine
