#include "workers/protocol.h"

namespace offloadd::workers {

std::string CommandQueueName(uint32_t worker) { return "worker" + std::to_string(worker) + ".cmd"; }
std::string CompletionQueueName(uint32_t worker) {
  return "worker" + std::to_string(worker) + ".cpl";
}
std::string UndoRegionName(uint32_t worker) { return "worker" + std::to_string(worker) + ".undo"; }

}  // namespace offloadd::workers
