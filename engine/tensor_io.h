#pragma once
// Bridge between safetensors (engine/safetensors.h) and at::Tensor. Include from torch-linked code.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/safetensors.h"

namespace offloadd::engine {

StatusOr<c10::ScalarType> ToScalarType(DType dtype);
StatusOr<DType> ToDType(c10::ScalarType type);

// Copies one tensor out of a (memory-mapped) file into a new CPU tensor of its stored dtype.
StatusOr<at::Tensor> ReadTensor(const SafetensorsFile& file, const TensorInfo& info);

// Reads every tensor of a file (CPU copies).
StatusOr<std::map<std::string, at::Tensor>> LoadTensorFile(const std::string& path);
// Writes tensors (any device; copied to CPU contiguous) to a .safetensors file.
Status SaveTensorFile(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors);
// The same file's bytes, in memory.
StatusOr<std::string> EncodeTensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

}  // namespace offloadd::engine
