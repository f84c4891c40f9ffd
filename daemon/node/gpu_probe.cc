// GPU discovery through the CUDA runtime API (no LibTorch needed). The CPU flavour reports why
// there are no GPUs instead.
#include "daemon/node/node_probe.h"

#if OFFLOADD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <string>

namespace offloadd::daemon {

std::vector<GpuFacts> ProbeGpus(std::string* problem) {
  std::vector<GpuFacts> gpus;
#if OFFLOADD_WITH_CUDA
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    *problem = rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice
                   ? std::string("no NVIDIA GPU or driver on this machine (") + cudaGetErrorString(rc) + ")"
                   : std::string("no usable CUDA device: ") + cudaGetErrorString(rc);
    return gpus;
  }
  if (count == 0) {
    *problem = "the CUDA runtime reports no devices";
    return gpus;
  }
  int current = 0;
  cudaGetDevice(&current);
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    GpuFacts g;
    g.index = i;
    g.name = p.name;
    g.total_memory_bytes = p.totalGlobalMem;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) == cudaSuccess) g.pci_bus_id = bus;
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      g.free_memory_bytes = free_b;
    }
    gpus.push_back(g);
  }
  cudaSetDevice(current);
  problem->clear();
#else
  *problem = "this offloadd was built without CUDA (CPU flavour)";
#endif
  return gpus;
}

}  // namespace offloadd::daemon
