// Fused RMSNorm and gated-MLP (SwiGLU, GeGLU) kernels; the roundings follow engine/ops.cc's ATen
// op sequences (see fused_kernels.h). __fmul_rn/__fadd_rn/__fsub_rn keep nvcc from contracting a
// multiply and an add that the op sequence rounds separately (two ATen kernels never share an
// FMA); the activations are written as ATen writes them, so that both contract alike.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

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

// Sum over the G threads of a row: a shuffle tree inside aligned groups of G lanes for G <= 32
// (every lane of the warp must call it), BlockSum for a block per row.
template <int G>
__device__ __forceinline__ float RowSum(float v, float* red) {
  if constexpr (G <= 32) {
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  } else {
    return BlockSum(v, red);
  }
}

// ---- RMSNorm ------------------------------------------------------------------------------------

// y from n = x * rstd (fp32) and the weight w (read exactly as fp32).
template <typename T, RmsScale S>
__device__ __forceinline__ T ScaleOut(float n, float w) {
  if constexpr (S == RmsScale::kCastThenScale) {
    return Cvt<T>::From(__fmul_rn(w, Round<T>(n)));  // w * n.to(dtype), in the dtype
  } else if constexpr (S == RmsScale::kScaleThenCast) {
    return Cvt<T>::From(__fmul_rn(w, n));  // (w.float() * n).to(dtype)
  } else {
    return Cvt<T>::From(__fmul_rn(n, __fadd_rn(w, 1.f)));  // (n * (1 + w.float())).to(dtype)
  }
}

// d loss/d n (fp32) and the row's term of d loss/d w for one element (g = dy).
template <typename T, RmsScale S>
__device__ __forceinline__ void NormGrad(float g, float n, float w, float* dn, float* dw_term) {
  if constexpr (S == RmsScale::kCastThenScale) {
    *dn = Round<T>(__fmul_rn(g, w));                // (dy * w) in the dtype, then .float()
    *dw_term = Round<T>(__fmul_rn(g, Round<T>(n)));  // dy * n.to(dtype), in the dtype
  } else {
    const float s = S == RmsScale::kOneOffset ? __fadd_rn(w, 1.f) : w;
    *dn = __fmul_rn(g, s);  // all fp32
    *dw_term = __fmul_rn(g, n);
  }
}

// Rows of G threads: G = kRowThreads is one row per block (long rows); G = 16 or 32 packs
// blockDim / G rows into a block (short rows: per-head q/k norm over head_dim), each group of G
// lanes of one warp reducing with shuffles. A group past the last row still joins its warp's
// shuffles, then writes nothing.
template <int G>
__device__ __forceinline__ int64_t RowOf() {
  return G <= 32 ? static_cast<int64_t>(blockIdx.x) * (blockDim.x / G) + threadIdx.x / G
                 : static_cast<int64_t>(blockIdx.x);
}

// y = w-scaled x * r over one row (this thread's packs of it): the forward's and the re-apply's
// output.
template <typename T, int V, int G, RmsScale S>
__device__ __forceinline__ void ScaleRow(const T* x, const T* w, int64_t base, int64_t h, int lane,
                                         float r, T* y) {
  for (int64_t j = lane * V; j < h; j += G * V) {
    const Pack<T, V> xv = Load<T, V>(x, base + j), wv = Load<T, V>(w, j);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      out.v[e] = ScaleOut<T, S>(__fmul_rn(Cvt<T>::To(xv.v[e]), r), Cvt<T>::To(wv.v[e]));
    }
    Store<T, V>(y, base + j, out);
  }
}

template <typename T, int V, int G, RmsScale S>
__global__ void RmsNormForwardKernel(const T* __restrict__ x, const T* __restrict__ w, float eps,
                                     int64_t rows, int64_t h, T* __restrict__ y,
                                     float* __restrict__ rstd) {
  __shared__ float red[32];
  const int64_t row = RowOf<G>();
  const int lane = threadIdx.x % G;
  const bool valid = row < rows;
  const int64_t base = row * h;
  float ss = 0.f;
  for (int64_t j = lane * V; valid && j < h; j += G * V) {
    const Pack<T, V> xv = Load<T, V>(x, base + j);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float f = Cvt<T>::To(xv.v[e]);
      ss = __fadd_rn(ss, __fmul_rn(f, f));  // x.float().pow(2), then the mean's sum
    }
  }
  ss = RowSum<G>(ss, red);
  if (!valid) return;
  const float r = rsqrtf(__fadd_rn(__fmul_rn(ss, 1.f / static_cast<float>(h)), eps));
  if (lane == 0) rstd[row] = r;
  ScaleRow<T, V, G, S>(x, w, base, h, lane, r, y);
}

