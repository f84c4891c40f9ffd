#pragma once
// Engine-internal: assembling a model's blocks from its ModelConfig. One decoder layer
// (engine/decoder_layer.cc) is built from the parts the config selects (engine/parts.h); the
// embedding and head are in engine/embedding_head.cc. A family is a config mapping (tensor names
// and part choices in ModelConfig), not a block of its own.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"

namespace offloadd::engine {

// Returns the tensor for `name`, checked against `shape`, in the load dtype.
using ParamLoader =
    std::function<StatusOr<at::Tensor>(const std::string& name, const std::vector<int64_t>& shape)>;

// [embedding, layer 0..N-1, head] with the checkpoint's tensor names (config.names, used as
// given: Model::Load applies a checkpoint's prefix such as GPT-2's "transformer.").
StatusOr<std::vector<std::unique_ptr<Block>>> BuildBlocks(const ModelConfig& config,
                                                          const ParamLoader& load);
// The tensors a micro-batch's layers share, once per micro-batch (Model::PrepareBatch's last
// step; mb has input_ids, position_ids and, when packed, segment_ids and docs on the compute
// device): RoPE tables (global and, with has_local_rope, local), and one document per row when
// soft-capping or a sliding window shorter than the sequence needs the document path unpacked.
void PrepareLayerInputs(const ModelConfig& config, c10::ScalarType dtype, MicroBatch* mb);
// Decoder layer `layer` alone (benchmarks).
StatusOr<std::unique_ptr<Block>> BuildDecoderLayer(const ModelConfig& config, int layer,
                                                   const ParamLoader& load);
// "norm: fused", "attention: aten (why)", ... for a decoder layer run on device/dtype at
// sequence length `seq` (the plan log); empty for other blocks.
std::vector<std::string> DescribeLayerParts(const Block& layer, c10::Device device,
                                            c10::ScalarType dtype, int64_t seq);

// Helper for builders: loads each (name, shape) into a Param list.
StatusOr<std::vector<Param>> LoadParams(
    const ParamLoader& load,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs);

}  // namespace offloadd::engine
