// The compact-mode AdamW step on the GPU (compact_adamw.h): one thread per element, one thread
// block per 256 (the int8 scales' block), the arithmetic compact_adamw_math.h's.
#include "trainer/pipeline/cuda/compact_adamw.h"

namespace offloadd::trainer::cuda {
namespace {

constexpr int kBlock = 256;  // workers::kInt8BlockSize

__device__ __forceinline__ float LoadGrad(const void* g, Grad d, int64_t i) {
  switch (d) {
    case Grad::kBf16:
      return compact::Bf16ToFloat(static_cast<const uint16_t*>(g)[i]);
    case Grad::kFp16:
      return compact::Fp16ToFloat(static_cast<const uint16_t*>(g)[i]);
    case Grad::kFp32:
      break;
  }
  return static_cast<const float*>(g)[i];
}

__global__ void __launch_bounds__(kBlock)
    CompactAdamWKernel(const CompactArgs a, const compact::Scalars s) {
  using namespace compact;
  const int64_t blk = blockIdx.x;
  const int64_t i = blk * kBlock + threadIdx.x;
  const bool live = i < a.n;
  // The block's largest |m| and sqrt(v), on the bit patterns (workers' AbsMax).
  __shared__ unsigned int most[2];
  if (threadIdx.x == 0) most[0] = most[1] = 0;
  __syncthreads();
  float p = 0, m = 0, v = 0;
  if (live) {
    const float g = LoadGrad(a.grad, a.grad_dtype, i);
    p = a.master_comp == nullptr ? static_cast<const float*>(a.master)[i]
                                 : Add(Bf16ToFloat(static_cast<const uint16_t*>(a.master)[i]),
                                       Bf16ToFloat(a.master_comp[i]));
    switch (a.state) {
      case State::kFp32:
        m = static_cast<const float*>(a.exp_avg)[i];
        v = static_cast<const float*>(a.exp_avg_sq)[i];
        break;
      case State::kBf16:
        m = Bf16ToFloat(static_cast<const uint16_t*>(a.exp_avg)[i]);
        v = Bf16ToFloat(static_cast<const uint16_t*>(a.exp_avg_sq)[i]);
        break;
      case State::kInt8:
        m = DecodeInt8M(static_cast<const int8_t*>(a.exp_avg)[i], a.exp_avg_scale[blk]);
        v = DecodeInt8V(static_cast<const uint8_t*>(a.exp_avg_sq)[i], a.exp_avg_sq_scale[blk]);
        break;
    }
    Element(g, &p, &m, &v, s);
    if (a.master_comp == nullptr) {
      static_cast<float*>(a.master)[i] = p;
    } else {  // Kahan: the rounded master and its error
      const uint16_t h = FloatToBf16(p);
      static_cast<uint16_t*>(a.master)[i] = h;
      a.master_comp[i] = FloatToBf16(Sub(p, Bf16ToFloat(h)));
    }
    if (a.weight_dtype == Weights::kBf16) static_cast<uint16_t*>(a.weights)[i] = FloatToBf16(p);
    if (a.weight_dtype == Weights::kFp16) static_cast<uint16_t*>(a.weights)[i] = FloatToFp16(p);
    if (a.state == State::kFp32) {
      static_cast<float*>(a.exp_avg)[i] = m;
      static_cast<float*>(a.exp_avg_sq)[i] = v;
    } else if (a.state == State::kBf16) {
      const auto index = static_cast<uint32_t>(i);
      static_cast<uint16_t*>(a.exp_avg)[i] = Bf16Stochastic(m, index, s.key_m);
      static_cast<uint16_t*>(a.exp_avg_sq)[i] = Bf16Stochastic(v, index, s.key_v);
    }
  }
  if (a.state != State::kInt8) return;  // uniform over the block
  const float sqrt_v = Sqrt(v);
  if (live) {
    atomicMax(&most[0], AbsBits(m));
    atomicMax(&most[1], AbsBits(sqrt_v));
  }
  __syncthreads();  // every thread has read the old scales and added its element
  const float absmax = FromBits(most[0]), top = FromBits(most[1]);
  if (live) {
    static_cast<int8_t*>(a.exp_avg)[i] = EncodeInt8M(m, absmax);
    static_cast<uint8_t*>(a.exp_avg_sq)[i] = EncodeInt8V(sqrt_v, top);
  }
  if (threadIdx.x == 0) {
    a.exp_avg_scale[blk] = absmax;
    a.exp_avg_sq_scale[blk] = top;
  }
}

}  // namespace

cudaError_t CompactAdamW(const CompactArgs& args, const compact::Scalars& s, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  const int64_t blocks = (args.n + kBlock - 1) / kBlock;
  CompactAdamWKernel<<<static_cast<unsigned int>(blocks), kBlock, 0, stream>>>(args, s);
  return cudaGetLastError();
}

}  // namespace offloadd::trainer::cuda
