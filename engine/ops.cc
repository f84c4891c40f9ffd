#include "engine/ops.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include "engine/cuda/fused_kernels.h"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "engine/head_chunk.h"

namespace offloadd::engine::ops {

at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::linear(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
}

at::Tensor LinearBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                          bool has_bias, at::Tensor* dw, at::Tensor* db, at::Tensor* accumulate) {
  const int64_t out = w.size(0), in = w.size(1);
  at::Tensor dy2 = dy.reshape({-1, out});
  *dw = dy2.t().mm(x.reshape({-1, in}));
  if (has_bias) *db = dy2.sum(0);
  if (accumulate == nullptr) return dy.matmul(w);
  TORCH_CHECK(accumulate->is_contiguous() && accumulate->numel() == dy2.size(0) * in,
              "LinearBackward: the accumulator does not match d input's shape");
  accumulate->view({-1, in}).addmm_(dy2, w);  // one GEMM epilogue instead of a separate add
  return *accumulate;
}

at::Tensor Conv1D(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  // transformers' Conv1D: addmm(bias, x.view(-1, in), weight) with weight [in, out].
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(1);
  return at::addmm(b, x.reshape({-1, w.size(0)}), w).view(shape);
}

at::Tensor Conv1DBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                          at::Tensor* dw, at::Tensor* db) {
  at::Tensor dy2 = dy.reshape({-1, w.size(1)});
  *dw = x.reshape({-1, w.size(0)}).t().mm(dy2);
  *db = dy2.sum(0);
  return dy.matmul(w.t());
}

namespace {

// OFFLOADD_FUSED_KERNELS (or SetFusedKernels) picks the RMSNorm/SwiGLU implementation: auto (the
// fused CUDA kernels of engine/cuda/ where the inputs allow, ATen elsewhere), fused (an error
// where they cannot run), aten (the ATen op sequences everywhere). A bad value is refused on
// every device, so a typo never goes unnoticed.
enum class FusedMode : int { kUnset = -1, kAuto, kFused, kAten };
std::atomic<int> g_fused_mode{static_cast<int>(FusedMode::kUnset)};

FusedMode ParseFusedMode(const std::string& v, const char* source) {
  if (v == "auto") return FusedMode::kAuto;
  if (v == "fused") return FusedMode::kFused;
  if (v == "aten") return FusedMode::kAten;
  TORCH_CHECK(false, source, " must be auto, fused or aten, got '", v, "'");
}

FusedMode FusedKernelsMode() {
  const int m = g_fused_mode.load(std::memory_order_relaxed);
  if (m != static_cast<int>(FusedMode::kUnset)) return static_cast<FusedMode>(m);
  const char* v = std::getenv("OFFLOADD_FUSED_KERNELS");
  const FusedMode mode =
      ParseFusedMode(v == nullptr || *v == 0 ? "auto" : v, "OFFLOADD_FUSED_KERNELS");
  g_fused_mode.store(static_cast<int>(mode), std::memory_order_relaxed);
  return mode;
}

#if OFFLOADD_WITH_CUDA
constexpr int64_t kMaxNormHidden = cuda::kMaxRmsNormHidden;
#else
constexpr int64_t kMaxNormHidden = std::numeric_limits<int64_t>::max();
#endif

const char* FusedOpName(FusedOp op) {
  switch (op) {
    case FusedOp::kRmsNorm: return "RMSNorm";
    case FusedOp::kRmsNormBackward: return "RMSNorm backward";
    case FusedOp::kSwiGlu: return "SwiGLU";
    case FusedOp::kGeGluTanh: return "GeGLU";
  }
  return "?";
}

// Why the fused kernel cannot take these inputs (FusedKernelFor without the mode).
std::string FusedMisfit(FusedOp op, c10::ScalarType dtype, c10::Device device, int64_t h) {
  if (!OFFLOADD_WITH_CUDA) return "needs the CUDA build";
  if (!device.is_cuda()) return "needs CUDA tensors";
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
    return "needs fp32, bf16 or fp16";
  }
  if (op == FusedOp::kRmsNormBackward && h > kMaxNormHidden) {
    return "supports a last dimension up to " + std::to_string(kMaxNormHidden);
  }
  return "";
}

// Whether the fused kernel runs for these tensors (all of one dtype, on one CUDA device).
bool UseFused(FusedOp op, std::initializer_list<const at::Tensor*> ts, int64_t h) {
  const FusedMode mode = FusedKernelsMode();
  if (mode == FusedMode::kAten) return false;
  const at::Tensor& first = **ts.begin();
  std::string why = FusedMisfit(op, first.scalar_type(), first.device(), h);
  if (why.empty()) {
    for (const at::Tensor* t : ts) {
      if (t->defined() &&
          (t->scalar_type() != first.scalar_type() || t->device() != first.device())) {
        why = "needs every input in one dtype on one device";
      }
    }
  }
  TORCH_CHECK(why.empty() || mode == FusedMode::kAuto, "fused kernels forced: ", FusedOpName(op),
              " ", why);
  return why.empty();
}

