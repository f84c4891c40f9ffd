#include "workers/tools/train.h"

namespace offloadd::workers {
Status RunTrainSpec(const std::string& spec_path) {
  return UnimplementedError("train: not built yet");
}
}  // namespace offloadd::workers
