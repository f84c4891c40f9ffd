#include "daemon/node/gpu_driver.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "daemon/node/node_probe.h"

namespace offloadd::daemon {
namespace {

// NVIDIA's table (docs/gpu_driver.md): CUDA 13.x >= 580, 12.x >= 525, 11.x >= 450.
TEST(GpuDriverTest, FloorPerCudaMajor) {
  EXPECT_EQ(MinimumDriverBranch(13), 580);
  EXPECT_EQ(MinimumDriverBranch(12), 525);
  EXPECT_EQ(MinimumDriverBranch(11), 450);
  EXPECT_EQ(MinimumDriverBranch(10), 0);
  EXPECT_EQ(FormatCudaVersion(13000), "13.0");
  EXPECT_EQ(FormatCudaVersion(12080), "12.8");
  EXPECT_EQ(FormatCudaVersion(13020), "13.2");
}

GpuDriverFacts Facts(int driver_cuda, int runtime_cuda, bool insufficient, std::string version) {
  GpuDriverFacts f;
  f.driver_cuda_version = driver_cuda;
  f.runtime_cuda_version = runtime_cuda;
  f.insufficient_driver = insufficient;
  f.driver_version = std::move(version);
  return f;
}

TEST(GpuDriverTest, NoDriverAtAllIsNoGpuNotAnOldDriver) {
  // A machine with no NVIDIA driver: cudaGetDeviceCount answers cudaErrorInsufficientDriver and
  // cudaDriverGetVersion 0, and there is no /proc/driver/nvidia: it trains on the CPU, unrefused.
  EXPECT_EQ(GpuDriverProblem(Facts(0, 13000, true, "")), "");
  // The kernel module alone (no driver library answering) still names the old driver.
  EXPECT_NE(GpuDriverProblem(Facts(0, 13000, true, "570.86.15")).find("570.86.15"), std::string::npos);
}

TEST(GpuDriverTest, R570UnderTheCuda13RuntimeIsTooOldAndSaysWhy) {
  const std::string p = GpuDriverProblem(Facts(12080, 13000, true, "570.86.15"));
  EXPECT_EQ(
      p,
      "the NVIDIA driver 570.86.15 supports CUDA 12.8, but this offloadd's CUDA runtime is 13.0 "
      "and needs driver >= 580 (R580 or newer): upgrade the driver, or start the daemon with "
      "CUDA_VISIBLE_DEVICES= to train on the CPU (docs/gpu_driver.md)");
  // The version comparison alone decides too (a runtime that did not flag the driver).
  EXPECT_NE(GpuDriverProblem(Facts(12080, 13000, false, "")).find("needs driver >= 580"),
            std::string::npos);
  // The runtime's refusal with no driver known at all is a machine without a GPU
  // (NoDriverAtAllIsNoGpuNotAnOldDriver); with the kernel module loaded it is an old driver.
  EXPECT_NE(GpuDriverProblem(Facts(0, 13000, true, "570.86.15")).find("is too old"), std::string::npos);
}

TEST(GpuDriverTest, NewEnoughNoDriverOrCpuFlavourIsNoProblem) {
  EXPECT_EQ(GpuDriverProblem(Facts(13000, 13000, false, "580.65.06")), "");
  // Minor version compatibility: a 13.0 driver runs a 13.2 runtime.
  EXPECT_EQ(GpuDriverProblem(Facts(13000, 13020, false, "580.65.06")), "");
  EXPECT_EQ(GpuDriverProblem(Facts(13020, 13000, false, "590.1")), "");
  // No driver library at all: no NVIDIA GPU to speak of.
  EXPECT_EQ(GpuDriverProblem(Facts(0, 13000, false, "")), "");
  // CPU flavour: nothing bundled, nothing to check.
  EXPECT_EQ(GpuDriverProblem(Facts(12080, 0, true, "570.86.15")), "");
}

TEST(GpuDriverTest, KernelModuleVersionIsParsed) {
  EXPECT_EQ(ParseNvidiaDriverVersion(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Fri Jan 24 "
                "02:09:28 UTC 2025\nGCC version:  gcc version 12.2.0\n"),
            "570.86.15");
  EXPECT_EQ(ParseNvidiaDriverVersion(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  "
                "Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Jul 22 2025"),
            "580.65.06");
  EXPECT_EQ(ParseNvidiaDriverVersion("garbage"), "");
  EXPECT_EQ(ParseNvidiaDriverVersion(""), "");

  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("offloadd_gpu_driver_" + std::to_string(getpid()));
  std::filesystem::create_directories(root / "driver" / "nvidia");
  std::ofstream(root / "driver" / "nvidia" / "version")
      << "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC "
         "2024\n";
  EXPECT_EQ(ReadNvidiaDriverVersion(root.string()), "535.183.01");
  EXPECT_EQ(ReadNvidiaDriverVersion((root / "absent").string()), "");
  std::filesystem::remove_all(root);
}

TEST(GpuDriverTest, HiddenGpusAreTheOperatorsChoice) {
  EXPECT_FALSE(GpusHiddenByEnvironment(nullptr));
  EXPECT_TRUE(GpusHiddenByEnvironment(""));
  EXPECT_TRUE(GpusHiddenByEnvironment("-1"));
  EXPECT_TRUE(GpusHiddenByEnvironment("-1,0"));
  EXPECT_FALSE(GpusHiddenByEnvironment("0"));
  EXPECT_FALSE(GpusHiddenByEnvironment("GPU-5f3c"));
}

// The probe seam: what `offloadd-executor --probe-gpus` answers on a node whose driver is too old
// (the CUDA runtime refuses it, so no GPU is listed), read back into the facts compared above.
TEST(GpuDriverTest, ProbeAnswerCarriesTheDriverFacts) {
  std::string problem;
  GpuDriverFacts f;
  const auto gpus = ParseGpuProbe(
      R"j({"gpus":[],"problem":"no NVIDIA GPU or driver on this machine (CUDA driver version is )j"
      R"j(insufficient for CUDA runtime version)","driver_cuda_version":12080,)j"
      R"j("runtime_cuda_version":13000,"insufficient_driver":true})j",
      &problem, &f);
  EXPECT_TRUE(gpus.empty());
  EXPECT_EQ(f.driver_cuda_version, 12080);
  EXPECT_EQ(f.runtime_cuda_version, 13000);
  EXPECT_TRUE(f.insufficient_driver);
  f.driver_version = "570.86.15";
  EXPECT_NE(GpuDriverProblem(f).find("570.86.15 supports CUDA 12.8"), std::string::npos);
  EXPECT_EQ(DescribeGpuDriver(f), "570.86.15 (CUDA 12.8)");

  // An older executor's answer (no driver fields): nothing to object to.
  GpuDriverFacts none;
  ParseGpuProbe(R"j({"gpus":[],"problem":"this offloadd was built without CUDA (CPU flavour)"})j",
                &problem, &none);
  EXPECT_EQ(GpuDriverProblem(none), "");

  // What the daemon records is what NodeInfo and validation read.
  SetProbedGpus({}, "too old", "570.86.15 (CUDA 12.8)", GpuDriverProblem(f));
  const NodeFacts node = ProbeNodeResources({});
  EXPECT_EQ(node.gpu_driver, "570.86.15 (CUDA 12.8)");
  EXPECT_NE(node.gpu_driver_problem.find(">= 580"), std::string::npos);
  EXPECT_TRUE(node.gpus.empty());
  SetProbedGpus({}, "the GPUs were not probed (no executor asked yet)");
}

}  // namespace
}  // namespace offloadd::daemon
