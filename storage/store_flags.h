#pragma once
// offloadd-store's command line: parsing into StoreOptions (with range checks that name the
// flag) and the reverse, for the daemon that launches the store from its `storage:` config.
// Pure functions; thread-safe.

#include <string>
#include <vector>

#include "common/logging.h"
#include "common/status.h"
#include "storage/tensor_store.h"

namespace offloadd::storage {

extern const char kStoreUsage[];

struct StoreFlags {
  StoreOptions store;
  int control_fd = -1;
  std::string metrics_listen;  // "host:port", empty: no endpoint
  LogSeverity log_level = LogSeverity::kInfo;
  bool help = false, validate = false, list = false, verify = false;
};

// Accepts --name=value and --name value. Unknown flags and bad values are INVALID_ARGUMENT
// naming the flag; the options are checked with ValidateStoreOptions.
StatusOr<StoreFlags> ParseStoreFlags(const std::vector<std::string>& args);

// The flags that make offloadd-store open `options` (directories with weights, aio.block_size,
// aio.queue_depth, engine and O_DIRECT mode). Test-only seams and registered buffers are not
// flags. ParseStoreFlags(ToStoreFlags(o)).store equals o in those fields.
std::vector<std::string> ToStoreFlags(const StoreOptions& options);

}  // namespace offloadd::storage
