#pragma once
// Whether this node's NVIDIA driver can run the CUDA runtime that offloadd bundles (CUDA 13.0 in
// the torch 2.11+cu130 flavour: driver >= 580). A GPU whose driver is too old must not quietly
// leave jobs on the CPU: the daemon logs the problem at start, shows it in NodeInfo, and job
// validation refuses jobs while it lasts (docs/gpu_driver.md). Pure functions over probed facts,
// so that every case is unit-tested without a GPU; thread-safe.

#include <string>
#include <string_view>

namespace offloadd::daemon {

// What `offloadd-executor --probe-gpus` reports about the driver, plus the kernel module's version.
struct GpuDriverFacts {
  // cudaDriverGetVersion: the newest CUDA the installed driver supports, 1000 * major + 10 * minor
  // (12080 = CUDA 12.8); 0 when no driver library is installed.
  int driver_cuda_version = 0;
  // cudaRuntimeGetVersion of the runtime offloadd was built with (13000 = CUDA 13.0); 0 in the
  // CPU flavour, which checks nothing.
  int runtime_cuda_version = 0;
  // The runtime refused the driver (cudaErrorInsufficientDriver from cudaGetDeviceCount).
  bool insufficient_driver = false;
  // The kernel module's version from /proc/driver/nvidia/version ("580.65.06"); empty if unknown.
  std::string driver_version;
};

// NVIDIA's minimum Linux driver branch for a CUDA major release (CUDA minor version
// compatibility: 13 -> 580, 12 -> 525, 11 -> 450); 0 for a release not in the table.
int MinimumDriverBranch(int cuda_major);

// 13000 -> "13.0", 12080 -> "12.8".
std::string FormatCudaVersion(int version);

// Empty when there is nothing to object to: the driver supports the runtime's major release, no
// driver is installed at all (no GPU), or the CPU flavour. Otherwise one sentence naming the
// driver's version, the CUDA it supports, the runtime's and the required driver floor.
std::string GpuDriverProblem(const GpuDriverFacts& facts);

// The version in /proc/driver/nvidia/version's first line ("NVRM version: NVIDIA UNIX x86_64
// Kernel Module  580.65.06  Sun Jul 27 ..." or the "Open Kernel Module" form); "" if not found.
std::string ParseNvidiaDriverVersion(std::string_view proc_driver_nvidia_version);
// Reads <proc_root>/driver/nvidia/version; "" when the module is not loaded.
std::string ReadNvidiaDriverVersion(const std::string& proc_root = "/proc");

// Whether CUDA_VISIBLE_DEVICES (nullptr: unset) hides every GPU on purpose: set and empty, or a
// list that starts with -1 (CUDA stops at the first invalid index). The operator chose the CPU;
// the driver is not checked then.
bool GpusHiddenByEnvironment(const char* cuda_visible_devices);

// "580.65.06 (CUDA 13.0)", or what is known of it; "" when nothing is.
std::string DescribeGpuDriver(const GpuDriverFacts& facts);

}  // namespace offloadd::daemon
