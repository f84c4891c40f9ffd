// The step priced without running it (`offloadctl submit --validate-only`):
// the node profile's rates, the GPU's work from a shape profile when one matches, else a bound.
#include "job/step_estimate.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

StepEstimateInputs Inputs() {
  StepEstimateInputs in;
  in.block_params = {1000000, 2000000, 2000000, 1000000};
  in.micro = 4;
  in.seq = 256;
  in.accumulation = 2;
  NodeProfile p;
  p.key = "node-a";
  p.measured_at = "2026-11-27T00:00:00Z";
  p.host_bytes_per_s = 1e12;
  p.cpu_params_per_s = 6e7;  // 6 M parameters: 0.1 s of updates
  p.h2d_bytes_per_s = p.d2h_bytes_per_s = 1e12;
  in.node = p;
  return in;
}

TEST(StepEstimateTest, NeedsANodeProfile) {
  StepEstimateInputs in = Inputs();
  in.node.reset();
  EXPECT_EQ(EstimateStep(in).status().code(), StatusCode::kNotFound);
}

TEST(StepEstimateTest, WithoutTheShapesGpuWorkItIsABound) {
  auto e = EstimateStep(Inputs());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e->lower_bound);
  EXPECT_EQ(e->bound, "CPU update");
  EXPECT_NEAR(e->step_seconds, 0.1, 1e-3);  // PCIe at 1 TB/s adds little to the CPU's rate
  EXPECT_NEAR(e->tokens_per_second * e->step_seconds, 2 * 4 * 256, 1e-6);
  EXPECT_NE(e->text.find("at least "), std::string::npos) << e->text;
  EXPECT_NE(e->basis.find("node profile node-a of 2026-11-27T00:00:00Z"), std::string::npos) << e->basis;
}

TEST(StepEstimateTest, TheShapeProfileGivesTheGpuWork) {
  StepEstimateInputs in = Inputs();
  ShapeProfile s;
  s.gpu = "NVIDIA H200";
  s.measured_at = "2026-11-26T00:00:00Z";
  for (int b = 0; b < 4; ++b) s.blocks.push_back({"b", "recompute", 0.05, 0.15, 0.05, 0, 0, 0, 0});
  in.shape = s;
  auto e = EstimateStep(in);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_FALSE(e->lower_bound);
  EXPECT_EQ(e->bound, "GPU");
  EXPECT_NEAR(e->step_seconds, 2 * 4 * 0.2, 1e-9);  // accumulation x blocks x (forward + backward)
  EXPECT_NE(e->basis.find("the shape profile of 2026-11-26T00:00:00Z on NVIDIA H200"), std::string::npos);
  // Held for the clipping norm: the updates (0.1 s) follow the backward (1.2 s) and overlap the
  // next forward (0.4 s): 1.6 s.
  in.held_updates = true;
  e = EstimateStep(in);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->step_seconds, 1.6, 1e-6);
}

// The device reads the fp32 masters and casts them: each upload moves 4 B per parameter (it was
// priced at the compute dtype's 2), twice per micro-batch.
TEST(StepEstimateTest, UploadsArePricedAtTheFp32MastersTheDeviceReads) {
  StepEstimateInputs in = Inputs();
  in.node->h2d_bytes_per_s = 1e8;
  auto e = EstimateStep(in);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->bound, "H2D");
  EXPECT_NEAR(e->step_seconds, 2 * 2 * 6e6 * 4 / 1e8, 1e-9);  // accumulation x 2 passes x 4 B
  in.weights_fp32 = false;                                    // the 16-bit copy in RAM
  e = EstimateStep(in);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->step_seconds, 2 * 2 * 6e6 * 2 / 1e8, 1e-9);
}

TEST(StepEstimateTest, StatesOnNvmeArePricedAtTheStoresRates) {
  StepEstimateInputs in = Inputs();
  in.nvme_params = 6000000;
  auto e = EstimateStep(in);
  ASSERT_TRUE(e.ok());
  EXPECT_NE(e->basis.find("the disk is not priced"), std::string::npos) << e->basis;
  in.node->store_read_bytes_per_s = 1e8;
  in.node->store_write_bytes_per_s = 5e7;
  e = EstimateStep(in);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->bound, "NVMe");
  EXPECT_NEAR(e->step_seconds, 72e6 / 1e8 + 72e6 / 5e7, 1e-9);
}

}  // namespace
}  // namespace offloadd::trainer
