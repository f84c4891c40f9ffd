#pragma once
// What this machine offers: CPU, memory limits, NUMA, GPUs, store directories, io_uring.
// Probed from /proc, /sys, statvfs, getrlimit, liburing and (CUDA flavour) the CUDA runtime.
// Plain data: the gRPC NodeService translates it to protobuf. Thread-compatible.

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/node/gpu_driver.h"
#include "job/node_facts.h"  // GpuFacts, StoreDirFacts

namespace offloadd::daemon {

struct CpuFacts {
  std::string model_name;
  int logical_cores = 0;
  int physical_cores = 0;
  bool avx2 = false;
  bool avx512f = false;
  bool avx512_bf16 = false;
};

struct MemoryFacts {
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;
  uint64_t hugepage_size_bytes = 0;
  uint64_t hugepages_total = 0;
  uint64_t hugepages_free = 0;
  uint64_t memlock_limit_bytes = 0;  // 0 = unlimited
  uint64_t shm_available_bytes = 0;
};

struct NumaFacts {
  int id = 0;
  std::string cpus;
  uint64_t memory_total_bytes = 0;
};

struct NodeFacts {
  std::string hostname;
  std::string kernel_release;
  CpuFacts cpu;
  MemoryFacts memory;
  std::vector<NumaFacts> numa_nodes;
  std::vector<GpuFacts> gpus;
  std::string gpu_problem;
  // The NVIDIA driver as probed at start ("580.65.06 (CUDA 13.0)"), and, when it is too old for
  // the bundled CUDA runtime, why (then gpus is empty and jobs are refused: gpu_driver.h).
  std::string gpu_driver;
  std::string gpu_driver_problem;
  std::vector<StoreDirFacts> store_dirs;
  bool io_uring_available = false;
  std::string io_uring_problem;
};

struct StoreDirInput {
  std::string path;
  double weight = 1;
};

// Everything but io_uring is cheap; the GPUs are those the daemon probed at startup
// (SetProbedGpus), since the daemon does not load CUDA itself.
NodeFacts ProbeNode(const std::vector<StoreDirInput>& store_dirs);

// Only what job validation budgets against: memory, GPUs and store directories (no CPU flags,
// NUMA or io_uring probe, which would be wasted work on every CreateJob).
NodeFacts ProbeNodeResources(const std::vector<StoreDirInput>& store_dirs);

// The GPUs recorded by SetProbedGpus (none, with *problem saying why, before it or when the
// probe found none). Thread-safe.
std::vector<GpuFacts> ProbeGpus(std::string* problem);
// `driver` describes the NVIDIA driver (DescribeGpuDriver) and `driver_problem` says why it cannot
// be used (GpuDriverProblem), both empty when there is nothing to say.
void SetProbedGpus(std::vector<GpuFacts> gpus, std::string problem, std::string driver = {},
                   std::string driver_problem = {});
// What SetProbedGpus recorded about the driver. Thread-safe.
void ProbedGpuDriver(std::string* driver, std::string* driver_problem);

// Runs `executor_binary --probe-gpus` (ipc::LaunchChild) and reads its JSON answer from the control
// socket: the GPUs the CUDA runtime sees (their free memory as of now). A missing or failing
// executor, or one that does not answer within `timeout_ms`, gives no GPUs and *problem says why.
// `driver`, when given, receives what the probe says of the driver (all but driver_version).
std::vector<GpuFacts> ProbeGpusWithExecutor(const std::string& executor_binary, std::string* problem,
                                            int timeout_ms = 60000, GpuDriverFacts* driver = nullptr);
// The probe's JSON ({"gpus": [...], "problem": "...", "driver_cuda_version", "runtime_cuda_version",
// "insufficient_driver"}, executor/gpu_probe.h) as GpuFacts (numa_node is left to
// ProbeNodeResources); none, with *problem set, when it does not parse. The driver fields go to
// *driver when it is given (absent fields: 0 / false, as from an older executor).
std::vector<GpuFacts> ParseGpuProbe(const std::string& json, std::string* problem,
                                    GpuDriverFacts* driver = nullptr);

// NUMA node of the PCI device `pci_bus_id` (as CUDA writes it, "0000:3B:00.0", or with NVML's
// 8-digit domain, "00000000:3B:00.0"), read from <sysfs_root>/bus/pci/devices/<id>/numa_node.
// -1 when unknown: no such device or file, unparsable content, or the kernel's own -1 (a machine
// without NUMA, or firmware that does not say).
int PciNumaNode(const std::string& pci_bus_id, const std::string& sysfs_root = "/sys");

// Whether io_uring can be set up here (kernel support, seccomp, io_uring_disabled sysctl).
bool ProbeIoUring(std::string* problem);

}  // namespace offloadd::daemon