template <typename T, int V, int G, RmsScale S>
__global__ void RmsNormApplyKernel(const T* __restrict__ x, const T* __restrict__ w,
                                   const float* __restrict__ rstd, int64_t rows, int64_t h,
                                   T* __restrict__ y) {
  const int64_t row = RowOf<G>();
  if (row >= rows) return;  // no shuffles here
  const int lane = threadIdx.x % G;
  const int64_t base = row * h;
  const float r = rstd[row];
  ScaleRow<T, V, G, S>(x, w, base, h, lane, r, y);
}

// dx for one pack of a row, once the row's dot = mean(dn * n) is known.
template <typename T, int V, bool kResidual, RmsScale S>
__device__ __forceinline__ void StoreDx(const T* dy, const T* x, const T* w, const T* residual,
                                        int64_t base, int64_t j, float r, float dot, T* dx) {
  const Pack<T, V> dyv = Load<T, V>(dy, base + j), xv = Load<T, V>(x, base + j),
                   wv = Load<T, V>(w, j);
  Pack<T, V> out;
  Pack<T, V> res;
  if (kResidual) res = Load<T, V>(residual, base + j);
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const float n = __fmul_rn(Cvt<T>::To(xv.v[e]), r);
    float dn, unused;
    NormGrad<T, S>(Cvt<T>::To(dyv.v[e]), n, Cvt<T>::To(wv.v[e]), &dn, &unused);
    const float d = __fmul_rn(r, __fsub_rn(dn, __fmul_rn(n, dot)));
    out.v[e] = kResidual ? Cvt<T>::From(__fadd_rn(Cvt<T>::To(res.v[e]), Round<T>(d)))
                         : Cvt<T>::From(d);
  }
  Store<T, V>(dx, base + j, out);
}

// Long rows, one row at a time per block. Each block walks rows blockIdx.x, +gridDim.x, ...;
// every thread owns the same columns in every row, so its share of dW accumulates in shared
// memory without atomics and is written once as the block's partial row, summed over blocks by
// ColumnSumKernel.
template <typename T, int V, bool kResidual, RmsScale S>
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
        const float n = __fmul_rn(Cvt<T>::To(xv.v[e]), r);
        float dn, term;
        NormGrad<T, S>(Cvt<T>::To(dyv.v[e]), n, Cvt<T>::To(wv.v[e]), &dn, &term);
        dot = __fadd_rn(dot, __fmul_rn(dn, n));
        acc[j + e] = __fadd_rn(acc[j + e], term);
      }
    }
    dot = __fmul_rn(BlockSum(dot, red), inv_h);
    for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
      StoreDx<T, V, kResidual, S>(dy, x, w, residual, base, j, r, dot, dx);
    }
  }
  for (int64_t j = threadIdx.x * V; j < h; j += blockDim.x * V) {
#pragma unroll
    for (int e = 0; e < V; ++e) partial[blockIdx.x * h + j + e] = acc[j + e];
  }
}

// Short rows (h <= kRowPacks * G * V): groups of G lanes, blockDim / G rows at a time per block.
// Lane l owns packs l, l + G, ... of every row, so its dW share stays in registers; at the end
// the groups' shares meet in shared memory and are summed in group order into the block's
// partial row (the order depends only on the launch shape, as in the long-row kernel).
constexpr int kRowPacks = 4;

