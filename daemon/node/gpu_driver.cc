#include "daemon/node/gpu_driver.h"

#include <cctype>
#include <fstream>
#include <sstream>

namespace offloadd::daemon {

int MinimumDriverBranch(int cuda_major) {
  // https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html, table
  // "CUDA Toolkit 11.x, 12.x, and 13.x Minimum and Maximum Required Driver Versions".
  switch (cuda_major) {
    case 13:
      return 580;
    case 12:
      return 525;
    case 11:
      return 450;
    default:
      return 0;
  }
}

std::string FormatCudaVersion(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string GpuDriverProblem(const GpuDriverFacts& f) {
  if (f.runtime_cuda_version <= 0) return "";  // CPU flavour
  const int major = f.runtime_cuda_version / 1000;
  // A driver of the runtime's major release runs every minor release of it (minor version
  // compatibility), so a 13.0 driver runs a 13.x runtime.
  // cudaErrorInsufficientDriver is also what the runtime answers on a machine with no NVIDIA
  // driver at all (no GPU): only a driver that is there (its library answered, or its kernel
  // module is loaded) can be too old.
  const bool driver_present = f.driver_cuda_version > 0 || !f.driver_version.empty();
  const bool too_old = (f.insufficient_driver && driver_present) ||
                       (f.driver_cuda_version > 0 && f.driver_cuda_version < major * 1000);
  if (!too_old) return "";
  std::string s = "the NVIDIA driver";
  if (!f.driver_version.empty()) s += " " + f.driver_version;
  s += f.driver_cuda_version > 0 ? " supports CUDA " + FormatCudaVersion(f.driver_cuda_version)
                                 : std::string(" is too old");
  s += ", but this offloadd's CUDA runtime is " + FormatCudaVersion(f.runtime_cuda_version);
  if (const int floor = MinimumDriverBranch(major); floor > 0) {
    s += " and needs driver >= " + std::to_string(floor) + " (R" + std::to_string(floor) +
         " or newer)";
  } else {
    s += " and needs a driver that supports CUDA " + std::to_string(major) + ".0";
  }
  s += ": upgrade the driver, or start the daemon with CUDA_VISIBLE_DEVICES= to train on the CPU "
       "(docs/gpu_driver.md)";
  return s;
}

std::string ParseNvidiaDriverVersion(std::string_view text) {
  const std::string_view line = text.substr(0, text.find('\n'));
  // The version is the first word after "Kernel Module" that starts with a digit.
  const size_t at = line.find("Kernel Module");
  if (at == std::string_view::npos) return "";
  std::istringstream words{std::string(line.substr(at + 13))};
  std::string w;
  while (words >> w) {
    if (std::isdigit(static_cast<unsigned char>(w[0])) && w.find('.') != std::string::npos)
      return w;
  }
  return "";
}

std::string ReadNvidiaDriverVersion(const std::string& proc_root) {
  std::ifstream in(proc_root + "/driver/nvidia/version");
  if (!in) return "";
  std::string first;
  std::getline(in, first);
  return ParseNvidiaDriverVersion(first);
}

bool GpusHiddenByEnvironment(const char* v) {
  if (v == nullptr) return false;
  std::string_view s(v);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  return s.empty() || s.rfind("-1", 0) == 0;
}

std::string DescribeGpuDriver(const GpuDriverFacts& f) {
  std::string s = f.driver_version;
  if (f.driver_cuda_version > 0) {
    s += (s.empty() ? "" : " ") + std::string("(CUDA ") + FormatCudaVersion(f.driver_cuda_version) +
         ")";
  }
  return s;
}

}  // namespace offloadd::daemon
