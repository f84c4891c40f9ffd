// Norm part: RMSNorm scaled by w (Llama: the normalised input is cast to the input dtype, then
// multiplied by w), RMSNorm scaled by (1 + w) (Gemma: the product is taken in fp32, then cast),
// and LayerNorm (ATen's native kernels). Also the shared projection helpers.
#include <ATen/ATen.h>

#include "engine/ops.h"
#include "engine/parts.h"

namespace offloadd::engine::parts {
namespace {

// RMSNorm with (1 + w), transformers' Gemma2RMSNorm: y = (n * (1 + w.float())).to(x.dtype),
// n = x.float() * rstd. ATen ops; the fused CUDA flavour arrives with ops::RmsNorm(one_offset)
// (h5), which these three functions then forward to.
at::Tensor RmsOneOffset(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor* rstd) {
  at::Tensor xf = x.to(at::kFloat);
  *rstd = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return ((xf * *rstd) * (1.0 + w.to(at::kFloat))).to(x.scalar_type());
}

at::Tensor RmsOneOffsetFromRstd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& rstd) {
  return ((x.to(at::kFloat) * rstd) * (1.0 + w.to(at::kFloat))).to(x.scalar_type());
}

// Autograd's chain for the ops above: g = dy.float(); dw = sum(g * n) cast to w's dtype;
// dn = g * (1 + w); dx = rstd * (dn - n * mean(dn * n)).
at::Tensor RmsOneOffsetBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                                const at::Tensor& rstd, at::Tensor* dw,
                                const at::Tensor& residual) {
  const int64_t h = x.size(-1);
  at::Tensor n = x.to(at::kFloat) * rstd;
  at::Tensor g = dy.to(at::kFloat);
  *dw = (g * n).reshape({-1, h}).sum(0).to(w.scalar_type());
  at::Tensor dn = g * (1.0 + w.to(at::kFloat));
  at::Tensor dx = (rstd * (dn - n * (dn * n).mean(-1, /*keepdim=*/true))).to(x.scalar_type());
  return residual.defined() ? residual + dx : dx;
}

}  // namespace

NormPart::NormPart(NormKind kind, double eps, const std::string& weight, const std::string& bias,
                   int64_t dim, ParamList* pl)
    : kind_(kind), eps_(eps) {
  if (weight.empty()) return;
  w_ = pl->Add(weight, {dim});
  if (kind == NormKind::kLayer) b_ = pl->Add(bias, {dim});
}

at::Tensor NormPart::Forward(const Weights& W, const at::Tensor& x,
                             std::vector<at::Tensor>* saved) const {
  at::Tensor y, a, b;
  switch (kind_) {
    case NormKind::kRms:
      y = ops::RmsNorm(x, W[w_], eps_, &a);
      break;
    case NormKind::kRmsOneOffset:
      y = RmsOneOffset(x, W[w_], eps_, &a);
      break;
    case NormKind::kLayer:
      y = ops::LayerNorm(x, W[w_], W[b_], eps_, &a, &b);
      break;
  }
  if (saved) {
    saved->push_back(a);
    if (kind_ == NormKind::kLayer) saved->push_back(b);
  }
  return y;
}

at::Tensor NormPart::Reapply(const Weights& W, const at::Tensor& x, const at::Tensor* stats) const {
  switch (kind_) {
    case NormKind::kRms:
      return ops::RmsNormFromRstd(x, W[w_], stats[0]);
    case NormKind::kRmsOneOffset:
      return RmsOneOffsetFromRstd(x, W[w_], stats[0]);
    case NormKind::kLayer:  // ATen's kernel again: bit-equal to the forward's output
      return ops::LayerNorm(x, W[w_], W[b_], eps_, nullptr, nullptr);
  }
  return {};
}

at::Tensor NormPart::Backward(const Weights& W, const at::Tensor& dy, const at::Tensor& x,
                              const at::Tensor* stats, const Emit& emit,
                              const at::Tensor& residual) const {
  at::Tensor dw, db, dx;
  switch (kind_) {
    case NormKind::kRms:
      dx = ops::RmsNormBackward(dy, x, W[w_], stats[0], &dw, residual);
      break;
    case NormKind::kRmsOneOffset:
      dx = RmsOneOffsetBackward(dy, x, W[w_], stats[0], &dw, residual);
      break;
    case NormKind::kLayer:
      dx = ops::LayerNormBackward(dy, x, W[w_], W[b_], stats[0], stats[1], &dw, &db);
      if (residual.defined()) dx = residual + dx;
      break;
  }
  emit(w_, dw);
  if (b_ != kAbsent) emit(b_, db);
  return dx;
}

std::string NormPart::Describe(c10::Device device, c10::ScalarType) const {
  switch (kind_) {
    case NormKind::kRms:
      return device.is_cuda() ? "fused" : "aten (CPU)";
    case NormKind::kRmsOneOffset:
      return "aten (RMSNorm with (1 + w) has no fused kernel yet)";
    case NormKind::kLayer:
      return "aten (LayerNorm: ATen's native kernel)";
  }
  return "?";
}

at::Tensor Project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool conv1d) {
  return conv1d ? ops::Conv1D(x, w, b) : ops::Linear(x, w, b);
}

at::Tensor ProjectBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                           bool has_bias, bool conv1d, at::Tensor* dw, at::Tensor* db,
                           at::Tensor* accumulate) {
  if (!conv1d) return ops::LinearBackward(dy, x, w, has_bias, dw, db, accumulate);
  at::Tensor dx = ops::Conv1DBackward(dy, x, w, dw, db);
  if (accumulate == nullptr) return dx;
  accumulate->add_(dx.view(accumulate->sizes()));
  return *accumulate;
}

}  // namespace offloadd::engine::parts
