// GPU discovery through the CUDA runtime API (no LibTorch needed), run in a short-lived executor
// so that the daemon never loads CUDA.
#include "executor/gpu_probe.h"

#if OFFLOADD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <nlohmann/json.hpp>

namespace offloadd::executor {

std::string ProbeGpusJson() {
  nlohmann::json out;
  out["gpus"] = nlohmann::json::array();
  std::string problem;
#if OFFLOADD_WITH_CUDA
  // The daemon compares these (daemon/node/gpu_driver.h): a driver too old for this runtime is an
  // error there, not a CPU node. Both calls work without a usable driver.
  int driver_version = 0, runtime_version = 0;
  if (cudaDriverGetVersion(&driver_version) != cudaSuccess) driver_version = 0;
  if (cudaRuntimeGetVersion(&runtime_version) != cudaSuccess) runtime_version = 0;
  out["driver_cuda_version"] = driver_version;
  out["runtime_cuda_version"] = runtime_version;
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  out["insufficient_driver"] = rc == cudaErrorInsufficientDriver;
  if (rc != cudaSuccess) {
    problem = rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice
                  ? std::string("no NVIDIA GPU or driver on this machine (") + cudaGetErrorString(rc) + ")"
                  : std::string("no usable CUDA device: ") + cudaGetErrorString(rc);
  } else if (count == 0) {
    problem = "the CUDA runtime reports no devices";
  }
  for (int i = 0; problem.empty() && i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    nlohmann::json g;
    g["index"] = i;
    g["name"] = std::string(p.name);
    g["total_memory_bytes"] = static_cast<uint64_t>(p.totalGlobalMem);
    g["cc_major"] = p.major;
    g["cc_minor"] = p.minor;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) == cudaSuccess) g["pci_bus_id"] = std::string(bus);
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      g["free_memory_bytes"] = static_cast<uint64_t>(free_b);
    }
    out["gpus"].push_back(g);
  }
#else
  problem = "this offloadd was built without CUDA (CPU flavour)";
#endif
  out["problem"] = problem;
  return out.dump();
}

}  // namespace offloadd::executor
