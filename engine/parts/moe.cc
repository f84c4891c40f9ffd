// Mixture-of-experts feed-forward (Qwen3-MoE, OLMoE, Mixtral, gpt-oss), as transformers 5's
// *TopKRouter / *Experts modules compute it; the load-balancing loss of MoeRouterStats
// (transformers' load_balancing_loss_func without an attention mask).
//
//   logits = x W_r^T (fp32)      probs = softmax(logits)      v, idx = topk(probs, k)
//   w = v / sum(v) (norm_topk_prob) or v        y = sum_j w_j * down_idx_j(silu(g) * u)
//
// gpt-oss (GptOssTopKRouter / GptOssExperts): logits = x W_r^T + b_r in the compute dtype,
// v, idx = topk(logits, k), w = softmax(v); each expert computes h = x W_gu + b_gu ([H, 2I], gate
// at even columns, up at odd ones), g = min(gate, L), u = clamp(up, -L, L), a = (u + 1) * g *
// sigmoid(alpha g), and a W_d + b_d; the load-balancing loss reads softmax(logits) over all
// experts.
//
// Backward: d w_j = <dy, expert output_j>; through the renormalisation and the softmax to the
// logits (plus the load-balancing loss's d aux / d probs), then W_r's gradient and d x.
#include <ATen/ATen.h>
#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "engine/ops.h"
#include "engine/parts.h"

