#include "daemon/node/node_probe.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>

#include "common/file.h"
#include "daemon/server/node_service.h"

namespace offloadd::daemon {
namespace {

// `offloadctl node` lists the model families the engine trains, from the family table.
TEST(NodeProbeTest, NodeInfoListsTheSupportedModelFamilies) {
  offloadd::v1::NodeInfo info;
  FillNodeInfo(NodeFacts{}, BuildFacts{}, &info);
  ASSERT_EQ(info.supported_families_size(), 14);  // 10 dense families, 4 mixtures of experts
  EXPECT_EQ(info.supported_families(0).model_type(), "llama");
  EXPECT_EQ(info.supported_families(0).architectures(0), "LlamaForCausalLM");
  bool qwen3 = false, gemma3 = false, gpt_oss = false;
  for (const auto& f : info.supported_families()) {
    EXPECT_FALSE(f.description().empty()) << f.model_type();
    qwen3 = qwen3 || (f.model_type() == "qwen3" && f.architectures(0) == "Qwen3ForCausalLM");
    gemma3 = gemma3 || (f.model_type() == "gemma3" &&
                        f.architectures(0) == "Gemma3ForConditionalGeneration");
    gpt_oss = gpt_oss || (f.model_type() == "gpt_oss" && f.architectures(0) == "GptOssForCausalLM");
  }
  EXPECT_TRUE(qwen3 && gemma3 && gpt_oss);
}

TEST(NodeProbeTest, ReportsThisMachine) {
  const NodeFacts f = ProbeNode({{"/tmp", 1.0}, {"/nonexistent/store", 2.0}});
  EXPECT_EQ(f.cpu.logical_cores, sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_GE(f.cpu.physical_cores, 1);
  EXPECT_GT(f.memory.total_bytes, 0u);
  EXPECT_LE(f.memory.available_bytes, f.memory.total_bytes);
  ASSERT_EQ(f.store_dirs.size(), 2u);
  EXPECT_TRUE(f.store_dirs[0].problem.empty()) << f.store_dirs[0].problem;
  EXPECT_GT(f.store_dirs[0].capacity_bytes, 0u);
  // A missing directory is said to be missing, not "cannot stat".
  EXPECT_NE(f.store_dirs[1].problem.find("missing"), std::string::npos) << f.store_dirs[1].problem;
  // Either GPUs were found or we are told why not.
  EXPECT_TRUE(!f.gpus.empty() || !f.gpu_problem.empty());
  EXPECT_TRUE(f.io_uring_available || !f.io_uring_problem.empty());
}

// POSIX helpers (common/file.h), not std::filesystem: this binary links the daemon core and so
// LibTorch, whose CUDA build interposes its own std::filesystem (docs/DEVELOPING.md).
// A fake sysfs root with PCI devices whose numa_node files say what each test needs.
class PciNumaNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_sysfs_XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(root_).ok()); }
  void Device(const std::string& name, const std::string& numa_node_text) {
    const std::string dir = root_ + "/bus/pci/devices/" + name;
    ASSERT_TRUE(MakeDirs(dir).ok());
    std::ofstream(dir + "/numa_node") << numa_node_text;
  }
  std::string root_;
};

TEST_F(PciNumaNodeTest, ReadsTheNodeOfCudasUpperCaseBusId) {
  Device("0000:3b:00.0", "1\n");
  EXPECT_EQ(PciNumaNode("0000:3B:00.0", root_), 1);
}

TEST_F(PciNumaNodeTest, AcceptsNvmlsEightDigitDomain) {
  Device("0000:86:00.0", "0\n");
  EXPECT_EQ(PciNumaNode("00000000:86:00.0", root_), 0);
}

TEST_F(PciNumaNodeTest, UnknownIsMinusOne) {
  Device("0000:01:00.0", "-1\n");  // the kernel's "no NUMA information"
  Device("0000:02:00.0", "node one\n");
  Device("0000:03:00.0", "");
  EXPECT_EQ(PciNumaNode("0000:01:00.0", root_), -1);
  EXPECT_EQ(PciNumaNode("0000:02:00.0", root_), -1);
  EXPECT_EQ(PciNumaNode("0000:03:00.0", root_), -1);
  EXPECT_EQ(PciNumaNode("0000:04:00.0", root_), -1) << "no such device";
  EXPECT_EQ(PciNumaNode("", root_), -1);
  EXPECT_EQ(PciNumaNode("../../etc", root_), -1) << "not a path";
}

}  // namespace
}  // namespace offloadd::daemon

namespace offloadd::daemon {
namespace {

// The daemon learns its GPUs from `offloadd-executor --probe-gpus`.
TEST(GpuProbe, ParsesTheExecutorsAnswer) {
  std::string problem = "stale";
  const auto gpus = ParseGpuProbe(
      R"({"gpus":[{"index":1,"name":"NVIDIA H200","total_memory_bytes":150000000000,"free_memory_bytes":149000000000,)"
      R"("cc_major":9,"cc_minor":0,"pci_bus_id":"0000:3B:00.0"}],"problem":""})",
      &problem);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].index, 1);
  EXPECT_EQ(gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(gpus[0].total_memory_bytes, 150000000000u);
  EXPECT_EQ(gpus[0].cc_major, 9);
  EXPECT_EQ(gpus[0].pci_bus_id, "0000:3B:00.0");
  EXPECT_TRUE(problem.empty());
  EXPECT_TRUE(ParseGpuProbe(R"({"gpus":[],"problem":"no NVIDIA GPU"})", &problem).empty());
  EXPECT_EQ(problem, "no NVIDIA GPU");
  EXPECT_TRUE(ParseGpuProbe("not json", &problem).empty());
  EXPECT_NE(problem.find("not the expected JSON"), std::string::npos);
  EXPECT_TRUE(ParseGpuProbe(R"({"gpus":[{"index":"zero"}]})", &problem).empty());
  EXPECT_NE(problem.find("malformed"), std::string::npos);
}

TEST(GpuProbe, AMissingOrFailingExecutorMeansNoGpusWithAReason) {
  std::string problem;
  EXPECT_TRUE(ProbeGpusWithExecutor("/nonexistent/offloadd-executor", &problem, 5000).empty());
  EXPECT_NE(problem.find("exited with code 127 (could not be executed)"), std::string::npos) << problem;
  EXPECT_TRUE(ProbeGpusWithExecutor("/bin/false", &problem, 5000).empty());
  EXPECT_NE(problem.find("exited with code 1 without an answer"), std::string::npos) << problem;
  // One that never answers (a hung driver) is killed after the timeout.
  char dir[] = "/tmp/offloadd_probe_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string script = std::string(dir) + "/hangs";
  std::ofstream(script) << "#!/bin/sh\nexec sleep 60\n";
  ASSERT_EQ(chmod(script.c_str(), 0700), 0);
  EXPECT_TRUE(ProbeGpusWithExecutor(script, &problem, 300).empty());
  EXPECT_NE(problem.find("gave no answer within"), std::string::npos) << problem;
  unlink(script.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace offloadd::daemon
