// GPU discovery without CUDA in the daemon: a short-lived `offloadd-executor
// --probe-gpus` asks the CUDA runtime and answers with JSON over its control socket; the daemon
// keeps the answer for its lifetime (the GPUs of a host do not change under a running daemon).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "daemon/node/node_probe.h"
#include "ipc/child_process.h"
#include "ipc/message_channel.h"

namespace offloadd::daemon {
namespace {

std::mutex& GpuMutex() {
  static std::mutex mu;
  return mu;
}
struct GpuCache {
  std::vector<GpuFacts> gpus;
  std::string problem = "the GPUs were not probed (no executor asked yet)";
  std::string driver;
  std::string driver_problem;
};
GpuCache& Cache() {
  static GpuCache cache;
  return cache;
}

int Reap(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

std::vector<GpuFacts> ParseGpuProbe(const std::string& json, std::string* problem, GpuDriverFacts* driver) {
  std::vector<GpuFacts> gpus;
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("gpus") || !j["gpus"].is_array()) {
    *problem = "the GPU probe's answer is not the expected JSON";
    return gpus;
  }
  try {
    for (const auto& g : j["gpus"]) {
      GpuFacts f;
      f.index = g.value("index", 0);
      f.name = g.value("name", std::string());
      f.total_memory_bytes = g.value("total_memory_bytes", uint64_t{0});
      f.free_memory_bytes = g.value("free_memory_bytes", uint64_t{0});
      f.cc_major = g.value("cc_major", 0);
      f.cc_minor = g.value("cc_minor", 0);
      f.pci_bus_id = g.value("pci_bus_id", std::string());
      gpus.push_back(std::move(f));
    }
    *problem = j.value("problem", std::string());
    if (driver != nullptr) {
      driver->driver_cuda_version = j.value("driver_cuda_version", 0);
      driver->runtime_cuda_version = j.value("runtime_cuda_version", 0);
      driver->insufficient_driver = j.value("insufficient_driver", false);
    }
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    gpus.clear();
    *problem = std::string("the GPU probe's answer is malformed: ") + e.what();
  }
  return gpus;
}

std::vector<GpuFacts> ProbeGpusWithExecutor(const std::string& executor_binary, std::string* problem,
                                            int timeout_ms, GpuDriverFacts* driver) {
  auto child = ipc::LaunchChild(executor_binary, {"--probe-gpus"});
  if (!child.ok()) {
    *problem = "cannot start " + executor_binary + " --probe-gpus: " + std::string(child.status().message());
    return {};
  }
  // The answer, or the executor's exit, or the timeout (a hung driver).
  pollfd p{child->control.get(), POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) {
    ::kill(child->pid, SIGKILL);
    Reap(child->pid);
    *problem = executor_binary + " --probe-gpus gave no answer within " + std::to_string(timeout_ms / 1000) + " s";
    return {};
  }
  auto answer = ipc::RecvMessage(child->control.get(), 1 << 20);
  if (!answer.ok()) ::kill(child->pid, SIGKILL);
  const int status = Reap(child->pid);
  if (!answer.ok()) {
    *problem = executor_binary + " --probe-gpus " + ipc::DescribeExit(status) + " without an answer";
    return {};
  }
  return ParseGpuProbe(*answer, problem, driver);
}

void SetProbedGpus(std::vector<GpuFacts> gpus, std::string problem, std::string driver,
                   std::string driver_problem) {
  std::lock_guard<std::mutex> lock(GpuMutex());
  Cache().gpus = std::move(gpus);
  Cache().problem = std::move(problem);
  Cache().driver = std::move(driver);
  Cache().driver_problem = std::move(driver_problem);
}

void ProbedGpuDriver(std::string* driver, std::string* driver_problem) {
  std::lock_guard<std::mutex> lock(GpuMutex());
  *driver = Cache().driver;
  *driver_problem = Cache().driver_problem;
}

std::vector<GpuFacts> ProbeGpus(std::string* problem) {
  std::lock_guard<std::mutex> lock(GpuMutex());
  *problem = Cache().problem;
  return Cache().gpus;
}

}  // namespace offloadd::daemon