#if OFFLOADD_WITH_CUDA
cuda::DType KernelType(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return cuda::DType::kBFloat16;
    case at::kHalf: return cuda::DType::kHalf;
    default: return cuda::DType::kFloat;
  }
}

cuda::RmsScale KernelScale(RmsScale s) {
  switch (s) {
    case RmsScale::kScaleThenCast: return cuda::RmsScale::kScaleThenCast;
    case RmsScale::kOneOffset: return cuda::RmsScale::kOneOffset;
    default: return cuda::RmsScale::kCastThenScale;
  }
}
#endif

// The fp32 factor of the flavours that scale before the cast: w.float() or 1 + w.float().
at::Tensor Fp32Scale(const at::Tensor& w, RmsScale scale) {
  at::Tensor wf = w.to(at::kFloat);
  return scale == RmsScale::kOneOffset ? wf + 1.0 : wf;
}

// y from n = x.float() * rstd (fp32), rounded as the family's modeling code rounds it.
at::Tensor ScaleNormalized(const at::Tensor& n, const at::Tensor& w, c10::ScalarType dtype,
                           RmsScale scale) {
  if (scale == RmsScale::kCastThenScale) return w * n.to(dtype);
  return (n * Fp32Scale(w, scale)).to(dtype);
}

void CheckNormWeight(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1), "RMSNorm: weight of shape ", w.sizes(),
              " for rows of ", x.size(-1));
}

}  // namespace

RmsScale RmsScaleFor(const ModelConfig& c) {
  if (c.norm == NormKind::kRmsOneOffset) return RmsScale::kOneOffset;
  if (c.model_type == "olmo2") return RmsScale::kScaleThenCast;
  return RmsScale::kCastThenScale;
}

std::string FusedKernelFor(FusedOp op, c10::ScalarType dtype, c10::Device device,
                           int64_t last_dim) {
  if (FusedKernelsMode() == FusedMode::kAten) return "OFFLOADD_FUSED_KERNELS=aten";
  return FusedMisfit(op, dtype, device, last_dim);
}

void SetFusedKernels(const std::string& mode) {
  g_fused_mode.store(static_cast<int>(ParseFusedMode(mode, "the fused kernel mode")),
                     std::memory_order_relaxed);
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor* rstd,
                   RmsScale scale) {
  CheckNormWeight(x, w);
  const int64_t h = x.size(-1);
  if (UseFused(FusedOp::kRmsNorm, {&x, &w}, h)) {
#if OFFLOADD_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor xc = x.contiguous(), wc = w.contiguous();
    at::Tensor y = at::empty_like(xc);
    std::vector<int64_t> rshape(x.sizes().begin(), x.sizes().end());
    rshape.back() = 1;
    *rstd = at::empty(rshape, x.options().dtype(at::kFloat));
    cuda::RmsNormForward(KernelType(x), KernelScale(scale), xc.data_ptr(), wc.data_ptr(),
                         static_cast<float>(eps), xc.numel() / h, h, y.data_ptr(),
                         rstd->data_ptr<float>(), at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
#endif
  }
  at::Tensor xf = x.to(at::kFloat);
  *rstd = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return ScaleNormalized(xf * *rstd, w, x.scalar_type(), scale);
}

at::Tensor RmsNormFromRstd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                           RmsScale scale) {
  CheckNormWeight(x, w);
  const int64_t h = x.size(-1);
  if (UseFused(FusedOp::kRmsNorm, {&x, &w}, h)) {
#if OFFLOADD_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor xc = x.contiguous(), wc = w.contiguous(), rc = rstd.contiguous();
    at::Tensor y = at::empty_like(xc);
    cuda::RmsNormApply(KernelType(x), KernelScale(scale), xc.data_ptr(), wc.data_ptr(),
                       rc.data_ptr<float>(), xc.numel() / h, h, y.data_ptr(),
                       at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
#endif
  }
  return ScaleNormalized(x.to(at::kFloat) * rstd, w, x.scalar_type(), scale);
}

at::Tensor RmsNormBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                           const at::Tensor& rstd, at::Tensor* dw, const at::Tensor& residual,
                           RmsScale scale) {
  CheckNormWeight(x, w);
  const int64_t h = x.size(-1);
  if (UseFused(FusedOp::kRmsNormBackward, {&x, &dy, &w, &residual}, h)) {
#if OFFLOADD_WITH_CUDA
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor xc = x.contiguous(), dyc = dy.contiguous(), wc = w.contiguous(),
               rc = rstd.contiguous();
    at::Tensor res = residual.defined() ? residual.contiguous() : at::Tensor();
    const int64_t rows = xc.numel() / h;
    at::Tensor dx = at::empty_like(xc);
    *dw = at::empty({h}, w.options());
    at::Tensor partial =
        at::empty({cuda::RmsNormBackwardScratch(rows, h)}, x.options().dtype(at::kFloat));
    cuda::RmsNormBackward(KernelType(x), KernelScale(scale), dyc.data_ptr(), xc.data_ptr(),
                          wc.data_ptr(), rc.data_ptr<float>(),
                          res.defined() ? res.data_ptr() : nullptr, rows, h, dx.data_ptr(),
                          dw->data_ptr(), partial.data_ptr<float>(),
                          at::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return dx;
#endif
  }
  // n = x * rstd; with dn = d loss/d n, dx = rstd * (dn - n * mean(dn * n)) (the gradient
  // through rstd folded in), rounded to x's dtype once as autograd's cast back does.
  at::Tensor n = x.to(at::kFloat) * rstd;
  at::Tensor dn;
  if (scale == RmsScale::kCastThenScale) {
    // y = w * cast(n): dW sums the products rounded to the dtype; dn = cast_back(dy * w).
    *dw = (dy * n.to(x.scalar_type())).reshape({-1, h}).sum(0);
    dn = (dy * w).to(at::kFloat);
  } else {
    // y = cast(s * n) with s = w.float() (+ 1): all fp32, dW rounded once after the row sum.
    at::Tensor dyf = dy.to(at::kFloat);
    *dw = (dyf * n).reshape({-1, h}).sum(0).to(w.scalar_type());
    dn = dyf * Fp32Scale(w, scale);
  }
  at::Tensor dx = (rstd * (dn - n * (dn * n).mean(-1, /*keepdim=*/true))).to(x.scalar_type());
  return residual.defined() ? residual + dx : dx;
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor* rstd,
                   bool one_offset) {
  return RmsNorm(x, w, eps, rstd, one_offset ? RmsScale::kOneOffset : RmsScale::kCastThenScale);
}

at::Tensor RmsNormFromRstd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                           bool one_offset) {
  return RmsNormFromRstd(x, w, rstd,
                         one_offset ? RmsScale::kOneOffset : RmsScale::kCastThenScale);
}

