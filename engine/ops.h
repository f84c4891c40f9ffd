#pragma once
// Forward/backward math shared by the blocks (engine-internal). Each backward is the analytic
// gradient of the matching forward, written to follow transformers' dtype handling so that fp32
// results match PyTorch autograd to rounding and bf16 results to bf16 rounding.

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "engine/rope.h"

namespace offloadd::engine::ops {

// y = x W^T (+ b) for nn.Linear weights [out, in].
at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
// Returns dx; writes dW (and db when b is defined). With `accumulate` (a contiguous d input from
// another branch), dx is added into it inside the GEMM (addmm_, one rounding) and it is returned.
at::Tensor LinearBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                          bool has_bias, at::Tensor* dw, at::Tensor* db,
                          at::Tensor* accumulate = nullptr);
// y = x W + b for GPT-2 Conv1D weights [in, out].
at::Tensor Conv1D(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
at::Tensor Conv1DBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                          at::Tensor* dw, at::Tensor* db);

// RMSNorm over the last dimension: n = x.float() * rstd, rstd = rsqrt(mean(x.float()^2) + eps)
// (fp32, [.., 1]), then the weight, with each family's roundings in 16-bit dtypes:
//   kCastThenScale  w * n.to(dtype)                    Llama, Mistral, Qwen2/3, Phi-3
//   kScaleThenCast  (w.float() * n).to(dtype)          OLMo 2
//   kOneOffset      ((1 + w.float()) * n).to(dtype)    Gemma 2/3 (the checkpoint stores w)
// x may be [.., h] of any rank: per-head q/k norm passes [B, T, H, head_dim] with w [head_dim].
enum class RmsScale { kCastThenScale, kScaleThenCast, kOneOffset };
// The flavour of a model's RMSNorms (its decoder norms, final norm and q/k norms alike).
RmsScale RmsScaleFor(const ModelConfig& c);

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor* rstd,
                   RmsScale scale = RmsScale::kCastThenScale);
// Same output from a saved rstd (no reduction).
at::Tensor RmsNormFromRstd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                           RmsScale scale = RmsScale::kCastThenScale);
// Returns d loss/d x, plus `residual` when given (the residual branch's gradient, added in the
// same pass on CUDA); writes d loss/d w in w's dtype (summed over rows in fp32).
at::Tensor RmsNormBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                           const at::Tensor& rstd, at::Tensor* dw,
                           const at::Tensor& residual = at::Tensor(),
                           RmsScale scale = RmsScale::kCastThenScale);
// The same with a bool: one_offset picks kOneOffset, else kCastThenScale (OLMo 2 needs the enum).
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor* rstd,
                   bool one_offset);
at::Tensor RmsNormFromRstd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd,
                           bool one_offset);
at::Tensor RmsNormBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                           const at::Tensor& rstd, at::Tensor* dw, const at::Tensor& residual,
                           bool one_offset);

// LayerNorm over the last dimension (ATen's native kernels). mean/rstd are fp32 [.., 1].
at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps,
                     at::Tensor* mean, at::Tensor* rstd);
at::Tensor LayerNormBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                             const at::Tensor& b, const at::Tensor& mean, const at::Tensor& rstd,
                             at::Tensor* dw, at::Tensor* db);

// RoPE (RopeTables, ApplyRope, ApplyRopeBackward): engine/rope.h.

// Causal scaled-dot-product attention. q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] with Hq % Hkv == 0.
// `mask` undefined: plain causal attention through ATen's fused kernels (flash on CPU and for
// bf16/fp16 on CUDA, memory-efficient otherwise); with `window` > 0 (WindowedFlashFits only) the
// flash kernel attends to the last `window` keys of each query (itself included). `mask`
// defined: an additive [B, 1, T, T] mask in q's dtype (0 or -inf, see SegmentMask / CausalMask)
// through an explicit softmax (O(T^2) memory) as in transformers' eager attention; `softcap` > 0
// (Gemma 2, explicit path only) caps the scaled logits as softcap * tanh(logits / softcap) before
// the mask is added.
// For bf16/fp16 the kernels run on k and v less their mean over the sequence (per batch row and KV
// head; k only without soft-capping), the values' mean added back to the output: the same
// attention in exact arithmetic, without the kernels' backward error that grows with a large
// common component of k and v (q/k/v biases; ops.cc says why). The means are constants of the
// backward (no gradient flows through them, exactly so in exact arithmetic).
// Returns out [B, Hq, T, D]; appends to `aux` what AttentionBackward needs besides q, k, v and
// the kernel's output, written to `*kernel_out` (what AttentionBackward takes as `out`; equal to
// the returned out in fp32). AttentionValue(kernel_out, aux) rebuilds the returned out bit for bit.
at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                     const at::Tensor& mask, std::vector<at::Tensor>* aux, double softcap = 0.0,
                     int64_t window = 0, at::Tensor* kernel_out = nullptr);
