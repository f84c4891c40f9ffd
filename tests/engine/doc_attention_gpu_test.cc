// Attention within documents on CUDA (label "gpu"; skips without a device): FlashAttention-2's
// variable-length kernels in bf16 against the masked fp32 reference on the CPU (ops::Attention
// with ops::SegmentMask), forward and backward, packed documents, grouped-query heads, with and
// without a sliding window; the tiled path in fp32 on CUDA (soft-capping); and a packed 32K-token
// row whose attention forward+backward peak is O(T).
//
// Tolerances, relative ||a - b|| / ||b|| over whole tensors, from bf16's unit roundoff
// u = 2^-9 ~ 2e-3 with the inputs already bf16 (the reference sees the same values in fp32):
// the output is rounded once and the kernel rounds P to bf16 before P V, so ~2u -> 1e-2; the
// gradients go through dS = P (dP - rowsum(dO * O)), whose cancellation and the rounded dO, O,
// P inputs give several u -> 3e-2. fp32 on CUDA: sums in another order than the CPU's, 1e-5.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/doc_attention.h"
#include "engine/ops.h"

namespace offloadd::engine {
namespace {

double RelErr(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor af = a.to(at::kCPU, at::kFloat), bf = b.to(at::kCPU, at::kFloat);
  return ((af - bf).norm() / (bf.norm() + 1e-12)).item<double>();
}

at::Tensor Segments(int64_t b, const std::vector<std::vector<int64_t>>& runs) {
  std::vector<at::Tensor> rows;
  for (int64_t r = 0; r < b; ++r) {
    std::vector<int64_t> ids;
    int64_t id = 0;
    for (int64_t len : runs[r]) ids.insert(ids.end(), len, id++);
    rows.push_back(at::tensor(ids, at::kLong));
  }
  return at::stack(rows);
}

struct Grads {
  at::Tensor out, dq, dk, dv;
};

Grads Reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& dout, const at::Tensor& seg, double scale, int64_t window,
                double softcap) {
  auto f = [](const at::Tensor& t) { return t.to(at::kCPU, at::kFloat); };
  const at::Tensor mask = ops::SegmentMask(seg, at::kFloat, window);
  std::vector<at::Tensor> aux;
  Grads g;
  g.out = ops::Attention(f(q), f(k), f(v), scale, mask, &aux, softcap);
  ops::AttentionBackward(f(dout), f(q), f(k), f(v), g.out, aux.data(), scale, mask, &g.dq, &g.dk,
                         &g.dv, softcap);
  return g;
}

Grads Documents(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& dout, const at::Tensor& seg, double scale, int64_t window,
                double softcap) {
  const ops::Documents docs = ops::DocumentsOf(seg, q.device());
  std::vector<at::Tensor> aux;
  Grads g;
  g.out = ops::DocumentAttention(q, k, v, scale, docs, window, softcap, &aux);
  ops::DocumentAttentionBackward(dout, q, k, v, g.out, aux.data(), scale, docs, window, softcap,
                                 &g.dq, &g.dk, &g.dv);
  return g;
}

class DocAttentionGpuTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (CPU-only machine or CPU flavour)";
  }
};

TEST_P(DocAttentionGpuTest, VarlenFlashBf16MatchesMaskedFp32) {
  const int64_t window = GetParam();
  at::manual_seed(5);
  const int64_t b = 2, h = 8, hkv = 2, t = 1024, d = 64;
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor q = at::randn({b, h, t, d}, opts), k = at::randn({b, hkv, t, d}, opts);
  at::Tensor v = at::randn({b, hkv, t, d}, opts), dout = at::randn({b, h, t, d}, opts);
  at::Tensor seg = Segments(b, {{700, 300, 24}, {100, 924}});
  ASSERT_TRUE(ops::VarlenFlashFits(q.device(), q.scalar_type(), d, 0.0));
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Grads ref = Reference(q, k, v, dout, seg, scale, window, 0.0);
  const Grads got = Documents(q, k, v, dout, seg, scale, window, 0.0);
  EXPECT_EQ(got.dk.sizes(), k.sizes());
  EXPECT_LE(RelErr(got.out, ref.out), 1e-2);
  EXPECT_LE(RelErr(got.dq, ref.dq), 3e-2);
  EXPECT_LE(RelErr(got.dk, ref.dk), 3e-2);
  EXPECT_LE(RelErr(got.dv, ref.dv), 3e-2);
  // Documents do not see each other: a change in document 0 of row 1 leaves document 1 alone.
  at::Tensor v2 = v.clone();
  v2.select(0, 1).narrow(1, 0, 100).mul_(3);
  const ops::Documents docs = ops::DocumentsOf(seg, q.device());
  at::Tensor o2 = ops::DocumentAttention(q, k, v2, scale, docs, window, 0.0, nullptr);
  EXPECT_TRUE(
      at::equal(o2.select(0, 1).narrow(1, 100, 924), got.out.select(0, 1).narrow(1, 100, 924)));
}

