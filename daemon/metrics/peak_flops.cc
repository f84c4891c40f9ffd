#include "daemon/metrics/peak_flops.h"

namespace offloadd::daemon {

double KnownPeakBf16Flops(std::string_view name) {
  // More specific names first: "H100 PCIe" and "H100 NVL" before "H100".
  static constexpr struct {
    std::string_view needle;
    double flops;
  } kTable[] = {
      {"GB200", 2.5e15},    {"B200", 2.25e15},    {"H200 NVL", 835e12}, {"H200", 989.4e12},
      {"GH200", 989.4e12},  {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"H100", 989.4e12},
      {"H800", 989.4e12},   {"A100", 312e12},      {"A800", 312e12},     {"L40S", 362.05e12},
  };
  for (const auto& e : kTable) {
    if (name.find(e.needle) != std::string_view::npos) return e.flops;
  }
  return 0;
}

}  // namespace offloadd::daemon