template <typename T, int V, int G, bool kResidual, RmsScale S>
__global__ void RmsNormBackwardRowsKernel(const T* __restrict__ dy, const T* __restrict__ x,
                                          const T* __restrict__ w,
                                          const float* __restrict__ rstd,
                                          const T* __restrict__ residual, int64_t rows, int64_t h,
                                          T* __restrict__ dx, float* __restrict__ partial) {
  extern __shared__ float acc[];  // (blockDim / G) x h floats
  const int groups = blockDim.x / G, group = threadIdx.x / G, lane = threadIdx.x % G;
  float dw[kRowPacks][V];
#pragma unroll
  for (int k = 0; k < kRowPacks; ++k) {
#pragma unroll
    for (int e = 0; e < V; ++e) dw[k][e] = 0.f;
  }
  const float inv_h = 1.f / static_cast<float>(h);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * groups; first < rows;
       first += static_cast<int64_t>(gridDim.x) * groups) {
    const int64_t row = first + group, base = row * h;
    const bool valid = row < rows;
    const float r = valid ? rstd[row] : 0.f;
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kRowPacks; ++k) {
      const int64_t j = static_cast<int64_t>(k * G + lane) * V;
      if (!valid || j >= h) continue;
      const Pack<T, V> dyv = Load<T, V>(dy, base + j), xv = Load<T, V>(x, base + j),
                       wv = Load<T, V>(w, j);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float n = __fmul_rn(Cvt<T>::To(xv.v[e]), r);
        float dn, term;
        NormGrad<T, S>(Cvt<T>::To(dyv.v[e]), n, Cvt<T>::To(wv.v[e]), &dn, &term);
        dot = __fadd_rn(dot, __fmul_rn(dn, n));
        dw[k][e] = __fadd_rn(dw[k][e], term);
      }
    }
    dot = __fmul_rn(RowSum<G>(dot, nullptr), inv_h);
    if (!valid) continue;
#pragma unroll
    for (int k = 0; k < kRowPacks; ++k) {
      const int64_t j = static_cast<int64_t>(k * G + lane) * V;
      if (j < h) StoreDx<T, V, kResidual, S>(dy, x, w, residual, base, j, r, dot, dx);
    }
  }
#pragma unroll
  for (int k = 0; k < kRowPacks; ++k) {
    const int64_t j = static_cast<int64_t>(k * G + lane) * V;
    if (j >= h) continue;
#pragma unroll
    for (int e = 0; e < V; ++e) acc[group * h + j + e] = dw[k][e];
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < h; j += blockDim.x) {
    float sum = 0.f;
    for (int g = 0; g < groups; ++g) sum += acc[g * h + j];
    partial[blockIdx.x * h + j] = sum;
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

// ---- gated MLP activations ---------------------------------------------------------------------

// ATen's CUDA silu / silu_backward and gelu / gelu_backward with approximate="tanh", in fp32 (their
// opmath type), written as ATen writes them: plain operators, so that nvcc contracts them into
// the same FMAs as in ATen's kernels (the tests compare the two to the bit).
struct Silu {
  static __device__ __forceinline__ float F(float x) { return x / (1.f + expf(-x)); }
  static __device__ __forceinline__ float Backward(float dy, float x) {
    const float s = 1.f / (1.f + expf(-x));
    return dy * s * (1.f + x * (1.f - s));
  }
};

struct GeluTanh {
  static constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * 0.5;  // sqrt(2 / pi), rounded once
  static constexpr float kKappa = 0.044715;
  static __device__ __forceinline__ float F(float x) {
    const float x_cube = x * x * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    return 0.5f * x * (1.f + tanhf(inner));
  }
  static __device__ __forceinline__ float Backward(float dy, float x) {
    const float x_sq = x * x;
    const float x_cube = x_sq * x;
    const float inner = kBeta * (x + kKappa * x_cube);
    const float tanh_inner = tanhf(inner);
    const float left = 0.5f * x;
    const float right = 1.f + tanh_inner;
    const float left_derivative = 0.5f * right;
    const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
    const float inner_derivative = kBeta * (1.f + 3.f * kKappa * x_sq);
    const float right_derivative = left * tanh_derivative * inner_derivative;
    return dy * (left_derivative + right_derivative);
  }
};

template <typename T, int V, typename Act>
__global__ void GluForwardKernel(const T* __restrict__ g, const T* __restrict__ u, int64_t n,
                                 T* __restrict__ a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * V;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V; i < n;
       i += stride) {
    const Pack<T, V> gv = Load<T, V>(g, i), uv = Load<T, V>(u, i);
    Pack<T, V> out;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float s = Round<T>(Act::F(Cvt<T>::To(gv.v[e])));
      out.v[e] = Cvt<T>::From(__fmul_rn(s, Cvt<T>::To(uv.v[e])));
    }
    Store<T, V>(a, i, out);
  }
}

