#include "daemon/jobs/unsupported_options.h"

#include <cstdint>
#include <string>

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

std::vector<FieldViolation> UnsupportedOptions(const v1::JobSpec& s) {
  // Every setting of the spec acts today. LSP compression's one limit (nodes without a GPU) depends
  // on the node and is checked by the validator.
  (void)s;
  return {};
}

}  // namespace offloadd::daemon