INSTANTIATE_TEST_SUITE_P(Windows, DocAttentionGpuTest, ::testing::Values(0, 96),
                         [](const auto& p) { return "window" + std::to_string(p.param); });

TEST(DocAttentionGpuFp32Test, TiledPathOnCudaMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(6);
  const int64_t b = 1, h = 4, t = 700, d = 32;
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor q = at::randn({b, h, t, d}, opts), k = at::randn({b, 2, t, d}, opts);
  at::Tensor v = at::randn({b, 2, t, d}, opts), dout = at::randn({b, h, t, d}, opts);
  at::Tensor seg = Segments(b, {{600, 100}});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Grads ref = Reference(q, k, v, dout, seg, scale, 50, 2.0);
  const Grads got = Documents(q, k, v, dout, seg, scale, 50, 2.0);
  EXPECT_LE(RelErr(got.out, ref.out), 1e-5);
  EXPECT_LE(RelErr(got.dq, ref.dq), 1e-5);
  EXPECT_LE(RelErr(got.dk, ref.dk), 1e-5);
  EXPECT_LE(RelErr(got.dv, ref.dv), 1e-5);
}

// A Llama-3-8B attention (32 heads, 8 key/value heads, head_dim 128) over one packed 32K-token row
// in four documents: the peak is the outputs, gradients and the kernels' layout copies and fp32
// dQ accumulator, O(T) (16 x q's 256 MiB bounds it); a [T, T] bf16 tensor per head is 64 GiB.
TEST(DocAttentionGpuLongTest, Packed32kRowPeakIsLinear) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
#if OFFLOADD_WITH_CUDA
  at::manual_seed(7);
  const int64_t t = 32768, h = 32, hkv = 8, d = 128;
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  at::Tensor q = at::randn({1, h, t, d}, opts), k = at::randn({1, hkv, t, d}, opts);
  at::Tensor v = at::randn({1, hkv, t, d}, opts), dout = at::randn({1, h, t, d}, opts);
  const ops::Documents docs =
      ops::DocumentsOf(Segments(1, {{16384, 8192, 6144, 2048}}), q.device());
  const int dev = q.get_device();
  for (int window : {0, 4096}) {
    at::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::resetPeakStats(dev);
    const int64_t before =
        c10::cuda::CUDACachingAllocator::getDeviceStats(dev).allocated_bytes[0].current;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<at::Tensor> aux;
    at::Tensor out =
        ops::DocumentAttention(q, k, v, 1.0 / std::sqrt(128.0), docs, window, 0.0, &aux);
    at::Tensor dq, dk, dv;
    ops::DocumentAttentionBackward(dout, q, k, v, out, aux.data(), 1.0 / std::sqrt(128.0), docs,
                                   window, 0.0, &dq, &dk, &dv);
    at::cuda::device_synchronize();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const int64_t peak =
        c10::cuda::CUDACachingAllocator::getDeviceStats(dev).allocated_bytes[0].peak - before;
    const int64_t q_bytes = q.numel() * 2;
    std::printf(
        "packed 32K row, window %d: forward+backward %.1f ms (first call included), "
        "peak %.2f GiB above the inputs (q: %.2f GiB)\n",
        window, ms, static_cast<double>(peak) / (1 << 30),
        static_cast<double>(q_bytes) / (1 << 30));
    EXPECT_LT(peak, 16 * q_bytes);
  }
#endif
}

}  // namespace
}  // namespace offloadd::engine