at::Tensor RmsNormBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                           const at::Tensor& rstd, at::Tensor* dw, const at::Tensor& residual,
                           bool one_offset) {
  return RmsNormBackward(dy, x, w, rstd, dw, residual,
                         one_offset ? RmsScale::kOneOffset : RmsScale::kCastThenScale);
}

at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                     at::Tensor* mean, at::Tensor* rstd) {
  auto [y, m, r] = at::native_layer_norm(x, {x.size(-1)}, w, b, eps);
  if (mean) *mean = m;
  if (rstd) *rstd = r;
  return y;
}

at::Tensor LayerNormBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& b, const at::Tensor& mean, const at::Tensor& rstd,
                             at::Tensor* dw, at::Tensor* db) {
  auto [dx, gw, gb] =
      at::native_layer_norm_backward(dy, x, {x.size(-1)}, mean, rstd, w, b, {true, true, true});
  *dw = gw;
  *db = gb;
  return dx;
}

namespace {

enum class AttnKernel { kCpuFlash, kCudaCudnn, kCudaFlash, kCudaEfficient };

// OFFLOADD_ATTENTION_KERNEL forces the CUDA attention flavour (auto, cudnn, flash, efficient);
// a forced flavour the inputs cannot use is an error, not a silent fallback.
const std::string& ForcedAttentionKernel() {
  static const std::string forced = [] {
    const char* v = std::getenv("OFFLOADD_ATTENTION_KERNEL");
    return std::string(v == nullptr || *v == 0 ? "auto" : v);
  }();
  TORCH_CHECK(forced == "auto" || forced == "cudnn" || forced == "flash" || forced == "efficient",
              "OFFLOADD_ATTENTION_KERNEL must be auto, cudnn, flash or efficient, got '", forced, "'");
  return forced;
}

// cuDNN's fused flash attention (the kernel PyTorch's SDPA prefers on Hopper): 16-bit inputs,
// head size a multiple of 8 up to 128, compute capability 9.0 or newer, cuDNN enabled, and no
// deterministic-algorithms mode (its backward is not deterministic).
bool CudnnAttentionFits(const at::Tensor& q, bool half, int64_t d, std::string* why) {
  if (!half || d % 8 != 0 || d > 128) {
    *why = "needs bf16/fp16 and a head size that is a multiple of 8 up to 128";
    return false;
  }
  const auto& ctx = at::globalContext();
  if (!ctx.userEnabledCuDNN() || !ctx.hasCuDNN() || ctx.deterministicAlgorithms()) {
    *why = "needs cuDNN enabled and deterministic algorithms off";
    return false;
  }
#if OFFLOADD_WITH_CUDA
  if (at::cuda::getDeviceProperties(q.get_device())->major < 9) {
    *why = "needs compute capability 9.0 or newer";
    return false;
  }
  return true;
#else
  (void)q;
  *why = "needs the CUDA build";
  return false;
#endif
}

AttnKernel PickKernel(const at::Tensor& q) {
  const std::string& forced = ForcedAttentionKernel();  // checked on every device
  if (!q.is_cuda()) return AttnKernel::kCpuFlash;
  const int64_t d = q.size(-1);
  const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
  std::string why;
  if (forced == "cudnn" || forced == "auto") {
    const bool fits = CudnnAttentionFits(q, half, d, &why);
    TORCH_CHECK(fits || forced == "auto", "OFFLOADD_ATTENTION_KERNEL=cudnn: ", why);
    if (fits) return AttnKernel::kCudaCudnn;
  }
  const bool flash_fits = half && d % 8 == 0 && d <= 256;
  TORCH_CHECK(flash_fits || forced != "flash",
              "OFFLOADD_ATTENTION_KERNEL=flash needs bf16/fp16 and a head size that is a multiple of 8 up to 256");
  if (flash_fits && forced != "efficient") return AttnKernel::kCudaFlash;
  return AttnKernel::kCudaEfficient;  // fp32 or unusual head sizes
}

// GQA: expand [B, Hkv, T, D] to [B, Hq, T, D] the way transformers' repeat_kv does.
at::Tensor RepeatKv(const at::Tensor& x, int64_t rep) {
  if (rep == 1) return x;
  const int64_t b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, h, rep, t, d}).reshape({b, h * rep, t, d});
}

