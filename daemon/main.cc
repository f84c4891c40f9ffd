// offloadd: the fine-tuning daemon. Thin: parse flags, load config, hand over to RunDaemon.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/logging.h"
#include "daemon/build_info.h"
#include "daemon/config/config.h"
#include "daemon/daemon.h"
#include "daemon/server/grpc_server.h"

namespace {

constexpr const char* kUsage =
    "usage: offloadd [--config PATH] [--validate-config] [--version]\n"
    "  --config PATH       configuration file (default /etc/offloadd/offloadd.yaml)\n"
    "  --validate-config   check the configuration, print the effective settings, and exit\n"
    "                      (exit status 0 when valid, 2 when not)\n"
    "  --version           print the version and exit\n";

}  // namespace

int main(int argc, char** argv) {
  std::string config_path = offloadd::daemon::kDefaultConfigPath;
  bool validate_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) {
      config_path = argv[++i];
    } else if (arg.rfind("--config=", 0) == 0) {
      config_path = arg.substr(9);
    } else if (arg == "--validate-config") {
      validate_only = true;
    } else if (arg == "--version") {
      std::printf("offloadd %s (%s, %s flavour, LibTorch %s)\n", OFFLOADD_VERSION, OFFLOADD_GIT_REVISION,
                  OFFLOADD_FLAVOUR, OFFLOADD_TORCH_VERSION);
      return 0;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "offloadd: unknown argument '%s'\n%s", arg.c_str(), kUsage);
      return 2;
    }
  }
  auto config = offloadd::daemon::LoadConfigFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "offloadd: invalid configuration: %s\n", config.status().message().c_str());
    return 2;
  }
  if (validate_only) {
    // The same checks as startup (files, modes), so a configuration it accepts starts.
    std::vector<std::string> warnings;
    if (auto s = offloadd::daemon::CheckStartup(*config, &warnings); !s.ok()) {
      std::fprintf(stderr, "offloadd: invalid configuration: %s\n", s.message().c_str());
      return 2;
    }
    for (const auto& w : warnings) std::fprintf(stderr, "offloadd: warning: %s\n", w.c_str());
    std::printf("%s: configuration is valid. Effective settings:\n%s", config_path.c_str(),
                offloadd::daemon::ConfigToYaml(*config).c_str());
    return 0;
  }
  offloadd::SetMinLogSeverity(config->log_level);
  return offloadd::daemon::RunDaemon(*config);
}
