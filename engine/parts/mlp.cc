// MLP part: down(act(gate(x)) * up(x)) with act = silu (SwiGLU: Llama, Mistral, Qwen, OLMo 2,
// Phi-3 with its fused gate_up_proj, gate rows first) or tanh-GELU (GeGLU: Gemma 2/3), biases per
// mlp_bias; GPT-2's c_proj(gelu_new(c_fc(x))) with Conv1D weights.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>

#include "engine/ops.h"
#include "engine/parts.h"

namespace offloadd::engine::parts {
namespace {
std::atomic<int64_t> g_tile_bytes{kMlpTileBytes};
}  // namespace

void SetMlpTileBytes(int64_t bytes) {
  g_tile_bytes.store(bytes > 0 ? bytes : kMlpTileBytes, std::memory_order_relaxed);
}

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

int64_t MlpPart::TileRows(double e) const {
  return MlpTileRows(ff_, static_cast<int64_t>(e), g_tile_bytes.load(std::memory_order_relaxed));
}

bool MlpPart::Tiled(double tokens, double e) const {
  return kind_ != MlpKind::kGeluMlp && tokens > static_cast<double>(TileRows(e));
}

void MlpPart::GateUp(const Weights& W, const at::Tensor& x, at::Tensor* gate, at::Tensor* up,
                     at::Tensor* fused) const {
  if (gate_up_ != kAbsent) {
    *fused = ops::Linear(x, W[gate_up_], W.Opt(gub_));
    *gate = fused->narrow(-1, 0, ff_);
    *up = fused->narrow(-1, ff_, ff_);
  } else {
    *gate = ops::Linear(x, W[gate_], W.Opt(gb_));
    *up = ops::Linear(x, W[up_], W.Opt(ub_));
  }
}

at::Tensor MlpPart::TiledForward(const Weights& W, const at::Tensor& x) const {
  const at::Tensor x2 = x.reshape({-1, hidden_});
  const int64_t rows = x2.size(0), tile = TileRows(static_cast<double>(x.element_size()));
  at::Tensor y = at::empty({rows, hidden_}, x.options());
  for (int64_t s = 0; s < rows; s += tile) {
    const int64_t len = std::min(tile, rows - s);
    at::Tensor gate, up, fused;
    GateUp(W, x2.narrow(0, s, len), &gate, &up, &fused);
    at::Tensor a = kind_ == MlpKind::kSwiGlu ? ops::SwiGlu(gate, up) : ops::GeGluTanh(gate, up);
    gate = up = fused = at::Tensor();
    y.narrow(0, s, len).copy_(ops::Linear(a, W[down_], W.Opt(db_)));
  }
  return y.view(x.sizes());
}

at::Tensor MlpPart::TiledBackward(const Weights& W, const at::Tensor& dy, const at::Tensor& x,
                                  const Emit& emit) const {
  const at::Tensor x2 = x.reshape({-1, hidden_}), dy2 = dy.reshape({-1, hidden_});
  const int64_t rows = x2.size(0), tile = TileRows(static_cast<double>(x.element_size()));
  const auto f32 = x.options().dtype(at::kFloat);
  const bool fused = gate_up_ != kAbsent;
  // fp32 sums over tiles: [down, down bias, gate (or gate_up), gate bias, up, up bias].
  at::Tensor g_down = at::zeros(W[down_].sizes(), f32), g_db, g_in, g_inb, g_up, g_ub;
  g_in = at::zeros(W[fused ? gate_up_ : gate_].sizes(), f32);
  if (!fused) g_up = at::zeros(W[up_].sizes(), f32);
  if (db_ != kAbsent) g_db = at::zeros({hidden_}, f32);
  if (fused ? gub_ != kAbsent : gb_ != kAbsent) g_inb = at::zeros({fused ? 2 * ff_ : ff_}, f32);
  if (!fused && ub_ != kAbsent) g_ub = at::zeros({ff_}, f32);
  at::Tensor dx = at::empty({rows, hidden_}, x.options());
  at::Tensor dw, db;
  for (int64_t s = 0; s < rows; s += tile) {
    const int64_t len = std::min(tile, rows - s);
    const at::Tensor xt = x2.narrow(0, s, len), dyt = dy2.narrow(0, s, len);
    at::Tensor gate, up, gu, dgate, dup, act;
    GateUp(W, xt, &gate, &up, &gu);
    at::Tensor da = dyt.mm(W[down_]);
    if (kind_ == MlpKind::kSwiGlu) {
      ops::SwiGluBackward(da, gate, up, &dgate, &dup, &act);
    } else {
      ops::GeGluTanhBackward(da, gate, up, &dgate, &dup, &act);
    }
    da = gate = up = gu = at::Tensor();
    g_down.add_(dyt.t().mm(act));
    if (g_db.defined()) g_db.add_(dyt.sum(0));
    act = at::Tensor();
    at::Tensor dxt = dx.narrow(0, s, len);
    if (fused) {
      dxt.copy_(ops::LinearBackward(at::cat({dgate, dup}, -1), xt, W[gate_up_], g_inb.defined(),
                                    &dw, &db));
      g_in.add_(dw);
      if (g_inb.defined()) g_inb.add_(db);
      continue;
    }
    dxt.copy_(ops::LinearBackward(dgate, xt, W[gate_], g_inb.defined(), &dw, &db));
    g_in.add_(dw);
    if (g_inb.defined()) g_inb.add_(db);
    at::Tensor acc = dxt.contiguous();
    ops::LinearBackward(dup, xt, W[up_], g_ub.defined(), &dw, &db, &acc);
    if (!dxt.is_same(acc)) dxt.copy_(acc);
    g_up.add_(dw);
    if (g_ub.defined()) g_ub.add_(db);
  }
  const c10::ScalarType dtype = W[down_].scalar_type();
  emit(down_, g_down.to(dtype));
  if (db_ != kAbsent) emit(db_, g_db.to(dtype));
  if (fused) {
    emit(gate_up_, g_in.to(dtype));
    if (gub_ != kAbsent) emit(gub_, g_inb.to(dtype));
  } else {
    emit(gate_, g_in.to(dtype));
    if (gb_ != kAbsent) emit(gb_, g_inb.to(dtype));
    emit(up_, g_up.to(dtype));
    if (ub_ != kAbsent) emit(ub_, g_ub.to(dtype));
  }
  return dx.view(x.sizes());
}

at::Tensor MlpPart::Forward(const Weights& W, const at::Tensor& x,
                            std::vector<at::Tensor>* saved) const {
  if (Tiled(static_cast<double>(x.numel() / hidden_), static_cast<double>(x.element_size()))) {
    return TiledForward(W, x);
  }
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

MlpPart::Saved MlpPart::Read(SavedReader* r, const at::Tensor& x) const {
  Saved s;
  if (Tiled(static_cast<double>(x.numel() / hidden_), static_cast<double>(x.element_size()))) {
    return s;
  }
  s.a = r->Next();
  if (kind_ != MlpKind::kGeluMlp && gate_up_ == kAbsent) s.b = r->Next();
  return s;
}

at::Tensor MlpPart::Backward(const Weights& W, const at::Tensor& dy,
                             const std::function<at::Tensor()>& input, const Saved& s,
                             const Emit& emit) const {
  at::Tensor dw, db;
  if (!s.a.defined() && kind_ != MlpKind::kGeluMlp) return TiledBackward(W, dy, input(), emit);
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
  if (Tiled(tokens, e)) return 0;
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
  const std::string tiles = ", sequence tiles of " +
                            std::to_string(TileRows(static_cast<double>(c10::elementSize(dtype)))) +
                            " tokens beyond that";
  return (why.empty() ? "fused" : "aten (" + why + ")") + tiles;
}

}  // namespace offloadd::engine::parts