at::Tensor ReduceKv(const at::Tensor& dx, int64_t rep) {
  if (rep == 1) return dx;
  const int64_t b = dx.size(0), h = dx.size(1) / rep, t = dx.size(2), d = dx.size(3);
  return dx.contiguous().view({b, h, rep, t, d}).sum(2);
}

// [T, T] bool: key j visible from query i (j <= i, and i - j < window when window > 0).
at::Tensor CausalAllowed(int64_t t, c10::Device device, int64_t window) {
  at::Tensor allowed = at::ones({t, t}, at::TensorOptions().dtype(at::kBool).device(device)).tril();
  if (window > 0) allowed = allowed.triu(-(window - 1));
  return allowed;
}

}  // namespace

at::Tensor SegmentMask(const at::Tensor& segment_ids, c10::ScalarType dtype, int64_t window) {
  const int64_t t = segment_ids.size(1);
  at::Tensor same = segment_ids.unsqueeze(2).eq(segment_ids.unsqueeze(1));  // [B, T, T]
  at::Tensor allowed = (same & CausalAllowed(t, segment_ids.device(), window)).unsqueeze(1);
  return at::zeros(allowed.sizes(), segment_ids.options().dtype(dtype))
      .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
}

at::Tensor CausalMask(int64_t t, c10::Device device, c10::ScalarType dtype, int64_t window) {
  at::Tensor allowed = CausalAllowed(t, device, window).view({1, 1, t, t});
  return at::zeros(allowed.sizes(), at::TensorOptions().dtype(dtype).device(device))
      .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
}

bool WindowedFlashFits(c10::Device device, c10::ScalarType dtype, int64_t head_dim) {
  const std::string& forced = ForcedAttentionKernel();
  return device.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf) && head_dim % 8 == 0 &&
         head_dim <= 256 && (forced == "auto" || forced == "flash");
}

