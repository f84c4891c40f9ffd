#include "engine/tensor_io.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "engine/torch_boundary.h"

namespace offloadd::engine {

StatusOr<c10::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return c10::kBool;
    case DType::kU8:
      return c10::kByte;
    case DType::kI8:
      return c10::kChar;
    case DType::kI16:
      return c10::kShort;
    case DType::kF16:
      return c10::kHalf;
    case DType::kBF16:
      return c10::kBFloat16;
    case DType::kI32:
      return c10::kInt;
    case DType::kF32:
      return c10::kFloat;
    case DType::kF64:
      return c10::kDouble;
    case DType::kI64:
      return c10::kLong;
    default:
      return UnimplementedError("no LibTorch dtype for safetensors " +
                                std::string(DTypeName(dtype)));
  }
}

StatusOr<DType> ToDType(c10::ScalarType type) {
  for (DType d : {DType::kBool, DType::kU8, DType::kI8, DType::kI16, DType::kF16, DType::kBF16,
                  DType::kI32, DType::kF32, DType::kF64, DType::kI64}) {
    auto t = ToScalarType(d);
    if (t.ok() && *t == type) return d;
  }
  return UnimplementedError(std::string("no safetensors dtype for ") + c10::toString(type));
}

StatusOr<at::Tensor> ReadTensor(const SafetensorsFile& file, const TensorInfo& info) {
  ASSIGN_OR_RETURN(c10::ScalarType type, ToScalarType(info.dtype));
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(type));
  auto bytes = file.data(info);
  if (static_cast<size_t>(t.nbytes()) != bytes.size()) {
    return InternalError(file.path() + ": size mismatch reading " + info.name);
  }
  // The mapping is not necessarily aligned for the element type; memcpy is.
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

StatusOr<std::map<std::string, at::Tensor>> LoadTensorFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  std::map<std::string, at::Tensor> out;
  for (const auto& info : file->tensors()) {
    ASSIGN_OR_RETURN(out[info.name], ReadTensor(*file, info));
  }
  return out;
}

namespace {

// CPU contiguous copies of `tensors` (kept alive in *keep) described for the safetensors writer.
Status ToWrite(const std::string& where, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
               std::vector<at::Tensor>* keep, std::vector<TensorToWrite>* items) {
  try {
    for (const auto& [name, t] : tensors) {
      if (!t.defined()) return InvalidArgumentError(where + ": tensor " + name + " is undefined");
      ASSIGN_OR_RETURN(DType d, ToDType(t.scalar_type()));
      at::Tensor c = t.to(at::kCPU).contiguous();
      keep->push_back(c);
      items->push_back({name,
                        d,
                        std::vector<int64_t>(c.sizes().begin(), c.sizes().end()),
                        {static_cast<const std::byte*>(c.data_ptr()), c.nbytes()}});
    }
  } catch (const std::exception& e) {
    return TorchErrorStatus(where, e);
  }
  return OkStatus();
}

}  // namespace

Status SaveTensorFile(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<at::Tensor> keep;
  std::vector<TensorToWrite> items;
  RETURN_IF_ERROR(ToWrite(path, tensors, &keep, &items));
  return WriteSafetensors(path, items);
}

StatusOr<std::string> EncodeTensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<at::Tensor> keep;
  std::vector<TensorToWrite> items;
  RETURN_IF_ERROR(ToWrite("safetensors", tensors, &keep, &items));
  return EncodeSafetensors(items);
}

}  // namespace offloadd::engine
