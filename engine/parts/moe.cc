// Mixture-of-experts feed-forward (Qwen3-MoE, OLMoE, Mixtral), as transformers 5's
// *TopKRouter / *Experts modules compute it; the load-balancing loss of MoeRouterStats
// (transformers' load_balancing_loss_func without an attention mask).
//
//   logits = x W_r^T (fp32)      probs = softmax(logits)      v, idx = topk(probs, k)
//   w = v / sum(v) (norm_topk_prob) or v        y = sum_j w_j * down_idx_j(silu(g) * u)
//
// Backward: d w_j = <dy, expert output_j>; through the renormalisation and the softmax to the
// logits (plus the load-balancing loss's d aux / d probs), then W_r's gradient and d x.
#include <ATen/ATen.h>

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
      packed_(c.moe.packed) {
  const TensorNames& n = c.names;
  const int64_t h = hidden_, ff = ff_;
  router_ = pl->Add(p + n.router + ".weight", {experts_, h});
  const std::string ex = p + n.experts + ".";
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

MoePart::Routing MoePart::Route(const at::Tensor& probs, const at::Tensor& top) const {
  Routing r;
  at::Tensor flat = top.reshape({-1});
  r.order = std::get<1>(flat.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  r.tokens = r.order.div(top_k_, "floor");
  r.weights = probs.gather(1, top);
  if (norm_topk_) r.weights = r.weights / r.weights.sum(-1, true);
  at::Tensor counts = at::bincount(flat, {}, experts_).to(at::kCPU);
  r.counts.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + experts_);
  return r;
}

at::Tensor MoePart::Forward(const Weights& W, const MicroBatch& mb, const at::Tensor& x_in,
                            std::vector<at::Tensor>* saved) const {
  const at::Tensor x = x_in.reshape({-1, hidden_});
  const int64_t n = x.size(0);
  // The router in fp32 (its softmax is fp32 in every family).
  at::Tensor logits = x.to(at::kFloat).mm(W[router_].to(at::kFloat).t());
  at::Tensor probs = at::softmax(logits, -1);
  logits = at::Tensor();
  at::Tensor top = std::get<1>(probs.topk(top_k_, -1));
  if (mb.moe) {
    // The load-balancing loss's statistics: top-k assignments and probabilities per expert.
    mb.moe->counts[layer_] = at::bincount(top.reshape({-1}), {}, experts_).to(at::kFloat);
    mb.moe->prob_sums[layer_] = probs.sum(0);
    mb.moe->rows[layer_] = n;
  }
  const Routing r = Route(probs, top);
  at::Tensor xp = x.index_select(0, r.tokens);
  at::Tensor gu = at::empty({n * top_k_, 2 * ff_}, x.options());
  at::Tensor out = at::empty({n * top_k_, hidden_}, x.options());
  int64_t off = 0;
  for (int64_t e = 0; e < experts_; ++e) {
    const int64_t rows = r.counts[e];
    if (rows == 0) continue;
    at::Tensor gu_e = gu.narrow(0, off, rows);
    at::mm_out(gu_e, xp.narrow(0, off, rows), GateUp(W, e).t());
    at::Tensor a = ops::SwiGlu(gu_e.narrow(1, 0, ff_), gu_e.narrow(1, ff_, ff_));
    at::Tensor out_e = out.narrow(0, off, rows);
    at::mm_out(out_e, a, Down(W, e).t());
    off += rows;
  }
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

at::Tensor MoePart::Backward(const Weights& W, const MicroBatch& mb, const at::Tensor& dy,
                             const std::function<at::Tensor()>& input, const Saved& s,
                             const Emit& emit) const {
  const at::Tensor dy2 = dy.reshape({-1, hidden_});
  const at::Tensor x = input().reshape({-1, hidden_});
  const int64_t n = x.size(0);
  const Routing r = Route(s.probs, s.top);
  at::Tensor dyp = dy2.index_select(0, r.tokens);
  at::Tensor w = r.weights.reshape({-1}).index_select(0, r.order);
  // d loss / d routing weight of each permuted row (fp32, as the router's backward runs).
  at::Tensor dwp = (dyp * s.out).sum(-1).to(at::kFloat);
  at::Tensor dout = dyp * w.to(dy2.scalar_type()).unsqueeze(1);
  dyp = at::Tensor();
  at::Tensor xp = x.index_select(0, r.tokens);
  at::Tensor dxp = at::empty_like(xp);
  at::Tensor dgu_all, ddown_all;
  if (packed_) {
    dgu_all = at::zeros({experts_, 2 * ff_, hidden_}, W[gate_up_].options());
    ddown_all = at::zeros({experts_, hidden_, ff_}, W[down_].options());
  }
  int64_t off = 0;
  for (int64_t e = 0; e < experts_; ++e) {
    const int64_t rows = r.counts[e];
    at::Tensor dgu_w, ddown_w;
    if (rows > 0) {
      at::Tensor gu = s.gate_up.narrow(0, off, rows);
      at::Tensor do_e = dout.narrow(0, off, rows);
      at::Tensor gate_up = GateUp(W, e);
      at::Tensor dgate, dup, act;
      ops::SwiGluBackward(do_e.mm(Down(W, e)), gu.narrow(1, 0, ff_), gu.narrow(1, ff_, ff_), &dgate,
                          &dup, &act);
      ddown_w = do_e.t().mm(act);
      at::Tensor dgu = at::cat({dgate, dup}, 1);
      dgu_w = dgu.t().mm(xp.narrow(0, off, rows));
      at::Tensor dx_e = dxp.narrow(0, off, rows);
      at::mm_out(dx_e, dgu, gate_up);
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
    emit(down_, ddown_all);
  }
  dout = at::Tensor();
  at::Tensor dx = at::zeros_like(x);
  dx.index_add_(0, r.tokens, dxp);
  dxp = xp = at::Tensor();

  // Router: routing weights -> top-k probabilities -> all probabilities -> logits.
  at::Tensor dw = at::zeros({n * top_k_}, dwp.options()).index_copy_(0, r.order, dwp).view({n, -1});
  if (norm_topk_) {
    at::Tensor v = s.probs.gather(1, s.top);
    at::Tensor sum = v.sum(-1, true);
    dw = (dw - (dw * r.weights).sum(-1, true)) / sum;
  }
  at::Tensor dprobs = at::zeros_like(s.probs).scatter_(1, s.top, dw);
  if (mb.moe && mb.moe->aux_coef > 0) {
    dprobs.add_(mb.moe->AuxProbGrad().unsqueeze(0), mb.moe->aux_coef * mb.loss_scale);
  }
  at::Tensor dlogits = s.probs * (dprobs - (dprobs * s.probs).sum(-1, true));
  const at::Tensor& wr = W[router_];
  emit(router_, dlogits.t().mm(x.to(at::kFloat)).to(wr.scalar_type()));
  dx.add_(dlogits.mm(wr.to(at::kFloat)).to(dx.scalar_type()));
  return dx;
}

int64_t MoePart::SavedBytes(double tokens, double e) const {
  const double k = static_cast<double>(top_k_);
  return static_cast<int64_t>(tokens * (4.0 * experts_ + 8.0 * k + k * e * (2 * ff_ + hidden_)));
}

double MoePart::Flops(double tokens) const {
  return 2 * tokens * hidden_ * experts_ + 2 * tokens * top_k_ * hidden_ * 3 * ff_;
}

std::string MoePart::Describe(c10::Device device, c10::ScalarType dtype) const {
  const std::string why = ops::FusedKernelFor(ops::FusedOp::kSwiGlu, dtype, device, ff_);
  return std::to_string(experts_) + " experts, top-" + std::to_string(top_k_) +
         ", one GEMM per non-empty expert" + (why.empty() ? ", fused SwiGLU" : " (" + why + ")");
}

}  // namespace parts
}  // namespace offloadd::engine