namespace {

// The explicit path's scaled logits, soft-capped when asked (transformers' eager attention for
// Gemma 2: / cap, tanh, * cap, in q's dtype).
at::Tensor Logits(const at::Tensor& q, const at::Tensor& ke, double scale, double softcap,
                  at::Tensor* capped_tanh) {
  at::Tensor s = at::matmul(q, ke.transpose(2, 3)) * scale;
  if (softcap <= 0) return s;
  at::Tensor t = at::tanh(s / softcap);
  if (capped_tanh) *capped_tanh = t;
  return t * softcap;
}

// FlashAttention-2 with its own sliding window, [B, H, T, D] in and out (the kernel's layout is
// [B, T, H, D]). aux: logsumexp, rng state, the kernel's unused tensor.
at::Tensor WindowedFlash(const at::Tensor& q, const at::Tensor& ke, const at::Tensor& ve,
                         double scale, int64_t window, std::vector<at::Tensor>* aux) {
  const int64_t t = q.size(2);
  auto r = at::_flash_attention_forward(q.transpose(1, 2), ke.transpose(1, 2), ve.transpose(1, 2),
                                        std::nullopt, std::nullopt, t, t, /*dropout_p=*/0.0,
                                        /*is_causal=*/true, /*return_debug_mask=*/false, scale,
                                        /*window_size_left=*/window - 1, /*window_size_right=*/0);
  if (aux) aux->insert(aux->end(), {std::get<1>(r), std::get<2>(r), std::get<3>(r)});
  return std::get<0>(r).transpose(1, 2);
}

// The attention kernels on (possibly centred) k and v: out [B, Hq, T, D] and the kernel's aux.
at::Tensor AttentionKernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const at::Tensor& mask, std::vector<at::Tensor>* aux,
                           double softcap, int64_t window) {
  const int64_t rep = q.size(1) / k.size(1);
  at::Tensor ke = RepeatKv(k, rep), ve = RepeatKv(v, rep);
  TORCH_CHECK(softcap <= 0 || mask.defined(), "attention soft-capping needs the explicit path");
  if (mask.defined()) {
    // transformers' eager_attention_forward: softmax in fp32, probabilities cast back.
    at::Tensor scores = Logits(q, ke, scale, softcap, nullptr) + mask;
    at::Tensor p = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    if (aux) aux->push_back(p);
    return at::matmul(p, ve);
  }
  if (window > 0) return WindowedFlash(q, ke, ve, scale, window, aux);
  switch (PickKernel(q)) {
    case AttnKernel::kCpuFlash: {
      auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
          q, ke, ve, /*dropout_p=*/0.0, /*is_causal=*/true, /*attn_mask=*/std::nullopt, scale);
      if (aux) aux->push_back(lse);
      return out;
    }
    case AttnKernel::kCudaCudnn: {
      auto r = at::_scaled_dot_product_cudnn_attention(q, ke, ve, /*attn_bias=*/std::nullopt,
                                                       /*compute_log_sumexp=*/aux != nullptr,
                                                       /*dropout_p=*/0.0, /*is_causal=*/true,
                                                       /*return_debug_mask=*/false, scale);
      if (aux) {
        aux->push_back(std::get<1>(r));  // logsumexp
        aux->push_back(std::get<6>(r));  // philox seed
        aux->push_back(std::get<7>(r));  // philox offset
      }
      return std::get<0>(r);
    }
    case AttnKernel::kCudaFlash: {
      auto r = at::_scaled_dot_product_flash_attention(q, ke, ve, /*dropout_p=*/0.0,
                                                       /*is_causal=*/true,
                                                       /*return_debug_mask=*/false, scale);
      if (aux) {
        aux->push_back(std::get<1>(r));  // logsumexp
        aux->push_back(std::get<6>(r));  // philox seed
        aux->push_back(std::get<7>(r));  // philox offset
      }
      return std::get<0>(r);
    }
    case AttnKernel::kCudaEfficient: {
      auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
          q, ke, ve, /*attn_bias=*/std::nullopt, /*compute_log_sumexp=*/aux != nullptr,
          /*dropout_p=*/0.0, /*is_causal=*/true, scale);
      if (aux) {
        aux->push_back(lse);
        aux->push_back(seed);
        aux->push_back(offset);
      }
      return out;
    }
  }
  return {};
}

