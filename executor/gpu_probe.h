#pragma once
// `offloadd-executor --probe-gpus`: the GPUs the CUDA runtime sees, as JSON, so that the daemon
// learns them without loading CUDA itself. The CPU flavour reports why there are none.
#include <string>

namespace offloadd::executor {

// {"gpus": [{"index", "name", "total_memory_bytes", "free_memory_bytes", "cc_major", "cc_minor",
// "pci_bus_id"}...], "problem": "...", and in the CUDA flavour "driver_cuda_version",
// "runtime_cuda_version" (cudaDriverGetVersion / cudaRuntimeGetVersion) and "insufficient_driver"}:
// daemon/node/node_probe.h ParseGpuProbe reads it.
std::string ProbeGpusJson();

}  // namespace offloadd::executor
