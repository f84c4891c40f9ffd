#include "daemon/jobs/unsupported_options.h"

#include <cstdint>
#include <map>
#include <string>

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

std::vector<FieldViolation> UnsupportedOptions(const v1::JobSpec& s) {
  std::vector<FieldViolation> out;

  // fp16 compute needs dynamic loss scaling.
  if (s.model().compute_dtype() == v1::COMPUTE_DTYPE_FP16) {
    out.push_back({"model.compute_dtype", "fp16 (dynamic loss scaling) is not implemented yet; use bf16"});
  }

  // Optimizer states resident on the GPU: the pipeline always updates them on the host.
  if (s.offload().offload_optimizer().device() == v1::OFFLOAD_DEVICE_NONE) {
    out.push_back({"offload.offload_optimizer.device",
                   "none (optimizer states on the GPU) is not implemented; use cpu or nvme"});
  }

  // Activations offloaded to NVMe, for every layer or per layer.
  const char* kNvmeActivations = "offload_nvme is not implemented yet; use offload_cpu or recompute";
  if (s.offload().activations().mode() == v1::ACTIVATION_MODE_OFFLOAD_NVME) {
    out.push_back({"offload.activations.mode", kNvmeActivations});
  }
  // Protobuf maps iterate in no fixed order: sorted, so messages are stable.
  const auto& overrides = s.offload().activations().layer_overrides();
  for (const auto& [layer, mode] : std::map<int32_t, v1::ActivationMode>(overrides.begin(), overrides.end())) {
    if (mode == v1::ACTIVATION_MODE_OFFLOAD_NVME) {
      out.push_back({"offload.activations.layer_overrides[" + std::to_string(layer) + "]", kNvmeActivations});
    }
  }

  // LSP gradient compression (learned sparse projections).
  if (s.compression().type() == v1::COMPRESSION_TYPE_LSP) {
    out.push_back({"compression.type", "lsp (learned sparse projections) is not implemented yet; use none"});
  }
  return out;
}

}  // namespace offloadd::daemon
