#include "daemon/node/node_probe.h"

#include <unistd.h>

#include <gtest/gtest.h>

namespace offloadd::daemon {
namespace {

TEST(NodeProbeTest, ReportsThisMachine) {
  const NodeFacts f = ProbeNode({{"/tmp", 1.0}, {"/nonexistent/store", 2.0}});
  EXPECT_EQ(f.cpu.logical_cores, sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_GE(f.cpu.physical_cores, 1);
  EXPECT_GT(f.memory.total_bytes, 0u);
  EXPECT_LE(f.memory.available_bytes, f.memory.total_bytes);
  ASSERT_EQ(f.store_dirs.size(), 2u);
  EXPECT_TRUE(f.store_dirs[0].problem.empty()) << f.store_dirs[0].problem;
  EXPECT_GT(f.store_dirs[0].capacity_bytes, 0u);
  EXPECT_NE(f.store_dirs[1].problem.find("cannot stat"), std::string::npos);
  // Either GPUs were found or we are told why not.
  EXPECT_TRUE(!f.gpus.empty() || !f.gpu_problem.empty());
  EXPECT_TRUE(f.io_uring_available || !f.io_uring_problem.empty());
}

}  // namespace
}  // namespace offloadd::daemon
