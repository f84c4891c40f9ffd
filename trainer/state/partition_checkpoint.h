#pragma once
// The one tensor of a layer in a checkpoint partition across hosts (docs/data_parallel.md,
// "Checkpoints per partition"): this host's slice of the layer's flat buffer. The names are
// unique across layers, as the checkpoint's index needs.
#include <string>

namespace offloadd::trainer {

inline std::string SliceName(int layer) { return "layer" + std::to_string(layer) + ".slice"; }

}  // namespace offloadd::trainer
