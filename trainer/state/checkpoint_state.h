#pragma once
// offloadd_state.json of a checkpoint (trainer/state/checkpoint.h): TrainerState to and from JSON,
// HF's trainer_state.json, and the "crc32c" map of per-file checksums. Internal to checkpoint.cc.
// Errors name `path` and the key.

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "trainer/state/checkpoint.h"

namespace offloadd::trainer::checkpoint_internal {

// The state plus the layer count and {file name: bytes}; doubles round-trip exactly (NaN and
// infinities as Python's json module writes them).
nlohmann::json StateToJson(const TrainerState& s, int num_layers,
                           const std::map<std::string, uint64_t>& files);
Status StateFromJson(const nlohmann::json& j, const std::string& path, TrainerState* s,
                     int* num_layers, std::map<std::string, uint64_t>* files);

// Hugging Face's trainer_state.json (transformers' TrainerState fields, no others) for `s`.
nlohmann::json HfStateToJson(const TrainerState& s);

// "crc32c": {file: "8 hex digits"}, which must cover exactly `files`. Absent in checkpoints
// written before checksums existed: `crcs` stays empty then.
Status ChecksumsFromJson(const nlohmann::json& j, const std::string& path,
                         const std::map<std::string, uint64_t>& files,
                         std::map<std::string, uint32_t>* crcs);

// checkpoint.cc's file helpers, shared with checkpoint_compact.cc (the compact modes' states).
std::string LayerFile(const char* kind, int layer);  // "optimizer-layer-00003.safetensors"
// Creates `name` in the directory `dirfd` (never through a symlink), writes the chunks, fsyncs,
// and returns their crc32c; removes the file on failure.
StatusOr<uint32_t> WriteSyncedFile(int dirfd, const std::string& name, const std::string& path,
                                   const std::vector<std::span<const std::byte>>& chunks);
struct HeaderEntry {
  std::string name;
  const std::vector<int64_t>* shape;
  const char* dtype = "F32";
  uint64_t element_bytes = sizeof(float);
};
// A safetensors header (length and JSON, padded to 8) for tensors laid out back to back.
std::string SafetensorsPrefix(const std::vector<HeaderEntry>& entries,
                              const std::map<std::string, std::string>& metadata);
std::span<const std::byte> Bytes(std::string_view s);

}  // namespace offloadd::trainer::checkpoint_internal