template <typename T, int V, typename Act, bool kProduct>
__global__ void GluBackwardKernel(const T* __restrict__ da, const T* __restrict__ g,
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
      const float s = Round<T>(Act::F(x));
      dgv.v[e] = Cvt<T>::From(Act::Backward(Round<T>(__fmul_rn(d, up)), x));
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

template <RmsScale S>
struct ScaleTag {
  static constexpr RmsScale kValue = S;
};
template <typename F>
void ForScale(RmsScale s, F&& f) {
  switch (s) {
    case RmsScale::kCastThenScale: f(ScaleTag<RmsScale::kCastThenScale>{}); break;
    case RmsScale::kScaleThenCast: f(ScaleTag<RmsScale::kScaleThenCast>{}); break;
    case RmsScale::kOneOffset: f(ScaleTag<RmsScale::kOneOffset>{}); break;
  }
}

// Threads per row: 16 or 32 lanes for rows of up to kRowPacks packs per lane (vectorised only),
// a block of kRowThreads otherwise.
template <typename T>
int RowThreads(int64_t h, bool vec) {
  if (!vec) return kRowThreads;
  const int64_t packs = h / kVec<T>;
  if (packs <= 16) return 16;  // head_dim 128 in 16-bit: 16 packs, one per lane
  if (packs <= 32 * kRowPacks) return 32;
  return kRowThreads;
}

// Calls f(kernel-selector) with G as a compile-time constant.
template <int G>
struct GroupTag {
  static constexpr int kValue = G;
};
template <typename F>
void ForGroup(int g, F&& f) {
  if (g == 16) f(GroupTag<16>{});
  if (g == 32) f(GroupTag<32>{});
  if (g == kRowThreads) f(GroupTag<kRowThreads>{});
}

int64_t RowBlocks(int64_t rows, int g) {
  return g <= 32 ? (rows + kRowThreads / g - 1) / (kRowThreads / g) : rows;
}

int64_t BackwardBlocks(int64_t rows) {
  // A fixed cap (not derived from the device) keeps the dW sum order the same on every GPU.
  return std::max<int64_t>(1, std::min<int64_t>(1024, (rows + 7) / 8));
}

int64_t ElementwiseBlocks(int64_t n, int v) {
  return std::max<int64_t>(1, std::min<int64_t>(4096, (n / v + 255) / 256));
}

}  // namespace

void RmsNormForward(DType t, RmsScale s, const void* x, const void* w, float eps, int64_t rows,
                    int64_t h, void* y, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = h % kVec<T> == 0 && Aligned({x, w, y});
    const int g = RowThreads<T>(h, vec);
    ForScale(s, [&](auto st) {
      constexpr RmsScale S = decltype(st)::kValue;
      ForGroup(g, [&](auto gt) {
        constexpr int G = decltype(gt)::kValue;
        auto launch = [&](auto kernel) {
          kernel<<<RowBlocks(rows, G), kRowThreads, 0, stream>>>(
              static_cast<const T*>(x), static_cast<const T*>(w), eps, rows, h,
              static_cast<T*>(y), rstd);
        };
        if (vec) launch(RmsNormForwardKernel<T, kVec<T>, G, S>);
        if (!vec && G == kRowThreads) launch(RmsNormForwardKernel<T, 1, kRowThreads, S>);
      });
    });
  });
}

void RmsNormApply(DType t, RmsScale s, const void* x, const void* w, const float* rstd,
                  int64_t rows, int64_t h, void* y, cudaStream_t stream) {
  if (rows == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = h % kVec<T> == 0 && Aligned({x, w, y});
    const int g = RowThreads<T>(h, vec);
    ForScale(s, [&](auto st) {
      constexpr RmsScale S = decltype(st)::kValue;
      ForGroup(g, [&](auto gt) {
        constexpr int G = decltype(gt)::kValue;
        auto launch = [&](auto kernel) {
          kernel<<<RowBlocks(rows, G), kRowThreads, 0, stream>>>(
              static_cast<const T*>(x), static_cast<const T*>(w), rstd, rows, h,
              static_cast<T*>(y));
        };
        if (vec) launch(RmsNormApplyKernel<T, kVec<T>, G, S>);
        if (!vec && G == kRowThreads) launch(RmsNormApplyKernel<T, 1, kRowThreads, S>);
      });
    });
  });
}

