// MLP part: down(act(gate(x)) * up(x)) with act = silu (SwiGLU: Llama, Mistral, Qwen, OLMo 2,
// Phi-3 with its fused gate_up_proj, gate rows first) or tanh-GELU (GeGLU: Gemma 2/3), biases per
// mlp_bias; GPT-2's c_proj(gelu_new(c_fc(x))) with Conv1D weights.
#include <ATen/ATen.h>

#include "engine/ops.h"
#include "engine/parts.h"

namespace offloadd::engine::parts {
MlpPart::MlpPart(const ModelConfig& c, const std::string& p, ParamList* pl)
    : kind_(c.mlp),
      conv1d_(c.arch == Architecture::kGpt2),
      hidden_(c.hidden_size),
      ff_(c.intermediate_size) {
  const TensorNames& n = c.names;
  const int64_t h = hidden_, ff = ff_;
  if (kind_ == MlpKind::kGeluMlp) {  // GPT-2: up = c_fc [h, ff], down = c_proj [ff, h]
    up_ = pl->Add(p + n.up + ".weight", {h, ff});
    ub_ = pl->Add(p + n.up + ".bias", {ff});
    down_ = pl->Add(p + n.down + ".weight", {ff, h});
    db_ = pl->Add(p + n.down + ".bias", {h});
    return;
  }
  if (!n.gate_up.empty()) {
    gate_up_ = pl->Add(p + n.gate_up + ".weight", {2 * ff, h});
  } else {
    gate_ = pl->Add(p + n.gate + ".weight", {ff, h});
    up_ = pl->Add(p + n.up + ".weight", {ff, h});
  }
  down_ = pl->Add(p + n.down + ".weight", {h, ff});
  if (c.mlp_bias) {
    if (gate_up_ != kAbsent) {
      gub_ = pl->Add(p + n.gate_up + ".bias", {2 * ff});
    } else {
      gb_ = pl->Add(p + n.gate + ".bias", {ff});
      ub_ = pl->Add(p + n.up + ".bias", {ff});
    }
    db_ = pl->Add(p + n.down + ".bias", {h});
  }
}

at::Tensor MlpPart::Forward(const Weights& W, const at::Tensor& x,
                            std::vector<at::Tensor>* saved) const {
  if (kind_ == MlpKind::kGeluMlp) {
    at::Tensor fc = ops::Conv1D(x, W[up_], W[ub_]);
    if (saved) saved->push_back(fc);
    return ops::Conv1D(at::gelu(fc, "tanh"), W[down_], W[db_]);
  }
  at::Tensor gate, up;
  if (gate_up_ != kAbsent) {
    at::Tensor gu = ops::Linear(x, W[gate_up_], W.Opt(gub_));
    gate = gu.narrow(-1, 0, ff_);
    up = gu.narrow(-1, ff_, ff_);
    if (saved) saved->push_back(gu);
  } else {
    gate = ops::Linear(x, W[gate_], W.Opt(gb_));
    up = ops::Linear(x, W[up_], W.Opt(ub_));
    if (saved) saved->insert(saved->end(), {gate, up});
  }
  at::Tensor a = kind_ == MlpKind::kSwiGlu ? ops::SwiGlu(gate, up) : ops::GeGluTanh(gate, up);
  return ops::Linear(a, W[down_], W.Opt(db_));
}

MlpPart::Saved MlpPart::Read(SavedReader* r) const {
  Saved s;
  s.a = r->Next();
  if (kind_ != MlpKind::kGeluMlp && gate_up_ == kAbsent) s.b = r->Next();
  return s;
}

at::Tensor MlpPart::Backward(const Weights& W, const at::Tensor& dy,
                             const std::function<at::Tensor()>& input, const Saved& s,
                             const Emit& emit) const {
  at::Tensor dw, db;
  if (kind_ == MlpKind::kGeluMlp) {
    const at::Tensor& fc = s.a;
    at::Tensor dgelu = ops::Conv1DBackward(dy, at::gelu(fc, "tanh"), W[down_], &dw, &db);
    emit(down_, dw);
    emit(db_, db);
    at::Tensor dfc = at::gelu_backward(dgelu, fc, "tanh");
    at::Tensor dx = ops::Conv1DBackward(dfc, input(), W[up_], &dw, &db);
    emit(up_, dw);
    emit(ub_, db);
    return dx;
  }
  // y = down(a): a is rebuilt by the activation's backward pass over gate and up, so down's
  // weight gradient is taken after it (no [tokens, ff] product is saved).
  at::Tensor dy2 = dy.reshape({-1, hidden_});
  const bool fused = gate_up_ != kAbsent;
  at::Tensor gate = fused ? s.a.narrow(-1, 0, ff_) : s.a;
  at::Tensor up = fused ? s.a.narrow(-1, ff_, ff_) : s.b;
  at::Tensor act, dgate, dup;
  at::Tensor da = dy2.mm(W[down_]);
  if (kind_ == MlpKind::kSwiGlu) {
    ops::SwiGluBackward(da, gate.reshape({-1, ff_}), up.reshape({-1, ff_}), &dgate, &dup, &act);
  } else {
    ops::GeGluTanhBackward(da, gate.reshape({-1, ff_}), up.reshape({-1, ff_}), &dgate, &dup,
                           &act);
  }
  da = at::Tensor();
  emit(down_, dy2.t().mm(act));
  if (db_ != kAbsent) emit(db_, dy2.sum(0));
  act = at::Tensor();
  const at::Tensor x = input();
  if (fused) {
    at::Tensor dx = ops::LinearBackward(at::cat({dgate, dup}, -1), x, W[gate_up_], gub_ != kAbsent,
                                        &dw, &db);
    emit(gate_up_, dw);
    if (gub_ != kAbsent) emit(gub_, db);
    return dx;
  }
  at::Tensor dx = ops::LinearBackward(dgate, x, W[gate_], gb_ != kAbsent, &dw, &db);
  emit(gate_, dw);
  if (gb_ != kAbsent) emit(gb_, db);
  ops::LinearBackward(dup, x, W[up_], ub_ != kAbsent, &dw, &db, &dx);
  emit(up_, dw);
  if (ub_ != kAbsent) emit(ub_, db);
  return dx;
}

int64_t MlpPart::SavedBytes(double tokens, double e) const {
  const double width = kind_ == MlpKind::kGeluMlp ? ff_ : 2 * ff_;
  return static_cast<int64_t>(tokens * e * width);
}

double MlpPart::Flops(double tokens) const {
  return kind_ == MlpKind::kGeluMlp ? 2 * tokens * hidden_ * 2 * ff_
                                    : 2 * tokens * hidden_ * 3 * ff_;
}

std::string MlpPart::Describe(c10::Device device, c10::ScalarType dtype) const {
  if (kind_ == MlpKind::kGeluMlp) return "aten (gelu_new MLP: ATen's GELU kernel)";
  const auto op = kind_ == MlpKind::kSwiGlu ? ops::FusedOp::kSwiGlu : ops::FusedOp::kGeGluTanh;
  const std::string why = ops::FusedKernelFor(op, dtype, device, ff_);
  return why.empty() ? "fused" : "aten (" + why + ")";
}

}  // namespace offloadd::engine::parts
