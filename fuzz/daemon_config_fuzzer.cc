// Fuzzes the daemon's YAML config loader (daemon/config/config.h): the input is offloadd.yaml.
// A config that parses is printed back with ConfigToYaml and must parse again to the same
// effective settings (what --validate-config and the startup log show is what runs).
// yaml-cpp itself comes from Debian uninstrumented: coverage guides through offloadd's reader.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "daemon/config/config.h"
#include "fuzz/fuzz_util.h"

using offloadd::daemon::ConfigToYaml;
using offloadd::daemon::ParseConfig;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  auto config = ParseConfig(yaml, "offloadd.yaml");
  if (!config.ok()) return 0;
  const std::string printed = ConfigToYaml(*config);
  auto again = ParseConfig(printed, "<effective config>");
  if (!again.ok()) {
    std::fprintf(stderr, "effective config does not parse back:\n%s\n%s\n", printed.c_str(),
                 again.status().ToString().c_str());
  }
  FUZZ_CHECK(again.ok());
  const std::string reprinted = ConfigToYaml(*again);
  if (reprinted != printed) {
    std::fprintf(stderr, "effective config printed back differently:\n%s\n---- then ----\n%s\n", printed.c_str(),
                 reprinted.c_str());
  }
  FUZZ_CHECK(reprinted == printed);
  return 0;
}
