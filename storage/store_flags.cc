#include "storage/store_flags.h"

#include <cerrno>
#include <cstdlib>
#include <map>
#include <sstream>

#include "common/units.h"

namespace offloadd::storage {

const char kStoreUsage[] = R"(usage: offloadd-store --dir=PATH[:WEIGHT] [--dir=...] [options]
Serves tensor reads and writes for the offloadd daemon from NVMe store directories.

  --dir=PATH[:WEIGHT]     store directory (one per SSD; repeat, order matters); WEIGHT is its
                          share of each tensor's chunks (default 1)
  --block-size=SIZE       aio.block_size: bytes per I/O and checksum chunk (default 1MiB)
  --queue-depth=N         aio.queue_depth: I/Os in flight per directory (default 32)
  --io-engine=E           auto | io_uring | threads (default auto: io_uring, else threads)
  --direct-io=M           auto | on | off (default auto: O_DIRECT where the filesystem allows)
  --control-fd=N          Unix socket from the daemon (store_protocol.h handshake)
  --metrics-listen=H:P    serve Prometheus metrics at http://H:P/metrics (port 0: any)
  --log-level=L           debug | info | warning | error
  --validate-config       check the flags, print the effective settings, exit
  --list                  open the store, print every tensor's key/version/size, exit
  --verify                open the store, read every tensor back verifying checksums, exit
)";

StatusOr<StoreFlags> ParseStoreFlags(const std::vector<std::string>& args) {
  StoreFlags f;
  const size_t argc = args.size();
  for (size_t i = 0; i < argc; ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      f.help = true;
      return f;
    }
    if (arg == "--validate-config") {
      f.validate = true;
      continue;
    }
    if (arg == "--list") {
      f.list = true;
      continue;
    }
    if (arg == "--verify") {
      f.verify = true;
      continue;
    }
    std::string name = arg, value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = args[++i];
    } else {
      return InvalidArgumentError(arg + ": missing value");
    }
    auto parse_uint = [&](uint64_t max) -> StatusOr<uint64_t> {
      char* end = nullptr;
      errno = 0;
      const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0 || v > max) {
        return InvalidArgumentError(name + ": expected an integer <= " + std::to_string(max) +
                                    ", got '" + value + "'");
      }
      return static_cast<uint64_t>(v);
    };
    if (name == "--dir") {
      StoreDirectory d{value, 1.0};
      if (auto colon = value.rfind(':'); colon != std::string::npos) {
        char* end = nullptr;
        const double w = std::strtod(value.c_str() + colon + 1, &end);
        if (end != value.c_str() + colon + 1 && *end == '\0') {  // "PATH:2.5"; else ':' is in PATH
          d.path = value.substr(0, colon);
          d.weight = w;
        }
      }
      f.store.directories.push_back(d);
    } else if (name == "--block-size") {
      ASSIGN_OR_RETURN(uint64_t v, ParseByteSize(value));
      if (v > UINT32_MAX) return InvalidArgumentError("--block-size: too large");
      f.store.block_size = static_cast<uint32_t>(v);
    } else if (name == "--queue-depth") {
      ASSIGN_OR_RETURN(uint64_t v, parse_uint(4096));
      f.store.queue_depth = static_cast<uint32_t>(v);
    } else if (name == "--io-engine") {
      static const std::map<std::string, IoEngineChoice> kEngines = {
          {"auto", IoEngineChoice::kAuto},
          {"io_uring", IoEngineChoice::kIoUring},
          {"threads", IoEngineChoice::kThreads}};
      auto it = kEngines.find(value);
      if (it == kEngines.end())
        return InvalidArgumentError("--io-engine: expected auto, io_uring or threads, got '" +
                                    value + "'");
      f.store.io_engine = it->second;
    } else if (name == "--direct-io") {
      static const std::map<std::string, DirectIoMode> kModes = {
          {"auto", DirectIoMode::kAuto}, {"on", DirectIoMode::kOn}, {"off", DirectIoMode::kOff}};
      auto it = kModes.find(value);
      if (it == kModes.end())
        return InvalidArgumentError("--direct-io: expected auto, on or off, got '" + value + "'");
      f.store.direct_io = it->second;
    } else if (name == "--control-fd") {
      ASSIGN_OR_RETURN(uint64_t v, parse_uint(1 << 20));
      f.control_fd = static_cast<int>(v);
    } else if (name == "--metrics-listen") {
      f.metrics_listen = value;
    } else if (name == "--log-level") {
      if (!ParseLogSeverity(value, &f.log_level)) {
        return InvalidArgumentError("--log-level: unknown level '" + value + "'");
      }
    } else {
      return InvalidArgumentError("unknown flag " + name + " (see --help)");
    }
  }
  RETURN_IF_ERROR(ValidateStoreOptions(f.store));
  return f;
}

std::vector<std::string> ToStoreFlags(const StoreOptions& o) {
  std::vector<std::string> out;
  for (const auto& d : o.directories) {
    std::ostringstream w;
    w.precision(17);
    w << d.weight;
    out.push_back("--dir=" + d.path + ":" + w.str());
  }
  out.push_back("--block-size=" + std::to_string(o.block_size));
  out.push_back("--queue-depth=" + std::to_string(o.queue_depth));
  out.push_back(std::string("--io-engine=") + (o.io_engine == IoEngineChoice::kIoUring ? "io_uring"
                                               : o.io_engine == IoEngineChoice::kThreads ? "threads"
                                                                                         : "auto"));
  out.push_back(std::string("--direct-io=") + (o.direct_io == DirectIoMode::kOn    ? "on"
                                               : o.direct_io == DirectIoMode::kOff ? "off"
                                                                                   : "auto"));
  return out;
}

}  // namespace offloadd::storage
