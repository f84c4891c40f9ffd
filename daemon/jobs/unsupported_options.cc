#include "daemon/jobs/unsupported_options.h"

#include <cstdint>
#include <string>

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

std::vector<FieldViolation> UnsupportedOptions(const v1::JobSpec& s) {
  std::vector<FieldViolation> out;

  // Optimizer states resident on the GPU: the pipeline always updates them on the host.
  if (s.offload().offload_optimizer().device() == v1::OFFLOAD_DEVICE_NONE) {
    out.push_back({"offload.offload_optimizer.device",
                   "none (optimizer states on the GPU) is not implemented; use cpu or nvme"});
  }

  // LSP gradient compression (learned sparse projections).
  if (s.compression().type() == v1::COMPRESSION_TYPE_LSP) {
    out.push_back({"compression.type", "lsp (learned sparse projections) is not implemented yet; use none"});
  }
  return out;
}

}  // namespace offloadd::daemon
