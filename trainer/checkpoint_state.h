#pragma once
// offloadd_state.json of a checkpoint (trainer/checkpoint.h): TrainerState to and from JSON, HF's
// trainer_state.json, and
// the "crc32c" map of per-file checksums. Internal to checkpoint.cc. Errors name `path` and the key.

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "trainer/checkpoint.h"

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

}  // namespace offloadd::trainer::checkpoint_internal
