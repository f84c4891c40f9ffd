#pragma once
// Engine-internal: builders for the concrete blocks of each architecture.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"

namespace offloadd::engine {

// Returns the tensor for `name`, checked against `shape`, in the load dtype.
using ParamLoader =
    std::function<StatusOr<at::Tensor>(const std::string& name, const std::vector<int64_t>& shape)>;

// [embedding, layers..., head] for Llama / Mistral / Qwen2 (HF names "model.*", "lm_head.weight").
StatusOr<std::vector<std::unique_ptr<Block>>> BuildLlamaBlocks(const ModelConfig& config,
                                                               const ParamLoader& load);
// Same for GPT-2; `prefix` is "transformer." or "" depending on how the checkpoint was saved.
StatusOr<std::vector<std::unique_ptr<Block>>> BuildGpt2Blocks(const ModelConfig& config,
                                                              const std::string& prefix,
                                                              const ParamLoader& load);

// Helper for builders: loads each (name, shape) into a Param list.
StatusOr<std::vector<Param>> LoadParams(
    const ParamLoader& load,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs);

}  // namespace offloadd::engine