at::Tensor AttentionValue(const at::Tensor& kernel_out, const at::Tensor* aux);
void AttentionBackward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& out, const at::Tensor* aux,
                       double scale, const at::Tensor& mask, at::Tensor* dq, at::Tensor* dk,
                       at::Tensor* dv, double softcap = 0.0, int64_t window = 0);
// Whether the flash kernel's own sliding window can run for q on `device` in `dtype` (CUDA,
// bf16/fp16, head size a multiple of 8 up to 256, OFFLOADD_ATTENTION_KERNEL auto or flash).
bool WindowedFlashFits(c10::Device device, c10::ScalarType dtype, int64_t head_dim);

// Packed documents: segment_ids [B, T] -> additive mask [B, 1, T, T] allowing token i to see
// token j iff j <= i and segment_ids[i] == segment_ids[j]; with window > 0 also i - j < window
// (sliding-window layers: a token sees itself and the window - 1 before it).
at::Tensor SegmentMask(const at::Tensor& segment_ids, c10::ScalarType dtype, int64_t window = 0);
// The same for one document per row: [1, 1, T, T] (broadcast over the batch).
at::Tensor CausalMask(int64_t t, c10::Device device, c10::ScalarType dtype, int64_t window = 0);

// Fused CUDA kernels. On CUDA, RMSNorm (every RmsScale, any row length: per-head q/k norm rows
// of head_dim run several rows per block), SwiGLU and GeGLU run the kernels of engine/cuda/;
// OFFLOADD_FUSED_KERNELS=auto|fused|aten forces a flavour (a forced flavour the inputs cannot
// use is an error). SetFusedKernels("auto"|"fused"|"aten") overrides it for this process (tests).
void SetFusedKernels(const std::string& mode);
enum class FusedOp { kRmsNorm, kRmsNormBackward, kSwiGlu, kGeGluTanh };
// Why `op` on tensors of `dtype` on `device` with last dimension `last_dim` would run the ATen
// op sequence instead of its fused kernel under the current mode ("OFFLOADD_FUSED_KERNELS=aten",
// "needs CUDA tensors", ...); empty when the fused kernel runs. For the plan log's fallback list.
std::string FusedKernelFor(FusedOp op, c10::ScalarType dtype, c10::Device device,
                           int64_t last_dim);

// SwiGLU: silu(g) * u, and its backward; `a`, when given, receives silu(g) * u again (one pass
// over g and u instead of two).
at::Tensor SwiGlu(const at::Tensor& g, const at::Tensor& u);
void SwiGluBackward(const at::Tensor& da, const at::Tensor& g, const at::Tensor& u, at::Tensor* dg,
                    at::Tensor* du, at::Tensor* a = nullptr);
// GeGLU with tanh-GELU (Gemma's gelu_pytorch_tanh): gelu(g, approximate="tanh") * u in the
// model dtype, and its backward, as SwiGLU.
at::Tensor GeGluTanh(const at::Tensor& g, const at::Tensor& u);
void GeGluTanhBackward(const at::Tensor& da, const at::Tensor& g, const at::Tensor& u,
                       at::Tensor* dg, at::Tensor* du, at::Tensor* a = nullptr);

// Cross-entropy summed over targets != kIgnoreIndex, divided by `normalizer`, fp32 scalar.
// With `dlogits` non-null also returns d (loss * grad_scale) / d logits in logits' dtype, scaled
// in fp32 before the cast (fp16 loss scaling keeps small gradients from flushing to zero).
at::Tensor CrossEntropy(const at::Tensor& logits, const at::Tensor& targets, double normalizer,
                        at::Tensor* dlogits, double grad_scale = 1.0);

// LM head + loss for training: logits = n W^T, loss = CrossEntropy(logits, targets) / normalizer,
// computed over chunks of tokens so that no [tokens, vocab] tensor larger than kHeadChunkBytes
// (fp32) exists at once (Llama-3's 128k vocabulary x 16k tokens would be 8 GiB per copy). With
// dn/dw non-null also returns d loss / d n ([B, T, H], n's dtype) and d loss / d W ([V, H], W's
// dtype, accumulated over chunks in fp32). The gradients are of loss * grad_scale; the returned
// loss is not scaled. `softcap` > 0 (Gemma 2's final_logit_softcapping) caps the logits as
// softcap * tanh(logits / softcap) before the loss, in the logits' dtype, as transformers does.
inline constexpr int64_t kHeadChunkBytes = 128ll << 20;  // engine/head_chunk.h says why
at::Tensor LmHeadLoss(const at::Tensor& n, const at::Tensor& w, const at::Tensor& targets,
                      double normalizer, at::Tensor* dn, at::Tensor* dw,
                      int64_t chunk_bytes = kHeadChunkBytes, double grad_scale = 1.0,
                      double softcap = 0.0);

// [B, T, H*D] <-> [B, H, T, D]
at::Tensor SplitHeads(const at::Tensor& x, int64_t heads, int64_t head_dim);
at::Tensor MergeHeads(const at::Tensor& x);

}  // namespace offloadd::engine::ops
