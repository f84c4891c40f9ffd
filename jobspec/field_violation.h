#pragma once
// One problem of a JobSpec: its field path relative to JobSpec ("training.learning_rate",
// "dataset.paths[1]") and what is wrong with it. CreateJob returns them as google.rpc.BadRequest
// field violations. Plain data.

#include <string>

namespace offloadd::daemon {

struct FieldViolation {
  std::string field;
  std::string description;
};

}  // namespace offloadd::daemon
