// The GPU's compact-mode AdamW step (trainer/pipeline/cuda/compact_adamw.h) against the CPU
// workers' workers::CompactAdamW, bit for bit: on the CPU, the kernel's per-element arithmetic
// (compact_adamw_math.h, the functions the kernel runs) in the kernel's block structure; on a GPU,
// the kernel itself. Three steps from zero states over a tensor whose last block is partial, in
// every combination of state and master dtype, with bf16 and fp32 (accumulated) gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "trainer/pipeline/cuda/compact_adamw_math.h"
#include "workers/adamw_compact.h"
#include "workers/adamw_compact_impl.h"
#if OFFLOADD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "trainer/pipeline/cuda/compact_adamw.h"
#endif

namespace offloadd::trainer {
namespace {

using workers::GradDtype;
using workers::MasterDtype;
using workers::OptimizerMode;
using workers::StateDtype;
using workers::WeightDtype;

constexpr uint64_t kN = 3 * 256 + 77;  // a partial last block
constexpr uint64_t kSeed = 5;          // the block's index

// One tensor's regions (as the arena and DeviceOptimizer hold them) and its 16-bit copy.
struct Regions {
  std::vector<uint8_t> master, m, v;
  std::vector<uint16_t> weights;
  bool operator==(const Regions&) const = default;
};

Regions Initial(OptimizerMode mode) {
  Regions r;
  r.master.assign(workers::MasterRegionBytes(mode.master, kN), 0);
  r.m.assign(workers::StateRegionBytes(mode.state, kN), 0);
  r.v.assign(workers::StateRegionBytes(mode.state, kN), 0);
  r.weights.assign(kN, 0);
  std::mt19937 rng(11);
  std::normal_distribution<float> w(0.0f, 0.02f);
  std::vector<float> p(kN);
  for (float& x : p) x = w(rng);
  p[7] = 1.0f;  // an update far below the bf16 master's ulp: the compensation keeps it
  if (mode.master == MasterDtype::kFp32) {
    std::memcpy(r.master.data(), p.data(), 4 * kN);
  } else {
    workers::EncodeBf16Master(
        p.data(), kN, reinterpret_cast<uint16_t*>(r.master.data()),
        reinterpret_cast<uint16_t*>(r.master.data() + workers::MasterCompOffset(kN)));
  }
  return r;
}

// The step's gradients: bf16, or fp32 (an accumulator), with a few large and zero elements so
// the int8 blocks' scales and the v > 0 floor act.
std::vector<uint8_t> Gradients(GradDtype dt, int step) {
  std::mt19937 rng(100 + step);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  std::vector<float> f(kN);
  for (float& x : f) x = g(rng);
  f[3] = 0.5f;
  f[300] = 0.0f;
  f[kN - 1] = -2.0f;
  std::vector<uint8_t> out(kN * (dt == GradDtype::kFp32 ? 4 : 2));
  for (uint64_t i = 0; i < kN; ++i) {
    if (dt == GradDtype::kFp32) {
      std::memcpy(out.data() + 4 * i, &f[i], 4);
    } else {
      const uint16_t b = workers::internal::FloatToBf16(f[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

workers::AdamWHyper Hyper(int step) {
  workers::AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  h.step = static_cast<uint64_t>(step);
  h.grad_scale = 0.75f;  // a clip coefficient
  return h;
}

compact::Scalars ScalarsOf(const workers::AdamWHyper& h) {
  const workers::internal::AdamWScalars x = workers::internal::MakeScalars(h);
  return {x.grad_scale,
          x.decay,
          x.lerp_coeff,
          x.beta2,
          x.one_minus_beta2,
          x.neg_step_size,
          x.bc2_sqrt,
          x.eps,
          workers::internal::SrKey(kSeed, h.step, 0),
          workers::internal::SrKey(kSeed, h.step, 1),
          x.lerp_small,
          x.decay_on};
}

workers::CompactSpan SpanOf(Regions* r, OptimizerMode mode, const std::vector<uint8_t>& grad,
                            GradDtype gd) {
  workers::CompactSpan s =
      workers::CompactSpanAt(mode, r->master.data(), r->m.data(), r->v.data(), kN, 0, kN);
  s.grad = grad.data();
  s.grad_dtype = gd;
  const bool copy = mode.master == MasterDtype::kFp32;
  s.weights = copy ? r->weights.data() : nullptr;
  s.weight_dtype = copy ? WeightDtype::kBf16 : WeightDtype::kNone;
  s.seed = kSeed;
  return s;
}

// The kernel's structure on the CPU: each 256-element block decodes, steps each element with
// compact::Element, then encodes with the block's largest |m| and sqrt(v).
void EmulatedStep(const workers::CompactSpan& s, OptimizerMode mode, const compact::Scalars& c) {
  using namespace compact;
  for (uint64_t b0 = 0; b0 < s.n; b0 += 256) {
    const uint64_t len = std::min<uint64_t>(256, s.n - b0), blk = b0 / 256;
    float p[256], m[256], v[256], sq[256];
    uint32_t most_m = 0, most_v = 0;
    for (uint64_t t = 0; t < len; ++t) {
      const uint64_t i = b0 + t;
      const float g = s.grad_dtype == GradDtype::kFp32
                          ? static_cast<const float*>(s.grad)[i]
                          : Bf16ToFloat(static_cast<const uint16_t*>(s.grad)[i]);
      p[t] = mode.master == MasterDtype::kFp32
                 ? static_cast<float*>(s.master)[i]
                 : Add(Bf16ToFloat(static_cast<uint16_t*>(s.master)[i]),
                       Bf16ToFloat(s.master_comp[i]));
      if (mode.state == StateDtype::kFp32) {
        m[t] = static_cast<float*>(s.exp_avg)[i];
        v[t] = static_cast<float*>(s.exp_avg_sq)[i];
      } else if (mode.state == StateDtype::kBf16) {
        m[t] = Bf16ToFloat(static_cast<uint16_t*>(s.exp_avg)[i]);
        v[t] = Bf16ToFloat(static_cast<uint16_t*>(s.exp_avg_sq)[i]);
      } else {
        m[t] = DecodeInt8M(static_cast<int8_t*>(s.exp_avg)[i], s.exp_avg_scale[blk]);
        v[t] = DecodeInt8V(static_cast<uint8_t*>(s.exp_avg_sq)[i], s.exp_avg_sq_scale[blk]);
      }
      Element(g, &p[t], &m[t], &v[t], c);
      if (mode.master == MasterDtype::kFp32) {
        static_cast<float*>(s.master)[i] = p[t];
        static_cast<uint16_t*>(s.weights)[i] = FloatToBf16(p[t]);
      } else {
        const uint16_t h = FloatToBf16(p[t]);
        static_cast<uint16_t*>(s.master)[i] = h;
        s.master_comp[i] = FloatToBf16(Sub(p[t], Bf16ToFloat(h)));
      }
      if (mode.state == StateDtype::kFp32) {
        static_cast<float*>(s.exp_avg)[i] = m[t];
        static_cast<float*>(s.exp_avg_sq)[i] = v[t];
      } else if (mode.state == StateDtype::kBf16) {
        const auto index = static_cast<uint32_t>(i);
        static_cast<uint16_t*>(s.exp_avg)[i] = Bf16Stochastic(m[t], index, c.key_m);
        static_cast<uint16_t*>(s.exp_avg_sq)[i] = Bf16Stochastic(v[t], index, c.key_v);
      }
      sq[t] = Sqrt(v[t]);
      most_m = std::max(most_m, AbsBits(m[t]));
      most_v = std::max(most_v, AbsBits(sq[t]));
    }
    if (mode.state != StateDtype::kInt8) continue;
    const float absmax = FromBits(most_m), top = FromBits(most_v);
    for (uint64_t t = 0; t < len; ++t) {
      static_cast<int8_t*>(s.exp_avg)[b0 + t] = EncodeInt8M(m[t], absmax);
      static_cast<uint8_t*>(s.exp_avg_sq)[b0 + t] = EncodeInt8V(sq[t], top);
    }
    s.exp_avg_scale[blk] = absmax;
    s.exp_avg_sq_scale[blk] = top;
  }
}

struct Case {
  StateDtype state;
  MasterDtype master;
  GradDtype grad;
};

class CompactAdamWKernelTest : public ::testing::TestWithParam<Case> {};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(workers::MasterDtypeName(c.master)) + "_master_" +
         std::string(workers::StateDtypeName(c.state)) + "_states_" +
         (c.grad == GradDtype::kFp32 ? "fp32" : "bf16") + "_grads";
}

TEST_P(CompactAdamWKernelTest, KernelArithmeticOnTheCpuMatchesTheWorkersBitForBit) {
  const Case c = GetParam();
  const OptimizerMode mode{c.state, c.master};
  Regions host = Initial(mode), emulated = Initial(mode);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<uint8_t> grad = Gradients(c.grad, step);
    const workers::AdamWHyper h = Hyper(step);
    ASSERT_TRUE(workers::CompactAdamW(SpanOf(&host, mode, grad, c.grad), mode, h,
                                      workers::KernelPath::kPortable)
                    .ok());
    EmulatedStep(SpanOf(&emulated, mode, grad, c.grad), mode, ScalarsOf(h));
    ASSERT_TRUE(host == emulated) << "step " << step;
  }
  // The step acted: the master moved (the masters are regions of their own format).
  EXPECT_NE(host.master, Initial(mode).master);
}

#if OFFLOADD_WITH_CUDA
// A device copy of a host buffer, freed with it.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(const void* host, size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host, n, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void CopyTo(void* host) const {
    EXPECT_EQ(cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  template <typename T>
  T* at(uint64_t offset = 0) const {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(ptr) + offset);
  }
};
#endif

TEST_P(CompactAdamWKernelTest, CudaKernelMatchesTheWorkersBitForBit) {
#if OFFLOADD_WITH_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "needs a CUDA device";
  }
  const Case c = GetParam();
  const OptimizerMode mode{c.state, c.master};
  Regions host = Initial(mode), gpu = Initial(mode);
  DeviceBuffer master(gpu.master.data(), gpu.master.size());
  DeviceBuffer m(gpu.m.data(), gpu.m.size()), v(gpu.v.data(), gpu.v.size());
  DeviceBuffer weights(gpu.weights.data(), 2 * kN);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<uint8_t> grad = Gradients(c.grad, step);
    const workers::AdamWHyper h = Hyper(step);
    ASSERT_TRUE(workers::CompactAdamW(SpanOf(&host, mode, grad, c.grad), mode, h,
                                      workers::KernelPath::kPortable)
                    .ok());
    DeviceBuffer g(grad.data(), grad.size());
    cuda::CompactArgs a;
    a.grad = g.ptr;
    a.grad_dtype = c.grad == GradDtype::kFp32 ? cuda::Grad::kFp32 : cuda::Grad::kBf16;
    a.master = master.ptr;
    a.master_comp = c.master == MasterDtype::kBf16
                        ? master.at<uint16_t>(workers::MasterCompOffset(kN))
                        : nullptr;
    a.exp_avg = m.ptr;
    a.exp_avg_sq = v.ptr;
    if (c.state == StateDtype::kInt8) {
      a.exp_avg_scale = m.at<float>(workers::Int8ScalesOffset(kN));
      a.exp_avg_sq_scale = v.at<float>(workers::Int8ScalesOffset(kN));
    }
    a.state = c.state == StateDtype::kInt8   ? cuda::State::kInt8
              : c.state == StateDtype::kBf16 ? cuda::State::kBf16
                                             : cuda::State::kFp32;
    a.weights = c.master == MasterDtype::kFp32 ? weights.ptr : nullptr;
    a.weight_dtype = c.master == MasterDtype::kFp32 ? cuda::Weights::kBf16 : cuda::Weights::kNone;
    a.n = static_cast<int64_t>(kN);
    ASSERT_EQ(cuda::CompactAdamW(a, ScalarsOf(h), nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    master.CopyTo(gpu.master.data());
    m.CopyTo(gpu.m.data());
    v.CopyTo(gpu.v.data());
    weights.CopyTo(gpu.weights.data());
    if (c.master == MasterDtype::kBf16) gpu.weights = host.weights;  // no copy in this mode
    ASSERT_TRUE(host.master == gpu.master) << "master, step " << step;
    ASSERT_TRUE(host.m == gpu.m) << "exp_avg, step " << step;
    ASSERT_TRUE(host.v == gpu.v) << "exp_avg_sq, step " << step;
    ASSERT_TRUE(host.weights == gpu.weights) << "weights, step " << step;
  }
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CompactAdamWKernelTest,
    ::testing::Values(Case{StateDtype::kBf16, MasterDtype::kFp32, GradDtype::kBf16},
                      Case{StateDtype::kInt8, MasterDtype::kFp32, GradDtype::kBf16},
                      Case{StateDtype::kInt8, MasterDtype::kFp32, GradDtype::kFp32},
                      Case{StateDtype::kFp32, MasterDtype::kBf16, GradDtype::kBf16},
                      Case{StateDtype::kBf16, MasterDtype::kBf16, GradDtype::kFp32},
                      Case{StateDtype::kInt8, MasterDtype::kBf16, GradDtype::kBf16}),
    Name);

}  // namespace
}  // namespace offloadd::trainer