int64_t RmsNormBackwardScratch(int64_t rows, int64_t h) { return BackwardBlocks(rows) * h; }

void RmsNormBackward(DType t, RmsScale s, const void* dy, const void* x, const void* w,
                     const float* rstd, const void* residual, int64_t rows, int64_t h, void* dx,
                     void* dw, float* partial, cudaStream_t stream) {
  const int64_t blocks = BackwardBlocks(rows);
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    const bool vec = h % kVec<T> == 0 && Aligned({dy, x, w, residual, dx});
    const int g = RowThreads<T>(h, vec);
    // Long rows: h floats of dW partials; short rows: one row of them per group.
    const size_t smem =
        static_cast<size_t>(h) * sizeof(float) * (g <= 32 ? kRowThreads / g : 1);
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
    ForScale(s, [&](auto st) {
      constexpr RmsScale S = decltype(st)::kValue;
      constexpr int V = kVec<T>;
      if (g == 16 && residual) launch(RmsNormBackwardRowsKernel<T, V, 16, true, S>);
      if (g == 16 && !residual) launch(RmsNormBackwardRowsKernel<T, V, 16, false, S>);
      if (g == 32 && residual) launch(RmsNormBackwardRowsKernel<T, V, 32, true, S>);
      if (g == 32 && !residual) launch(RmsNormBackwardRowsKernel<T, V, 32, false, S>);
      if (g == kRowThreads && vec && residual) launch(RmsNormBackwardKernel<T, V, true, S>);
      if (g == kRowThreads && vec && !residual) launch(RmsNormBackwardKernel<T, V, false, S>);
      if (!vec && residual) launch(RmsNormBackwardKernel<T, 1, true, S>);
      if (!vec && !residual) launch(RmsNormBackwardKernel<T, 1, false, S>);
    });
    ColumnSumKernel<T><<<(h + 31) / 32, dim3(32, 8), 0, stream>>>(partial, blocks, h,
                                                                  static_cast<T*>(dw));
  });
}

void GluForward(DType t, Glu act, const void* g, const void* u, int64_t n, void* a,
                cudaStream_t stream) {
  if (n == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel, int v) {
      kernel<<<ElementwiseBlocks(n, v), 256, 0, stream>>>(
          static_cast<const T*>(g), static_cast<const T*>(u), n, static_cast<T*>(a));
    };
    const bool vec = n % kVec<T> == 0 && Aligned({g, u, a});
    const bool silu = act == Glu::kSilu;
    if (vec && silu) launch(GluForwardKernel<T, kVec<T>, Silu>, kVec<T>);
    if (!vec && silu) launch(GluForwardKernel<T, 1, Silu>, 1);
    if (vec && !silu) launch(GluForwardKernel<T, kVec<T>, GeluTanh>, kVec<T>);
    if (!vec && !silu) launch(GluForwardKernel<T, 1, GeluTanh>, 1);
  });
}

void GluBackward(DType t, Glu act, const void* da, const void* g, const void* u, int64_t n,
                 void* dg, void* du, void* a, cudaStream_t stream) {
  if (n == 0) return;
  ForType(t, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel, int v) {
      kernel<<<ElementwiseBlocks(n, v), 256, 0, stream>>>(
          static_cast<const T*>(da), static_cast<const T*>(g), static_cast<const T*>(u), n,
          static_cast<T*>(dg), static_cast<T*>(du), static_cast<T*>(a));
    };
    const bool vec = n % kVec<T> == 0 && Aligned({da, g, u, dg, du, a});
    auto run = [&](auto act_tag) {
      using Act = decltype(act_tag);
      if (vec && a) launch(GluBackwardKernel<T, kVec<T>, Act, true>, kVec<T>);
      if (vec && !a) launch(GluBackwardKernel<T, kVec<T>, Act, false>, kVec<T>);
      if (!vec && a) launch(GluBackwardKernel<T, 1, Act, true>, 1);
      if (!vec && !a) launch(GluBackwardKernel<T, 1, Act, false>, 1);
    };
    if (act == Glu::kSilu) run(Silu{});
    if (act == Glu::kGeluTanh) run(GeluTanh{});
  });
}

}  // namespace offloadd::engine::cuda
