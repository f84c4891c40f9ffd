#include "workers/cpu_topology.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace offloadd::workers {
namespace {

TEST(CpuTopologyTest, ParsesKernelCpuLists) {
  auto cpus = ParseCpuList("0-3,8,10-11\n");
  ASSERT_TRUE(cpus.ok());
  EXPECT_EQ(*cpus, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_TRUE(ParseCpuList("").ok());
  EXPECT_EQ(ParseCpuList("3-1").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCpuList("a,b").status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuTopologyTest, ReadsNumaNodesAndSpreadsProcesses) {
  const auto root = std::filesystem::temp_directory_path() / ("numa-" + std::to_string(getpid()));
  for (auto [node, list] : {std::pair{0, "0-3"}, std::pair{1, "4-7"}}) {
    std::filesystem::create_directories(root / ("node" + std::to_string(node)));
    std::ofstream(root / ("node" + std::to_string(node)) / "cpulist") << list << "\n";
  }
  std::filesystem::create_directories(root / "power");                 // not a node
  const auto nodes = NumaNodes({0, 1, 2, 3, 4, 5, 6}, root.string());  // cpu 7 not allowed
  EXPECT_EQ(NumaNodeIds({0, 1, 2, 3, 4, 5, 6}, root.string()), (std::vector<int>{0, 1}));
  EXPECT_EQ(NumaNodeIds({5}, root.string()), (std::vector<int>{1}));
  std::filesystem::remove_all(root);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[1], (std::vector<int>{4, 5, 6}));

  const CpuPlan plan = PlanWorkerCpus(2, 3, nodes);
  EXPECT_FALSE(plan.oversubscribed);
  EXPECT_EQ(plan.cpus[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(plan.cpus[1], (std::vector<int>{4, 5, 6}));
  EXPECT_EQ(plan.node, (std::vector<int>{0, 1}));
  EXPECT_TRUE(PlanWorkerCpus(3, 3, nodes).oversubscribed);
}

TEST(CpuTopologyTest, NoSysfsMeansOneNode) {
  const auto nodes = NumaNodes({0, 1}, "/nonexistent");
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0], (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace offloadd::workers
