// Norm part: RMSNorm in the family's rounding (ops::RmsScale: Llama casts the normalised input to
// the input dtype, then multiplies by w; OLMo 2 multiplies by w in fp32, then casts; Gemma scales
// by (1 + w) in fp32, then casts), and LayerNorm (ATen's native kernels). Also the shared
// projection helpers.
#include <ATen/ATen.h>

#include "engine/ops.h"
#include "engine/parts.h"

namespace offloadd::engine::parts {
NormPart::NormPart(const ModelConfig& c, const std::string& weight, const std::string& bias,
                   int64_t dim, ParamList* pl)
    : kind_(c.norm), scale_(ops::RmsScaleFor(c)), eps_(c.norm_eps), dim_(dim) {
  if (weight.empty()) return;
  w_ = pl->Add(weight, {dim});
  if (kind_ == NormKind::kLayer) b_ = pl->Add(bias, {dim});
}

at::Tensor NormPart::Forward(const Weights& W, const at::Tensor& x,
                             std::vector<at::Tensor>* saved) const {
  at::Tensor y, a, b;
  switch (kind_) {
    case NormKind::kRms:
    case NormKind::kRmsOneOffset:
      y = ops::RmsNorm(x, W[w_], eps_, &a, scale_);
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
    case NormKind::kRmsOneOffset:
      return ops::RmsNormFromRstd(x, W[w_], stats[0], scale_);
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
    case NormKind::kRmsOneOffset:
      dx = ops::RmsNormBackward(dy, x, W[w_], stats[0], &dw, residual, scale_);
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

std::string NormPart::Describe(c10::Device device, c10::ScalarType dtype) const {
  if (kind_ == NormKind::kLayer) return "aten (LayerNorm: ATen's native kernel)";
  std::string why = ops::FusedKernelFor(ops::FusedOp::kRmsNorm, dtype, device, dim_);
  if (why.empty()) why = ops::FusedKernelFor(ops::FusedOp::kRmsNormBackward, dtype, device, dim_);
  return why.empty() ? "fused" : "aten (" + why + ")";
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