namespace offloadd::engine {

at::Tensor MoeRouterStats::AuxLoss() const {
  at::Tensor c, p;
  double rows = 0;
  for (size_t l = 0; l < counts.size(); ++l) {
    if (!counts[l].defined()) continue;
    c = c.defined() ? c + counts[l] : counts[l];
    p = p.defined() ? p + prob_sums[l] : prob_sums[l];
    rows += static_cast<double>(this->rows[l]);
  }
  if (!c.defined() || rows == 0) return at::zeros({}, at::kFloat);
  return (c / rows * (p / rows)).sum() * static_cast<double>(num_experts);
}

at::Tensor MoeRouterStats::AuxProbGrad() const {
  at::Tensor c;
  double rows = 0;
  for (size_t l = 0; l < counts.size(); ++l) {
    if (!counts[l].defined()) continue;
    c = c.defined() ? c + counts[l] : counts[l];
    rows += static_cast<double>(this->rows[l]);
  }
  return c * (static_cast<double>(num_experts) / (rows * rows));
}

namespace parts {

// Each expert's rows in the permuted order: slot s = token * k + j of the top-k, sorted by
// expert (stable, so a token's slots keep their order within an expert).
struct MoePart::Routing {
  at::Tensor order;             // [N k] slots in permuted order
  at::Tensor tokens;            // [N k] the token of each permuted row
  at::Tensor experts;           // [N k] the expert of each permuted row (ascending)
  at::Tensor weights;           // [N, k] fp32 routing weights
  std::vector<int64_t> counts;  // rows per expert
};

MoePart::MoePart(const ModelConfig& c, int layer, const std::string& p, ParamList* pl)
    : layer_(layer),
      hidden_(c.hidden_size),
      ff_(c.moe.intermediate_size),
      experts_(c.moe.num_experts),
      top_k_(c.moe.top_k),
      norm_topk_(c.moe.norm_topk_prob),
      packed_(c.moe.packed),
      routing_(c.moe.routing),
      act_(c.moe.activation),
      alpha_(c.moe.swiglu_alpha),
      limit_(c.moe.swiglu_limit),
      transposed_(c.moe.transposed) {
  const TensorNames& n = c.names;
  const int64_t h = hidden_, ff = ff_;
  router_ = pl->Add(p + n.router + ".weight", {experts_, h});
  if (c.moe.router_bias) router_b_ = pl->Add(p + n.router + ".bias", {experts_});
  const std::string ex = p + n.experts + ".";
  if (transposed_) {
    gate_up_ = pl->Add(ex + "gate_up_proj", {experts_, h, 2 * ff});
    if (c.moe.expert_bias) gate_up_b_ = pl->Add(ex + "gate_up_proj_bias", {experts_, 2 * ff});
    down_ = pl->Add(ex + "down_proj", {experts_, ff, h});
    if (c.moe.expert_bias) down_b_ = pl->Add(ex + "down_proj_bias", {experts_, h});
    return;
  }
  if (packed_) {
    gate_up_ = pl->Add(ex + "gate_up_proj", {experts_, 2 * ff, h});
    down_ = pl->Add(ex + "down_proj", {experts_, h, ff});
    return;
  }
  for (int64_t e = 0; e < experts_; ++e) {
    const std::string pe = ex + std::to_string(e) + ".";
    gate_.push_back(pl->Add(pe + n.expert_gate + ".weight", {ff, h}));
    up_.push_back(pl->Add(pe + n.expert_up + ".weight", {ff, h}));
    downs_.push_back(pl->Add(pe + n.expert_down + ".weight", {h, ff}));
  }
}

at::Tensor MoePart::GateUp(const Weights& W, int64_t e) const {
  if (packed_) return W[gate_up_].select(0, e);
  return at::cat({W[gate_[e]], W[up_[e]]}, 0);
}

at::Tensor MoePart::Down(const Weights& W, int64_t e) const {
  return packed_ ? W[down_].select(0, e) : W[downs_[e]];
}

at::Tensor MoePart::ProjectGateUp(const Weights& W, int64_t e, const at::Tensor& x) const {
  if (!transposed_) return x.mm(GateUp(W, e).t());
  // transformers: x @ W + b, two roundings in the compute dtype.
  at::Tensor h = x.mm(GateUp(W, e));
  if (gate_up_b_ != kAbsent) h.add_(W[gate_up_b_].select(0, e));
  return h;
}

at::Tensor MoePart::ProjectDown(const Weights& W, int64_t e, const at::Tensor& act) const {
  if (!transposed_) return act.mm(Down(W, e).t());
  at::Tensor y = act.mm(Down(W, e));
  if (down_b_ != kAbsent) y.add_(W[down_b_].select(0, e));
  return y;
}

at::Tensor MoePart::Activate(const at::Tensor& gu) const {
  if (act_ == ExpertActivation::kSwiGlu) {
    return ops::SwiGlu(gu.narrow(1, 0, ff_), gu.narrow(1, ff_, ff_));
  }
  // GptOssExperts._apply_gate, op for op.
  const at::Tensor gate = gu.slice(1, 0, 2 * ff_, 2).clamp_max(limit_);
  const at::Tensor up = gu.slice(1, 1, 2 * ff_, 2).clamp(-limit_, limit_);
  at::Tensor glu = gate * at::sigmoid(gate * alpha_);
  return (up + 1) * glu;
}

at::Tensor MoePart::ActivateBackward(const at::Tensor& dact, const at::Tensor& gu,
                                     at::Tensor* act) const {
  if (act_ == ExpertActivation::kSwiGlu) {
    at::Tensor dgate, dup;
    ops::SwiGluBackward(dact, gu.narrow(1, 0, ff_), gu.narrow(1, ff_, ff_), &dgate, &dup, act);
    return at::cat({dgate, dup}, 1);
  }
  // Autograd's chain through _apply_gate: clamp passes the gradient where the input lies within
  // its bounds (inclusive), glu = g * s with s = sigmoid(alpha g).
  const at::Tensor gate_in = gu.slice(1, 0, 2 * ff_, 2), up_in = gu.slice(1, 1, 2 * ff_, 2);
  const at::Tensor g = gate_in.clamp_max(limit_), u = up_in.clamp(-limit_, limit_);
  const at::Tensor s = at::sigmoid(g * alpha_);
  const at::Tensor glu = g * s;
  const at::Tensor u1 = u + 1;
  *act = u1 * glu;
  at::Tensor dglu = dact * u1;
  at::Tensor dg = dglu * s + at::sigmoid_backward(dglu * g, s) * alpha_;
  at::Tensor dgate = dg * gate_in.le(limit_);
  at::Tensor dup = (dact * glu) * (up_in.ge(-limit_) & up_in.le(limit_));
  // Back to the interleaved columns: [rows, I, 2] -> [rows, 2I].
  return at::stack({dgate, dup}, -1).view({gu.size(0), 2 * ff_});
}

MoePart::Routing MoePart::Route(const at::Tensor& probs, const at::Tensor& top,
                                c10::ScalarType dtype) const {
  Routing r;
  at::Tensor flat = top.reshape({-1});
  std::tie(r.experts, r.order) = flat.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  r.tokens = r.order.div(top_k_, "floor");
  if (routing_ == MoeRouting::kTopKSoftmax) {
    // GptOssTopKRouter: softmax over the selected logits in the compute dtype.
    r.weights = at::softmax(probs.gather(1, top).to(dtype), -1).to(at::kFloat);
  } else {
    r.weights = probs.gather(1, top);
    if (norm_topk_) r.weights = r.weights / r.weights.sum(-1, true);
  }
  at::Tensor counts = at::bincount(flat, {}, experts_).to(at::kCPU);
  r.counts.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + experts_);
  return r;
}

at::Tensor MoePart::LoopExperts(const Weights& W, const Routing& r, const at::Tensor& xp,
                                at::Tensor* gate_up) const {
  at::Tensor gu = at::empty({xp.size(0), 2 * ff_}, xp.options());
  at::Tensor out = at::empty({xp.size(0), hidden_}, xp.options());
  int64_t off = 0;
  for (int64_t e = 0; e < experts_; ++e) {
    const int64_t rows = r.counts[e];
    if (rows == 0) continue;
    at::Tensor gu_e = gu.narrow(0, off, rows);
    gu_e.copy_(ProjectGateUp(W, e, xp.narrow(0, off, rows)));
    out.narrow(0, off, rows).copy_(ProjectDown(W, e, Activate(gu_e)));
    off += rows;
  }
  *gate_up = gu;
  return out;
}

at::Tensor MoePart::Forward(const Weights& W, const MicroBatch& mb, const at::Tensor& x_in,
                            std::vector<at::Tensor>* saved) const {
  const at::Tensor x = x_in.reshape({-1, hidden_});
  const int64_t n = x.size(0);
  at::Tensor probs, top;  // probs: the logits (fp32) with kTopKSoftmax
  if (routing_ == MoeRouting::kTopKSoftmax) {
    // F.linear in the compute dtype, top-k of the logits (the same experts as of their softmax).
    probs = at::linear(x, W[router_], W.Opt(router_b_)).to(at::kFloat);
    top = std::get<1>(probs.topk(top_k_, -1));
  } else {
    // The router in fp32 (its softmax is fp32 in these families).
    at::Tensor logits = x.to(at::kFloat).mm(W[router_].to(at::kFloat).t());
    probs = at::softmax(logits, -1);
    top = std::get<1>(probs.topk(top_k_, -1));
  }
  if (mb.moe) {
    // The load-balancing loss's statistics: top-k assignments and probabilities per expert (the
    // softmax of every expert's logit, gpt-oss included).
    mb.moe->counts[layer_] = at::bincount(top.reshape({-1}), {}, experts_).to(at::kFloat);
    mb.moe->prob_sums[layer_] =
        (routing_ == MoeRouting::kTopKSoftmax ? at::softmax(probs, -1) : probs).sum(0);
    mb.moe->rows[layer_] = n;
  }
  const Routing r = Route(probs, top, x.scalar_type());
  at::Tensor xp = x.index_select(0, r.tokens);
  at::Tensor gu;
  at::Tensor out = UseGrouped(x) ? GroupedExperts(W, r, xp, &gu) : LoopExperts(W, r, xp, &gu);
  xp = at::Tensor();
  at::Tensor w = r.weights.reshape({-1}).index_select(0, r.order).to(x.scalar_type());
  at::Tensor y = at::zeros_like(x);
  y.index_add_(0, r.tokens, out * w.unsqueeze(1));
  if (saved) saved->insert(saved->end(), {probs, top, gu, out});
  return y.view(x_in.sizes());
}

MoePart::Saved MoePart::Read(SavedReader* r) const {
  Saved s;
  s.probs = r->Next();
  s.top = r->Next();
  s.gate_up = r->Next();
  s.out = r->Next();
  return s;
}

at::Tensor MoePart::LoopExpertsBackward(const Weights& W, const Routing& r, const at::Tensor& xp,
                                        const at::Tensor& dout, const at::Tensor& gate_up,
                                        const Emit& emit) const {
  at::Tensor dxp = at::empty_like(xp);
  at::Tensor dgu_all, ddown_all, dgub_all, ddownb_all;
  if (packed_) {
    dgu_all = at::zeros_like(W[gate_up_]);
    ddown_all = at::zeros_like(W[down_]);
  }
  if (gate_up_b_ != kAbsent) dgub_all = at::zeros_like(W[gate_up_b_]);
  if (down_b_ != kAbsent) ddownb_all = at::zeros_like(W[down_b_]);
  int64_t off = 0;
  for (int64_t e = 0; e < experts_; ++e) {
    const int64_t rows = r.counts[e];
    at::Tensor dgu_w, ddown_w;
    if (rows > 0) {
      at::Tensor gu = gate_up.narrow(0, off, rows);
      at::Tensor do_e = dout.narrow(0, off, rows);
      at::Tensor x_e = xp.narrow(0, off, rows);
      at::Tensor act;
      at::Tensor dgu;
      at::Tensor dx_e = dxp.narrow(0, off, rows);
      if (transposed_) {  // h = x W_gu + b ([H, 2I]), y = a W_d + b ([I, H])
        dgu = ActivateBackward(do_e.mm(Down(W, e).t()), gu, &act);
        ddown_w = act.t().mm(do_e);
        dgu_w = x_e.t().mm(dgu);
        at::mm_out(dx_e, dgu, GateUp(W, e).t());
        if (down_b_ != kAbsent) ddownb_all.select(0, e).copy_(do_e.sum(0));
        if (gate_up_b_ != kAbsent) dgub_all.select(0, e).copy_(dgu.sum(0));
      } else {
        dgu = ActivateBackward(do_e.mm(Down(W, e)), gu, &act);
        ddown_w = do_e.t().mm(act);
        dgu_w = dgu.t().mm(x_e);
        at::mm_out(dx_e, dgu, GateUp(W, e));
      }
      off += rows;
    }
    if (packed_) {
      if (rows > 0) {
        dgu_all.select(0, e).copy_(dgu_w);
        ddown_all.select(0, e).copy_(ddown_w);
      }
      continue;
    }
    // An expert without a token: a zero gradient, as transformers' packed parameter gets.
    if (rows == 0) {
      emit(gate_[e], at::zeros_like(W[gate_[e]]));
      emit(up_[e], at::zeros_like(W[up_[e]]));
      emit(downs_[e], at::zeros_like(W[downs_[e]]));
      continue;
    }
    emit(gate_[e], dgu_w.narrow(0, 0, ff_).contiguous());
    emit(up_[e], dgu_w.narrow(0, ff_, ff_).contiguous());
    emit(downs_[e], ddown_w);
  }
  if (packed_) {
    emit(gate_up_, dgu_all);
    if (gate_up_b_ != kAbsent) emit(gate_up_b_, dgub_all);
    emit(down_, ddown_all);
    if (down_b_ != kAbsent) emit(down_b_, ddownb_all);
  }
  return dxp;
}

at::Tensor MoePart::Backward(const Weights& W, const MicroBatch& mb, const at::Tensor& dy,
                             const std::function<at::Tensor()>& input, const Saved& s,
                             const Emit& emit) const {
  const at::Tensor dy2 = dy.reshape({-1, hidden_});
  const at::Tensor x = input().reshape({-1, hidden_});
  const int64_t n = x.size(0);
  const Routing r = Route(s.probs, s.top, x.scalar_type());
  at::Tensor dyp = dy2.index_select(0, r.tokens);
  at::Tensor w = r.weights.reshape({-1}).index_select(0, r.order);
  // d loss / d routing weight of each permuted row (fp32, as the router's backward runs).
  at::Tensor dwp = (dyp * s.out).sum(-1).to(at::kFloat);
  at::Tensor dout = dyp * w.to(dy2.scalar_type()).unsqueeze(1);
  dyp = at::Tensor();
  at::Tensor xp = x.index_select(0, r.tokens);
  at::Tensor dxp = UseGrouped(x) ? GroupedExpertsBackward(W, r, xp, dout, s.gate_up, emit)
                                 : LoopExpertsBackward(W, r, xp, dout, s.gate_up, emit);
  dout = at::Tensor();
  at::Tensor dx = at::zeros_like(x);
  dx.index_add_(0, r.tokens, dxp);
  dxp = xp = at::Tensor();

  // Router: routing weights -> top-k probabilities (or logits) -> logits.
  at::Tensor dw = at::zeros({n * top_k_}, dwp.options()).index_copy_(0, r.order, dwp).view({n, -1});
  at::Tensor dlogits;
  if (routing_ == MoeRouting::kTopKSoftmax) {
    // Through the softmax over the k selected logits, scattered back to those experts.
    at::Tensor dv = r.weights * (dw - (dw * r.weights).sum(-1, true));
    dlogits = at::zeros_like(s.probs).scatter_(1, s.top, dv);
    if (mb.moe && mb.moe->aux_coef > 0) {
      at::Tensor p = at::softmax(s.probs, -1);
      at::Tensor dp = mb.moe->AuxProbGrad().unsqueeze(0) * (mb.moe->aux_coef * mb.loss_scale);
      dlogits.add_(p * (dp - (dp * p).sum(-1, true)));
    }
  } else {
    if (norm_topk_) {
      at::Tensor v = s.probs.gather(1, s.top);
      at::Tensor sum = v.sum(-1, true);
      dw = (dw - (dw * r.weights).sum(-1, true)) / sum;
    }
    at::Tensor dprobs = at::zeros_like(s.probs).scatter_(1, s.top, dw);
    if (mb.moe && mb.moe->aux_coef > 0) {
      dprobs.add_(mb.moe->AuxProbGrad().unsqueeze(0), mb.moe->aux_coef * mb.loss_scale);
    }
    dlogits = s.probs * (dprobs - (dprobs * s.probs).sum(-1, true));
  }
  const at::Tensor& wr = W[router_];
  emit(router_, dlogits.t().mm(x.to(at::kFloat)).to(wr.scalar_type()));
  if (router_b_ != kAbsent) emit(router_b_, dlogits.sum(0).to(W[router_b_].scalar_type()));
  dx.add_(dlogits.mm(wr.to(at::kFloat)).to(dx.scalar_type()));
  return dx;
}

// ---- grouped expert GEMMs ----------------------------------------------------------------------

namespace {

enum class ExpertGemm { kAuto, kGrouped, kLoop };

// OFFLOADD_EXPERT_GEMM, read once; a bad value is refused on every device.
ExpertGemm ExpertGemmMode() {
  static const std::string v = [] {
    const char* e = std::getenv("OFFLOADD_EXPERT_GEMM");
    return std::string(e == nullptr || *e == 0 ? "auto" : e);
  }();
  TORCH_CHECK(v == "auto" || v == "grouped" || v == "loop",
              "OFFLOADD_EXPERT_GEMM must be auto, grouped or loop, got '", v, "'");
  return v == "grouped" ? ExpertGemm::kGrouped
         : v == "loop"  ? ExpertGemm::kLoop
                        : ExpertGemm::kAuto;
}

// The permuted rows' group ends (int32, on the rows' device), as at::_grouped_mm takes them.
at::Tensor GroupEnds(const std::vector<int64_t>& counts, c10::Device device) {
  std::vector<int32_t> ends(counts.size());
  int64_t sum = 0;
  for (size_t e = 0; e < counts.size(); ++e) ends[e] = static_cast<int32_t>(sum += counts[e]);
  return at::tensor(ends, at::kInt).to(device);
}

}  // namespace

std::string MoePart::GroupedMisfit(c10::Device device, c10::ScalarType dtype) const {
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  if ((hidden_ * bytes) % 16 != 0 || (ff_ * bytes) % 16 != 0) {
    return "needs hidden and expert intermediate rows of a multiple of 16 bytes";
  }
  if (!device.is_cuda()) return "";  // ATen's reference grouped GEMM
  if (dtype != at::kBFloat16) return "needs bf16 on CUDA";
#if OFFLOADD_WITH_CUDA
  if (at::cuda::getDeviceProperties(device.index())->major < 9) {
    return "needs compute capability 9.0 or newer";
  }
#endif
  return "";
}

bool MoePart::UseGrouped(const at::Tensor& x) const {
  const ExpertGemm mode = ExpertGemmMode();
  if (mode == ExpertGemm::kLoop) return false;
  const std::string why = GroupedMisfit(x.device(), x.scalar_type());
  TORCH_CHECK(why.empty() || mode == ExpertGemm::kAuto, "OFFLOADD_EXPERT_GEMM=grouped: ", why);
  return why.empty() && (mode == ExpertGemm::kGrouped || x.is_cuda());
}

bool MoePart::StridedExperts(const Weights& W, at::Tensor* gate_up, at::Tensor* down) const {
  // The block's flat weights hold each expert's gate, up and down back to back, in that order:
  // then [E, 2I, H] and [E, H, I] are strided views of that buffer (no copy of the experts).
  const at::Tensor& g0 = W[gate_[0]];
  const int64_t mat = ff_ * hidden_, step = 3 * mat;
  const int64_t bytes = static_cast<int64_t>(g0.element_size());
  if (reinterpret_cast<uintptr_t>(g0.data_ptr()) % 16 != 0) return false;
  for (int64_t e = 0; e < experts_; ++e) {
    const at::Tensor *g = &W[gate_[e]], *u = &W[up_[e]], *d = &W[downs_[e]];
    const int64_t at = g0.storage_offset() + e * step;
    for (const at::Tensor* t : {g, u, d}) {
      if (!t->is_contiguous() || !t->is_alias_of(g0)) return false;
    }
    if (g->storage_offset() != at || u->storage_offset() != at + mat ||
        d->storage_offset() != at + 2 * mat) {
      return false;
    }
  }
  if ((mat * bytes) % 16 != 0) return false;
  *gate_up = g0.as_strided({experts_, 2 * ff_, hidden_}, {step, hidden_, 1}).transpose(1, 2);
  const at::Tensor& d0 = W[downs_[0]];
  *down = d0.as_strided({experts_, hidden_, ff_}, {step, ff_, 1}).transpose(1, 2);
  return true;
}

void MoePart::GroupedWeights(const Weights& W, at::Tensor* gate_up, at::Tensor* down) const {
  if (transposed_) {  // gpt-oss: [E, H, 2I] and [E, I, H] already
    *gate_up = W[gate_up_];
    *down = W[down_];
  } else if (packed_) {
    *gate_up = W[gate_up_].transpose(1, 2);
    *down = W[down_].transpose(1, 2);
  } else if (!StridedExperts(W, gate_up, down)) {
    std::vector<at::Tensor> g, u, d;
    for (int64_t e = 0; e < experts_; ++e) {
      g.push_back(W[gate_[e]]);
      u.push_back(W[up_[e]]);
      d.push_back(W[downs_[e]]);
    }
    *gate_up = at::cat({at::stack(g), at::stack(u)}, 1).transpose(1, 2);
    *down = at::stack(d).transpose(1, 2);
  }
}

at::Tensor MoePart::GroupedExperts(const Weights& W, const Routing& r, const at::Tensor& xp,
                                   at::Tensor* gate_up) const {
  const at::Tensor ends = GroupEnds(r.counts, xp.device());
  at::Tensor wgu, wd;
  GroupedWeights(W, &wgu, &wd);
  // The loop's roundings: the GEMM in the compute dtype, then the bias (gpt-oss).
  at::Tensor gu = at::_grouped_mm(xp, wgu, ends);
  if (gate_up_b_ != kAbsent) gu.add_(W[gate_up_b_].index_select(0, r.experts));
  at::Tensor out = at::_grouped_mm(Activate(gu), wd, ends);
  if (down_b_ != kAbsent) out.add_(W[down_b_].index_select(0, r.experts));
  *gate_up = gu;
  return out;
}

at::Tensor MoePart::GroupedExpertsBackward(const Weights& W, const Routing& r, const at::Tensor& xp,
                                           const at::Tensor& dout, const at::Tensor& gate_up,
                                           const Emit& emit) const {
  const at::Tensor ends = GroupEnds(r.counts, xp.device());
  at::Tensor wgu, wd;
  GroupedWeights(W, &wgu, &wd);
  at::Tensor act;
  at::Tensor dgu = ActivateBackward(at::_grouped_mm(dout, wd.transpose(1, 2), ends), gate_up, &act);
  at::Tensor dxp = at::_grouped_mm(dgu, wgu.transpose(1, 2), ends);
  // Weight gradients straight in the parameters' layout: [E, H, 2I] / [E, I, H] for gpt-oss,
  // [E, 2I, H] / [E, H, I] otherwise (per-expert tensors are slices of these).
  at::Tensor dgu_w =
      transposed_ ? at::_grouped_mm(xp.t(), dgu, ends) : at::_grouped_mm(dgu.t(), xp, ends);
  at::Tensor ddown_w =
      transposed_ ? at::_grouped_mm(act.t(), dout, ends) : at::_grouped_mm(dout.t(), act, ends);
  act = at::Tensor();
  // An expert without a row: a zero gradient (its group has no rows to sum over; zeroed here
  // rather than trusting the kernel with an empty reduction).
  std::vector<int64_t> empty;
  for (int64_t e = 0; e < experts_; ++e) {
    if (r.counts[e] == 0) empty.push_back(e);
  }
  if (!empty.empty()) {
    const at::Tensor idx = at::tensor(empty, at::kLong).to(xp.device());
    dgu_w.index_fill_(0, idx, 0);
    ddown_w.index_fill_(0, idx, 0);
  }
  if (gate_up_b_ != kAbsent) {
    emit(gate_up_b_, at::zeros_like(W[gate_up_b_]).index_add_(0, r.experts, dgu));
  }
  if (down_b_ != kAbsent) {
    emit(down_b_, at::zeros_like(W[down_b_]).index_add_(0, r.experts, dout));
  }
  if (packed_) {
    emit(gate_up_, dgu_w);
    emit(down_, ddown_w);
    return dxp;
  }
  for (int64_t e = 0; e < experts_; ++e) {
    const at::Tensor g = dgu_w.select(0, e);
    emit(gate_[e], g.narrow(0, 0, ff_).contiguous());
    emit(up_[e], g.narrow(0, ff_, ff_).contiguous());
    emit(downs_[e], ddown_w.select(0, e).contiguous());
  }
  return dxp;
}

int64_t MoePart::SavedBytes(double tokens, double e) const {
  const double k = static_cast<double>(top_k_);
  return static_cast<int64_t>(tokens * (4.0 * experts_ + 8.0 * k + k * e * (2 * ff_ + hidden_)));
}

double MoePart::Flops(double tokens) const {
  return 2 * tokens * hidden_ * experts_ + 2 * tokens * top_k_ * hidden_ * 3 * ff_;
}

std::string MoePart::Describe(c10::Device device, c10::ScalarType dtype) const {
  const ExpertGemm mode = ExpertGemmMode();
  const std::string misfit = GroupedMisfit(device, dtype);
  std::string gemm;
  if (mode == ExpertGemm::kLoop) {
    gemm = ", one GEMM per non-empty expert (OFFLOADD_EXPERT_GEMM=loop)";
  } else if (misfit.empty() && (mode == ExpertGemm::kGrouped || device.is_cuda())) {
    gemm = ", grouped expert GEMMs (at::_grouped_mm)";
  } else {
    gemm = ", one GEMM per non-empty expert" +
           (device.is_cuda() ? " (grouped GEMMs: " + misfit + ")" : std::string());
  }
  const std::string head = std::to_string(experts_) + " experts, top-" + std::to_string(top_k_);
  if (act_ == ExpertActivation::kClampedSwiGlu) return head + gemm + ", clamped SwiGLU (aten)";
  const std::string why = ops::FusedKernelFor(ops::FusedOp::kSwiGlu, dtype, device, ff_);
  return head + gemm + (why.empty() ? ", fused SwiGLU" : " (" + why + ")");
}

}  // namespace parts
}  // namespace offloadd::engine
