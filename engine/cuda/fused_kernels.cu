// Fused RMSNorm and SwiGLU kernels; the roundings follow engine/ops.cc's ATen op sequences (see
// fused_kernels.h). __fmul_rn/__fadd_rn/__fsub_rn keep nvcc from contracting a multiply and an
// add that the op sequence rounds separately (two ATen kernels never share an FMA).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "engine/cuda/fused_kernels.h"

namespace offloadd::engine::cuda {
namespace {

template <typename T>
struct Cvt;
template <>
struct Cvt<float> {
  static __device__ __forceinline__ float To(float v) { return v; }
  static __device__ __forceinline__ float From(float v) { return v; }
};
template <>
struct Cvt<__nv_bfloat16> {
  static __device__ __forceinline__ float To(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 From(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Cvt<__half> {
  static __device__ __forceinline__ float To(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half From(float v) { return __float2half_rn(v); }
};

// A value stored in T by the op sequence, read back as fp32.
template <typename T>
__device__ __forceinline__ float Round(float v) {
  return Cvt<T>::To(Cvt<T>::From(v));
}

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> Load(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}
template <typename T, int V>
__device__ __forceinline__ void Store(T* p, int64_t i, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p + i) = v;
}

constexpr int kRowThreads = 256;

// Sum over the block, returned to every thread. `red` holds one float per warp.
__device__ float BlockSum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  const float total = red[0];
  __syncthreads();  // red is reused by the next call
  return total;
}

// ---- RMSNorm ------------------------------------------------------------------------------------

template <typename T, int V>
__global__ void RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ w, float eps,
                                     int64_t h, T* __restrict__ y, float* __restrict__ rstd) {
  __shared__ float red[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  float ss = 0.f;
  for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
    const Pack<T, V> xv = Load<T, V>(x, base + j);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float f = Cvt<T>::To(xv.v[e]);
      ss = __fadd_rn(ss, __fmul_rn(f, f));  // x.float().pow(2), then the mean's sum
    }
  }
  ss = BlockSum(ss, red);
  const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, 1.f / static_cast<float>(h)), eps));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
    const Pack<T, V> xv = Load<T, V>(x, base + j), wv = Load<T, V>(w, j);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float n = Round<T>(__fmul_rn(Cvt<T>::To(xv.v[e]), r));
      out.v[e] = Cvt<T>::From(__fmul_rn(Cvt<T>::To(wv.v[e]), n));
    }
    Store<T, V>(y, base + j, out);
  }
}

template <typename T, int V>
__global__ void RmsNormApplyKernel(const T* __restrict__ x, const T* __restrict__ w,
                                   const float* __restrict__ rstd, int64_t h, T* __restrict__ y) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * h;
  const float r = rstd[blockIdx.x];
  for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
    const Pack<T, V> xv = Load<T, V>(x, base + j), wv = Load<T, V>(w, j);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float n = Round<T>(__fmul_rn(Cvt<T>::To(xv.v[e]), r));
      out.v[e] = Cvt<T>::From(__fmul_rn(Cvt<T>::To(wv.v[e]), n));
    }
    Store<T, V>(y, base + j, out);
  }
}

// Each block walks rows blockIdx.x, +gridDim.x, ...; every thread owns the same columns in every
// row, so its share of dW accumulates in shared memory without atomics and is written once as the
// block's partial row, summed over blocks by ColumnSumKernel.
template <typename T, int V, bool kResidual>
__global__ void RmsNormBackwardKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                      const T* __restrict__ w, const float* __restrict__ rstd,
                                      const T* __restrict__ residual, int64_t rows, int64_t h,
                                      T* __restrict__ dx, float* __restrict__ partial) {
  extern __shared__ float acc[];  // h floats
  __shared__ float red[32];
  for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
#pragma unroll
    for (int e = 0; e < V; ++e) acc[j + e] = 0.f;
  }
  const float inv_h = 1.f / static_cast<float>(h);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * h;
    const float r = rstd[row];
    float dot = 0.f;
    for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
      const Pack<T, V> dyv = Load<T, V>(dy, base + j), xv = Load<T, V>(x, base + j),
                       wv = Load<T, V>(w, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float g = Cvt<T>::To(dyv.v[e]);
        const float n = __fmul_rn(Cvt<T>::To(xv.v[e]), r);
        const float dn = Round<T>(__fmul_rn(g, Cvt<T>::To(wv.v[e])));
        dot = __fadd_rn(dot, __fmul_rn(dn, n));
        acc[j + e] = __fadd_rn(acc[j + e], Round<T>(__fmul_rn(g, Round<T>(n))));
      }
    }
    dot = __fmul_rn(BlockSum(dot, red), inv_h);
    for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
      const Pack<T, V> dyv = Load<T, V>(dy, base + j), xv = Load<T, V>(x, base + j),
                       wv = Load<T, V>(w, j);
      Pack<T, V> out;
      Pack<T, V> res;
      if (kResidual) res = Load<T, V>(residual, base + j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float n = __fmul_rn(Cvt<T>::To(xv.v[e]), r);
        const float dn = Round<T>(__fmul_rn(Cvt<T>::To(dyv.v[e]), Cvt<T>::To(wv.v[e])));
        const float d = __fmul_rn(r, __fsub_rn(dn, __fmul_rn(n, dot)));
        out.v[e] = kResidual ? Cvt<T>::From(__fadd_rn(Cvt<T>::To(res.v[e]), Round<T>(d)))
                             : Cvt<T>::From(d);
      }
      Store<T, V>(dx, base + j, out);
    }
  }
  for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
