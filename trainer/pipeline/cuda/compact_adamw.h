// The compact-mode AdamW step on the GPU: the same formats and the same bits as the CPU workers'
// workers::CompactAdamW (bf16 states stochastically rounded, int8 blockwise states with their
// per-block scales and the sqrt map for v, a bf16 master with its Kahan compensation), for the
// blocks whose AdamW states the planner puts on the GPU (DeviceOptimizer). One thread block per
// workers::kInt8BlockSize elements; the arithmetic is compact_adamw_math.h's.
//
// Plain pointers and a stream, no ATen: nvcc never compiles the LibTorch headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainer/pipeline/cuda/compact_adamw_math.h"

namespace offloadd::trainer::cuda {

enum class Grad : uint8_t { kBf16, kFp16, kFp32 };
enum class Weights : uint8_t { kNone, kBf16, kFp16 };
enum class State : uint8_t { kFp32, kBf16, kInt8 };

// One tensor's regions as workers::MasterRegionBytes / StateRegionBytes lay them out, on the
// device. The stochastic-rounding counter is the element's index in the tensor (first element 0),
// as the CPU workers count it in a shard that is the whole block.
struct CompactArgs {
  const void* grad = nullptr;
  Grad grad_dtype = Grad::kBf16;
  void* master = nullptr;             // float[n], or bf16[n] for a bf16 master
  uint16_t* master_comp = nullptr;    // bf16 master: its compensation, else null
  void* exp_avg = nullptr;            // float[n], bf16[n] or int8[n]
  void* exp_avg_sq = nullptr;         // float[n], bf16[n] or uint8[n] (sqrt(v))
  float* exp_avg_scale = nullptr;     // int8: one per block of 256
  float* exp_avg_sq_scale = nullptr;  // int8
  State state = State::kFp32;
  void* weights = nullptr;  // the 16-bit copy the step writes, or null (kNone)
  Weights weight_dtype = Weights::kNone;
  int64_t n = 0;
};

// Launches the step on `stream`; returns the launch's error (cudaSuccess).
cudaError_t CompactAdamW(const CompactArgs& args, const compact::Scalars& s, cudaStream_t stream);

}  // namespace offloadd::trainer::cuda