void AttentionKernelBackward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out, const at::Tensor* aux,
                             double scale, const at::Tensor& mask, at::Tensor* dq, at::Tensor* dk,
                             at::Tensor* dv, double softcap, int64_t window) {
  const int64_t rep = q.size(1) / k.size(1);
  at::Tensor ke = RepeatKv(k, rep), ve = RepeatKv(v, rep);
  at::Tensor gk, gv;
  if (mask.defined()) {
    const at::Tensor& p = aux[0];
    gv = at::matmul(p.transpose(2, 3), dout);
    at::Tensor dp = at::matmul(dout, ve.transpose(2, 3));
    // Softmax backward (ATen's kernel, fp32 like the forward), then the scaled QK^T product.
    at::Tensor ds = at::_softmax_backward_data(dp.to(at::kFloat), p.to(at::kFloat), -1, at::kFloat)
                        .to(q.scalar_type());
    if (softcap > 0) {  // through * cap, tanh and / cap; tanh is recomputed (one QK^T product)
      at::Tensor t;
      Logits(q, ke, scale, softcap, &t);
      ds = at::tanh_backward(ds * softcap, t) / softcap;
    }
    ds = ds * scale;
    *dq = at::matmul(ds, ke);
    gk = at::matmul(ds.transpose(2, 3), q);
    *dk = ReduceKv(gk, rep);
    *dv = ReduceKv(gv, rep);
    return;
  }
  if (window > 0) {
    const int64_t t = q.size(2);
    std::tie(*dq, gk, gv) = at::_flash_attention_backward(
        dout.transpose(1, 2).contiguous(), q.transpose(1, 2), ke.transpose(1, 2),
        ve.transpose(1, 2), out.transpose(1, 2), aux[0], at::Tensor(), at::Tensor(), t, t,
        /*dropout_p=*/0.0, /*is_causal=*/true, aux[1], aux[2], scale, window - 1, 0);
    *dq = dq->transpose(1, 2);
    *dk = ReduceKv(gk.transpose(1, 2), rep);
    *dv = ReduceKv(gv.transpose(1, 2), rep);
    return;
  }
  switch (PickKernel(q)) {
    case AttnKernel::kCpuFlash: {
      std::tie(*dq, gk, gv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          dout.contiguous(), q, ke, ve, out, aux[0], /*dropout_p=*/0.0, /*is_causal=*/true,
          /*attn_mask=*/std::nullopt, scale);
      break;
    }
    case AttnKernel::kCudaCudnn: {
      std::tie(*dq, gk, gv) = at::_scaled_dot_product_cudnn_attention_backward(
          dout, q, ke, ve, out, aux[0], aux[1], aux[2], /*attn_bias=*/at::Tensor(),
          /*cum_seq_q=*/at::Tensor(), /*cum_seq_k=*/at::Tensor(), q.size(2), k.size(2),
          /*dropout_p=*/0.0, /*is_causal=*/true, scale);
      break;
    }
    case AttnKernel::kCudaFlash: {
      const int64_t t_q = q.size(2), t_k = k.size(2);
      std::tie(*dq, gk, gv) = at::_scaled_dot_product_flash_attention_backward(
          dout, q, ke, ve, out, aux[0], /*cum_seq_q=*/at::Tensor(), /*cum_seq_k=*/at::Tensor(), t_q,
          t_k, /*dropout_p=*/0.0, /*is_causal=*/true, aux[1], aux[2], scale);
      break;
    }
    case AttnKernel::kCudaEfficient: {
      at::Tensor gb;
      std::tie(*dq, gk, gv, gb) = at::_scaled_dot_product_efficient_attention_backward(
          dout, q, ke, ve, /*attn_bias=*/at::Tensor(), out, aux[0], aux[1], aux[2],
          /*dropout_p=*/0.0, {true, true, true, false}, /*is_causal=*/true, scale);
      break;
    }
  }
  *dk = ReduceKv(gk, rep);
  *dv = ReduceKv(gv, rep);
}

// Centring (16-bit inputs). Softmax is invariant to a constant added to all of a query's logits,
// and each row of probabilities sums to one, so for vectors c_k, c_v the same for every key
//   attention(q, k, v) = attention(q, k - c_k, v - c_v) + c_v
// exactly (under any mask: each row attends to at least itself). The fused kernels' backward forms
// dS = P (dP - D) with D = rowsum(dO * out) from the 16-bit output. Where v has a large common
// component (a v bias) out and dP are large and their difference small, so out's rounding (2^-9
// of |out|) swamps dS, and a large common component of k (a k bias) multiplies that error into
// dq (dq_i's error is the row's error times the probability-weighted mean key); the explicit path's
// bf16 probabilities do the same. transformers' eager attention takes D in fp32 and does not
// suffer this. Subtracting each sequence's mean of k and v (per batch row and KV head, in fp32,
// rounded once) leaves only the rounding of the centred values. k is not centred under
// soft-capping (tanh is not shift-invariant). fp32 runs the kernels on k and v as they are.
// The means are taken without gradient. In exact arithmetic none flows through them: a constant
// added to every key a query sees leaves its probabilities unchanged (sum_j dS_ij = 0), and c_v
// subtracted from v and added to out contributes (1 - sum_j P_ij) d out_i = 0. Differentiating
// them anyway (d k = d kc - mean(d kc), ...) only spreads the rounding of those zeros over every
// position, padding included, whose exact zero gradients AdamW then turns into full steps of the
// embedding rows only padding uses. Being constants, they may average any positions of the row.
bool Centred(const at::Tensor& q) {
  return q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
}

at::Tensor Centre(const at::Tensor& x, at::Tensor* mean) {
  const at::Tensor f = x.to(at::kFloat);
  *mean = f.mean(2, /*keepdim=*/true);
  return (f - *mean).to(x.scalar_type());
}

// out + c_v, c_v [B, Hkv, 1, D] fp32 repeated over each KV head's query heads.
at::Tensor AddMean(const at::Tensor& out, const at::Tensor& mean) {
  return (out.to(at::kFloat) + RepeatKv(mean, out.size(1) / mean.size(1))).to(out.scalar_type());
}

}  // namespace

