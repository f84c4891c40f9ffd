#pragma once
#include <string>

#include "common/status.h"

namespace offloadd::workers {
// Runs the training scenario described by spec.json through a real WorkerPool (see train.cc).
Status RunTrainSpec(const std::string& spec_path);
}  // namespace offloadd::workers
