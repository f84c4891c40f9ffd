#include "daemon/jobs/unsupported_options.h"

#include <cstdint>
#include <string>

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

std::vector<FieldViolation> UnsupportedOptions(const v1::JobSpec& s) {
  std::vector<FieldViolation> out;

  // LSP gradient compression (learned sparse projections).
  if (s.compression().type() == v1::COMPRESSION_TYPE_LSP) {
    out.push_back({"compression.type", "lsp (learned sparse projections) is not implemented yet; use none"});
  }
  return out;
}

}  // namespace offloadd::daemon
