// LibTorch on the GPU: the CUDA flavour links, finds the device, and computes what the CPU does.
#include <torch/torch.h>

#include <gtest/gtest.h>

namespace {

bool HaveCuda() { return torch::cuda::is_available() && torch::cuda::device_count() > 0; }

TEST(TorchCudaTest, MatmulMatchesCpu) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device (this build: OFFLOADD_WITH_CUDA=" << OFFLOADD_WITH_CUDA << ")";
  torch::manual_seed(0);
  const auto a = torch::randn({512, 256}, torch::kFloat64);
  const auto b = torch::randn({256, 384}, torch::kFloat64);
  const auto cpu = torch::matmul(a, b);
  const auto gpu = torch::matmul(a.cuda(), b.cuda()).cpu();
  EXPECT_TRUE(torch::allclose(cpu, gpu, /*rtol=*/1e-10, /*atol=*/1e-10));
}

TEST(TorchCudaTest, Bf16SdpaMatchesFp32Reference) {
  if (!HaveCuda()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(0);
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  const auto q = torch::randn({2, 8, 128, 64}, opts);
  const auto k = torch::randn({2, 8, 128, 64}, opts);
  const auto v = torch::randn({2, 8, 128, 64}, opts);
  const auto ref = at::scaled_dot_product_attention(q.to(torch::kFloat64), k.to(torch::kFloat64),
                                                    v.to(torch::kFloat64), {}, 0.0, /*is_causal=*/true);
  const auto got = at::scaled_dot_product_attention(q.to(torch::kBFloat16), k.to(torch::kBFloat16),
                                                    v.to(torch::kBFloat16), {}, 0.0, /*is_causal=*/true);
  // bf16 has an 8-bit mantissa: 2^-8 relative per element, accumulated over 64-wide dots.
  const double max_err = (got.to(torch::kFloat64) - ref).abs().max().item<double>();
  EXPECT_LT(max_err, 3e-2) << "max abs error " << max_err;
}

}  // namespace