#pragma unroll
    for (int e = 0; e < V; ++e) partial[blockIdx.x * h + j + e] = acc[j + e];
  }
}

// out[j] = sum_b partial[b][j], rounded to T. Block (32, 8): 32 columns, 8 lanes over b.
template <typename T>
__global__ void ColumnSumKernel(const float* __restrict__ partial, int64_t parts, int64_t h,
                                T* __restrict__ out) {
  __shared__ float s[8][33];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float v = 0.f;
  if (j < h) {
    for (int64_t b = threadIdx.y; b < parts; b += 8) v += partial[b * h + j];
  }
  s[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && j < h) {
    float t = 0.f;
    for (int k = 0; k < 8; ++k) t += s[k][threadIdx.x];
    out[j] = Cvt<T>::From(t);
  }
}

// ---- SwiGLU -------------------------------------------------------------------------------------

// ATen's silu and silu_backward, in fp32 (their opmath type).
__device__ __forceinline__ float Silu(float x) { return x / (1.f + expf(-x)); }
__device__ __forceinline__ float SiluBackward(float dy, float x) {
  const float s = 1.f / (1.f + expf(-x));
  return dy * s * (1.f + x * (1.f - s));
}

template <typename T, int V>
__global__ void SwiGluForwardKernel(const T* __restrict__ g, const T* __restrict__ u, int64_t n,
                                    T* __restrict__ a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += stride) {
    const Pack<T, V> gv = Load<T, V>(g, i), uv = Load<T, V>(u, i);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float s = Round<T>(Silu(Cvt<T>::To(gv.v[e])));
      out.v[e] = Cvt<T>::From(__fmul_rn(s, Cvt<T>::To(uv.v[e])));
    }
    Store<T, V>(a, i, out);
  }
}

template <typename T, int V, bool kProduct>
__global__ void SwiGluBackwardKernel(const T* __restrict__ da, const T* __restrict__ g,
                                     const T* __restrict__ u, int64_t n, T* __restrict__ dg,
                                     T* __restrict__ du, T* __restrict__ a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += stride) {
    const Pack<T, V> dav = Load<T, V>(da, i), gv = Load<T, V>(g, i), uv = Load<T, V>(u, i);
    Pack<T, V> dgv, duv, av;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = Cvt<T>::To(dav.v[e]), x = Cvt<T>::To(gv.v[e]), up = Cvt<T>::To(uv.v[e]);
      const float s = Round<T>(Silu(x));
      dgv.v[e] = Cvt<T>::From(SiluBackward(Round<T>(__fmul_rn(d, up)), x));
      duv.v[e] = Cvt<T>::From(__fmul_rn(d, s));
      if (kProduct) av.v[e] = Cvt<T>::From(__fmul_rn(s, up));
    }
    Store<T, V>(dg, i, dgv);
    Store<T, V>(du, i, duv);
    if (kProduct) Store<T, V>(a, i, av);
  }
}

// ---- launch -------------------------------------------------------------------------------------

template <typename T>
constexpr int kVec = 16 / sizeof(T);

bool Aligned(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

template <typename F>
void ForType(DType t, F&& f) {
  switch (t) {
    case DType::kFloat: f(float{}); break;
    case DType::kBFloat16: f(__nv_bfloat16{}); break;
    case DType::kHalf: f(__half{}); break;
  }
}

int64_t BackwardBlocks(int64_t rows) {
  // A fixed cap (not derived from the device) keeps the dW sum order the same on every GPU.
  return std::max<int64_t>(1, std::min<int64_t>(1024, (rows + 7) / 8));
}

int64_t ElementwiseBlocks(int64_t n, int v) {
  return std::max<int64_t>(1, std::min<int64_t>(4096, (n / v + 255) / 256));
}

}  // namespace