at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                     const at::Tensor& mask, std::vector<at::Tensor>* aux, double softcap,
                     int64_t window, at::Tensor* kernel_out) {
  if (!Centred(q)) {
    at::Tensor out = AttentionKernel(q, k, v, scale, mask, aux, softcap, window);
    if (kernel_out) *kernel_out = out;
    return out;
  }
  at::Tensor k_mean, v_mean;
  const at::Tensor kc = softcap > 0 ? k : Centre(k, &k_mean);
  const at::Tensor vc = Centre(v, &v_mean);
  if (aux) aux->push_back(v_mean);
  at::Tensor out = AttentionKernel(q, kc, vc, scale, mask, aux, softcap, window);
  if (kernel_out) *kernel_out = out;
  return AddMean(out, v_mean);
}

at::Tensor AttentionValue(const at::Tensor& kernel_out, const at::Tensor* aux) {
  return Centred(kernel_out) ? AddMean(kernel_out, aux[0]) : kernel_out;
}

void AttentionBackward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& out, const at::Tensor* aux,
                       double scale, const at::Tensor& mask, at::Tensor* dq, at::Tensor* dk,
                       at::Tensor* dv, double softcap, int64_t window) {
  if (!Centred(q)) {
    return AttentionKernelBackward(dout, q, k, v, out, aux, scale, mask, dq, dk, dv, softcap,
                                   window);
  }
  // The means are constants of the backward: no gradient flows through them (the header comment
  // says why that is exact), so d k = d kc and d v = d vc, and a position no query with a nonzero
  // d out attends (padding) keeps its exact zero gradient.
  at::Tensor k_mean;
  const at::Tensor kc = softcap <= 0 ? Centre(k, &k_mean) : k;  // the forward's bits again
  const at::Tensor vc = (v.to(at::kFloat) - aux[0]).to(v.scalar_type());
  AttentionKernelBackward(dout, q, kc, vc, out, aux + 1, scale, mask, dq, dk, dv, softcap, window);
}