void RmsNormForward(DType t, const void* x, const void* w, float eps, int64_t rows, int64_t h,
                    void* y, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    auto px = static_cast<const T*>(x);
    auto pw = static_cast<const T*>(w);
    auto py = static_cast<T*>(y);
    if (h % kVec<T> == 0 && Aligned({x, w, y})) {
      RmsNormForwardKernel<T, kVec<T>><<<rows, kRowThreads, 0, stream>>>(px, pw, eps, h, py, rstd);
    } else {
      RmsNormForwardKernel<T, 1><<<rows, kRowThreads, 0, stream>>>(px, pw, eps, h, py, rstd);
    }
  });
}

void RmsNormApply(DType t, const void* x, const void* w, const float* rstd, int64_t rows, int64_t h,
                  void* y, cudaStream_t stream) {
  if (rows == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    auto px = static_cast<const T*>(x);
    auto pw = static_cast<const T*>(w);
    auto py = static_cast<T*>(y);
    if (h % kVec<T> == 0 && Aligned({x, w, y})) {
      RmsNormApplyKernel<T, kVec<T>><<<rows, kRowThreads, 0, stream>>>(px, pw, rstd, h, py);
    } else {
      RmsNormApplyKernel<T, 1><<<rows, kRowThreads, 0, stream>>>(px, pw, rstd, h, py);
    }
  });
}

int64_t RmsNormBackwardScratch(int64_t rows, int64_t h) { return BackwardBlocks(rows) * h; }

void RmsNormBackward(DType t, const void* dy, const void* x, const void* w, const float* rstd,
                     const void* residual, int64_t rows, int64_t h, void* dx, void* dw,
                     float* partial, cudaStream_t stream) {
  const int64_t blocks = BackwardBlocks(rows);
  const size_t smem = static_cast<size_t>(h) * sizeof(float);
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      if (smem + 1024 > 48 * 1024) {  // dynamic + static (red) above the default 48 KiB
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
      }
      if (rows > 0) {
        kernel<<<blocks, kRowThreads, smem, stream>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), rstd,
            static_cast<const T*>(residual), rows, h, static_cast<T*>(dx), partial);
      } else {
        cudaMemsetAsync(partial, 0, static_cast<size_t>(blocks * h) * sizeof(float), stream);
      }
    };
    const bool vec = h % kVec<T> == 0 && Aligned({dy, x, w, residual, dx});
    if (vec && residual) launch(RmsNormBackwardKernel<T, kVec<T>, true>);
    if (vec && !residual) launch(RmsNormBackwardKernel<T, kVec<T>, false>);
    if (!vec && residual) launch(RmsNormBackwardKernel<T, 1, true>);
    if (!vec && !residual) launch(RmsNormBackwardKernel<T, 1, false>);
    ColumnSumKernel<T><<<(h + 31) / 32, dim3(32, 8), 0, stream>>>(partial, blocks, h,
                                                                  static_cast<T*>(dw));
  });
}

void SwiGluForward(DType t, const void* g, const void* u, int64_t n, void* a, cudaStream_t stream) {
  if (n == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    auto pg = static_cast<const T*>(g);
    auto pu = static_cast<const T*>(u);
    auto pa = static_cast<T*>(a);
    if (n % kVec<T> == 0 && Aligned({g, u, a})) {
      SwiGluForwardKernel<T, kVec<T>>
          <<<ElementwiseBlocks(n, kVec<T>), 256, 0, stream>>>(pg, pu, n, pa);
    } else {
      SwiGluForwardKernel<T, 1><<<ElementwiseBlocks(n, 1), 256, 0, stream>>>(pg, pu, n, pa);
    }
  });
}

void SwiGluBackward(DType t, const void* da, const void* g, const void* u, int64_t n, void* dg,
                    void* du, void* a, cudaStream_t stream) {
  if (n == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel, int v) {
      kernel<<<ElementwiseBlocks(n, v), 256, 0, stream>>>(
          static_cast<const T*>(da), static_cast<const T*>(g), static_cast<const T*>(u), n,
          static_cast<T*>(dg), static_cast<T*>(du), static_cast<T*>(a));
    };
    const bool vec = n % kVec<T> == 0 && Aligned({da, g, u, dg, du, a});
    if (vec && a) launch(SwiGluBackwardKernel<T, kVec<T>, true>, kVec<T>);
    if (vec && !a) launch(SwiGluBackwardKernel<T, kVec<T>, false>, kVec<T>);
    if (!vec && a) launch(SwiGluBackwardKernel<T, 1, true>, 1);
    if (!vec && !a) launch(SwiGluBackwardKernel<T, 1, false>, 1);
  });
}

}  // namespace offloadd::engine::cuda