namespace {

#if OFFLOADD_WITH_CUDA
at::Tensor GluFused(cuda::Glu act, const at::Tensor& g, const at::Tensor& u) {
  const c10::cuda::CUDAGuard guard(g.device());
  at::Tensor gc = g.contiguous(), uc = u.contiguous();
  TORCH_CHECK(gc.sizes() == uc.sizes(), "gated MLP: gate and up shapes differ");
  at::Tensor a = at::empty_like(gc);
  cuda::GluForward(KernelType(g), act, gc.data_ptr(), uc.data_ptr(), gc.numel(), a.data_ptr(),
                   at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return a;
}

void GluBackwardFused(cuda::Glu act, const at::Tensor& da, const at::Tensor& g,
                      const at::Tensor& u, at::Tensor* dg, at::Tensor* du, at::Tensor* a) {
  const c10::cuda::CUDAGuard guard(g.device());
  at::Tensor gc = g.contiguous(), uc = u.contiguous(), dac = da.contiguous();
  TORCH_CHECK(gc.sizes() == uc.sizes() && gc.sizes() == dac.sizes(),
              "gated MLP backward: gate, up and gradient shapes differ");
  *dg = at::empty_like(gc);
  *du = at::empty_like(gc);
  if (a) *a = at::empty_like(gc);
  cuda::GluBackward(KernelType(g), act, dac.data_ptr(), gc.data_ptr(), uc.data_ptr(), gc.numel(),
                    dg->data_ptr(), du->data_ptr(), a ? a->data_ptr() : nullptr,
                    at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
#endif

}  // namespace

at::Tensor SwiGlu(const at::Tensor& g, const at::Tensor& u) {
  if (UseFused(FusedOp::kSwiGlu, {&g, &u}, g.size(-1))) {
#if OFFLOADD_WITH_CUDA
    return GluFused(cuda::Glu::kSilu, g, u);
#endif
  }
  return at::silu(g) * u;
}

void SwiGluBackward(const at::Tensor& da, const at::Tensor& g, const at::Tensor& u, at::Tensor* dg,
                    at::Tensor* du, at::Tensor* a) {
  if (UseFused(FusedOp::kSwiGlu, {&g, &u, &da}, g.size(-1))) {
#if OFFLOADD_WITH_CUDA
    return GluBackwardFused(cuda::Glu::kSilu, da, g, u, dg, du, a);
#endif
  }
  // The ops autograd would run for silu(g) * u, in the same dtype.
  at::Tensor s = at::silu(g);
  *dg = at::silu_backward(da * u, g);
  *du = da * s;
  if (a) *a = s * u;
}

at::Tensor GeGluTanh(const at::Tensor& g, const at::Tensor& u) {
  if (UseFused(FusedOp::kGeGluTanh, {&g, &u}, g.size(-1))) {
#if OFFLOADD_WITH_CUDA
    return GluFused(cuda::Glu::kGeluTanh, g, u);
#endif
  }
  return at::gelu(g, "tanh") * u;
}

void GeGluTanhBackward(const at::Tensor& da, const at::Tensor& g, const at::Tensor& u,
                       at::Tensor* dg, at::Tensor* du, at::Tensor* a) {
  if (UseFused(FusedOp::kGeGluTanh, {&g, &u, &da}, g.size(-1))) {
#if OFFLOADD_WITH_CUDA
    return GluBackwardFused(cuda::Glu::kGeluTanh, da, g, u, dg, du, a);
#endif
  }
  // The ops autograd would run for gelu(g, approximate="tanh") * u, in the same dtype.
  at::Tensor s = at::gelu(g, "tanh");
  *dg = at::gelu_backward(da * u, g, "tanh");
  *du = da * s;
  if (a) *a = s * u;
}

at::Tensor CrossEntropy(const at::Tensor& logits, const at::Tensor& targets, double normalizer,
                        at::Tensor* dlogits, double grad_scale) {
  const int64_t vocab = logits.size(-1);
  at::Tensor lf = logits.to(at::kFloat).reshape({-1, vocab});
  at::Tensor t = targets.reshape({-1});
  at::Tensor mask = t.ne(-100);
  at::Tensor safe_t = at::where(mask, t, at::zeros_like(t)).unsqueeze(1);
  at::Tensor lse = at::logsumexp(lf, 1, /*keepdim=*/true);
  at::Tensor token_loss = (lse - lf.gather(1, safe_t)).squeeze(1);
  at::Tensor loss = at::where(mask, token_loss, at::zeros_like(token_loss)).sum() / normalizer;
  if (dlogits) {
    // d/dlogits of sum CE / N = (softmax - onehot) * mask / N, cast back like `.float()`'s grad.
    at::Tensor p = (lf - lse).exp();
    p.scatter_add_(1, safe_t, at::full_like(safe_t, -1, lf.options()));
    p.mul_(mask.unsqueeze(1).to(at::kFloat) / normalizer);
    if (grad_scale != 1.0) p.mul_(grad_scale);  // autograd's (loss * S).backward() scales here
    *dlogits = p.to(logits.scalar_type()).view(logits.sizes());
  }
  return loss;
}

static_assert(kHeadChunkBytes == engine::kHeadChunkBytes, "engine/head_chunk.h is what the validator counts");

at::Tensor LmHeadLoss(const at::Tensor& n, const at::Tensor& w, const at::Tensor& targets,
                      double normalizer, at::Tensor* dn, at::Tensor* dw, int64_t chunk_bytes,
                      double grad_scale, double softcap) {
  const int64_t hidden = n.size(-1), vocab = w.size(0);
  at::Tensor n2 = n.reshape({-1, hidden});
  at::Tensor t2 = targets.reshape({-1});
  const int64_t tokens = n2.size(0);
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes / (vocab * 4));
  const bool grad = dn != nullptr;
  at::Tensor loss = at::zeros({}, n.options().dtype(at::kFloat));
  at::Tensor dn2, dw32;
  if (grad) {
    dn2 = at::empty_like(n2);
    dw32 = at::zeros({vocab, hidden}, w.options().dtype(at::kFloat));
  }
  for (int64_t start = 0; start < tokens; start += chunk) {
    const int64_t len = std::min(chunk, tokens - start);
    at::Tensor nc = n2.narrow(0, start, len);
    at::Tensor logits = at::linear(nc, w);
    at::Tensor capped_tanh;
    if (softcap > 0) {  // transformers' Gemma 2: / cap, tanh, * cap in the logits' dtype
      capped_tanh = at::tanh(logits / softcap);
      logits = capped_tanh * softcap;
    }
    at::Tensor dlogits;
    loss += CrossEntropy(logits, t2.narrow(0, start, len), normalizer, grad ? &dlogits : nullptr,
                         grad_scale);
    if (grad && softcap > 0) dlogits = at::tanh_backward(dlogits * softcap, capped_tanh) / softcap;
    if (grad) {
      dn2.narrow(0, start, len).copy_(dlogits.mm(w));
      dw32 += dlogits.t().mm(nc);
    }
  }
  if (grad) {
    *dn = dn2.view(n.sizes());
    *dw = dw32.to(w.scalar_type());
  }
  return loss;
}

at::Tensor SplitHeads(const at::Tensor& x, int64_t heads, int64_t head_dim) {
  return x.reshape({x.size(0), x.size(1), heads, head_dim}).transpose(1, 2);
}

at::Tensor MergeHeads(const at::Tensor& x) {
  return x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

}  // namespace offloadd::engine::ops
