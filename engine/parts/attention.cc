// Attention part, following transformers' attention modules: LlamaAttention (separate q/k/v/o,
// biases per attention_bias / Qwen2), Qwen3 and Gemma 3 (RMSNorm of each head of q and k before
// RoPE), OLMo 2 (RMSNorm over the whole q and k projections, before the head split), Phi-3 (fused
// qkv_proj rows [q; k; v]), Gemma 2 (query_pre_attn_scalar scale, logit soft-capping), GPT-2
// (Conv1D c_attn / c_proj), sliding-window layers (Mistral, Gemma 2/3, Qwen2/3 layer types),
// gpt-oss's attention sinks (a learned logit per head in the softmax denominator: tiled path).
#include <ATen/ATen.h>

#include <cmath>

#include "engine/doc_attention.h"
#include "engine/ops.h"
#include "engine/parts.h"
#include "engine/rope.h"

namespace offloadd::engine::parts {
AttentionPart::AttentionPart(const ModelConfig& c, int layer, const std::string& p, ParamList* pl)
    : heads_(c.num_heads),
      kv_heads_(c.num_kv_heads),
      head_dim_(c.head_dim),
      hidden_(c.hidden_size),
      conv1d_(c.arch == Architecture::kGpt2),
      rope_(c.arch == Architecture::kLlama),
      slides_(c.layer_slides(layer)),
      local_rope_(c.has_local_rope && c.layer_slides(layer)),
      qk_(c.qk_norm),
      scale_(c.attn_scale > 0 ? c.attn_scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim))),
      softcap_(c.attn_logit_softcap),
      window_(c.layer_slides(layer) ? c.sliding_window : 0) {
  const TensorNames& n = c.names;
  const int64_t h = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  auto shape = [&](int64_t out, int64_t in) {
    return conv1d_ ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in};
  };
  if (!n.qkv.empty()) {
    qkv_ = pl->Add(p + n.qkv + ".weight", shape(qd + 2 * kvd, h));
  } else {
    q_ = pl->Add(p + n.q + ".weight", shape(qd, h));
    k_ = pl->Add(p + n.k + ".weight", shape(kvd, h));
    v_ = pl->Add(p + n.v + ".weight", shape(kvd, h));
  }
  o_ = pl->Add(p + n.o + ".weight", shape(h, qd));
  if (c.qkv_bias && !n.qkv.empty()) {
    qkvb_ = pl->Add(p + n.qkv + ".bias", {qd + 2 * kvd});
  } else if (c.qkv_bias) {
    qb_ = pl->Add(p + n.q + ".bias", {qd});
    kb_ = pl->Add(p + n.k + ".bias", {kvd});
    vb_ = pl->Add(p + n.v + ".bias", {kvd});
  }
  if (c.o_bias) ob_ = pl->Add(p + n.o + ".bias", {h});
  if (c.attention_sinks) sinks_ = pl->Add(p + n.sinks, {heads_});
  if (qk_ != QkNorm::kNone) {
    const bool whole = qk_ == QkNorm::kWhole;
    q_norm_ = NormPart(c, p + n.q_norm + ".weight", p + n.q_norm + ".bias",
                       whole ? qd : head_dim_, pl);
    k_norm_ = NormPart(c, p + n.k_norm + ".weight", p + n.k_norm + ".bias",
                       whole ? kvd : head_dim_, pl);
  }
}

int64_t AttentionPart::Window(int64_t seq) const {
  return window_ > 0 && window_ < seq ? window_ : 0;
}

bool AttentionPart::Plain(const MicroBatch& mb, const at::Tensor& q) const {
  // Unpacked rows without soft-capping take ATen's fused causal kernels (the flash kernel's own
  // window where a sliding window is shorter than the sequence); everything else attends within
  // mb.docs (variable-length flash on CUDA, the tiled exact path elsewhere).
  if (mb.segment_ids.defined() || softcap_ > 0 || sinks_ != kAbsent) return false;
  return Window(q.size(2)) == 0 || ops::WindowedFlashFits(q.device(), q.scalar_type(), head_dim_);
}

void AttentionPart::Rope(const MicroBatch& mb, const at::Tensor** cos,
                         const at::Tensor** sin) const {
  const bool local = local_rope_ && mb.rope_cos_local.defined();
  *cos = local ? &mb.rope_cos_local : &mb.rope_cos;
  *sin = local ? &mb.rope_sin_local : &mb.rope_sin;
}

at::Tensor AttentionPart::Heads(const Weights& W, const MicroBatch& mb, const at::Tensor& lin,
                                const NormPart& norm, int64_t heads, const at::Tensor* stats,
                                std::vector<at::Tensor>* saved) const {
  at::Tensor x = lin;
  if (qk_ == QkNorm::kWhole) {
    x = stats ? norm.Reapply(W, lin, stats) : norm.Forward(W, lin, saved);
  } else if (qk_ == QkNorm::kPerHead) {
    at::Tensor v = lin.reshape({lin.size(0), lin.size(1), heads, head_dim_});
    x = (stats ? norm.Reapply(W, v, stats) : norm.Forward(W, v, saved)).flatten(2);
  }
  x = ops::SplitHeads(x, heads, head_dim_);
  if (!rope_) return x;
  const at::Tensor *cos, *sin;
  Rope(mb, &cos, &sin);
  return ops::ApplyRope(x, *cos, *sin);
}

at::Tensor AttentionPart::Forward(const Weights& W, const MicroBatch& mb, const at::Tensor& x,
                                  std::vector<at::Tensor>* saved,
                                  std::vector<at::Tensor>* aux) const {
  const int64_t qd = heads_ * head_dim_, kvd = kv_heads_ * head_dim_;
  at::Tensor q_lin, k_lin, v_lin;
  if (qkv_ != kAbsent) {
    at::Tensor qkv = Project(x, W[qkv_], W.Opt(qkvb_), conv1d_);
    q_lin = qkv.narrow(-1, 0, qd);
    k_lin = qkv.narrow(-1, qd, kvd);
    v_lin = qkv.narrow(-1, qd + kvd, kvd);
  } else {
    q_lin = Project(x, W[q_], W.Opt(qb_), conv1d_);
    k_lin = Project(x, W[k_], W.Opt(kb_), conv1d_);
    v_lin = Project(x, W[v_], W.Opt(vb_), conv1d_);
  }
  const bool normed = qk_ != QkNorm::kNone;
  std::vector<at::Tensor> q_stats, k_stats;
  at::Tensor q = Heads(W, mb, q_lin, q_norm_, heads_, nullptr, &q_stats);
  at::Tensor k = Heads(W, mb, k_lin, k_norm_, kv_heads_, nullptr, &k_stats);
  at::Tensor v = ops::SplitHeads(v_lin, kv_heads_, head_dim_);
  const int64_t window = Window(q.size(2));
  // Plain rows: the fused kernels on k and v less their mean (ops::Attention; `out` is the
  // kernel's output, `value` the attention's), documents: ops::DocumentAttention.
  std::vector<at::Tensor> local_aux;  // the values' mean where nothing is saved (16-bit)
  at::Tensor out, value;
  if (Plain(mb, q)) {
    value =
        ops::Attention(q, k, v, scale_, at::Tensor(), aux ? aux : &local_aux, 0.0, window, &out);
  } else {
    out = value =
        ops::DocumentAttention(q, k, v, scale_, mb.docs, window, softcap_, aux, W.Opt(sinks_));
  }
  if (saved) {
    if (normed) {  // the rotated q and k are rebuilt from the projections in backward
      saved->insert(saved->end(), {q_lin, k_lin});
      saved->insert(saved->end(), q_stats.begin(), q_stats.end());
      saved->insert(saved->end(), k_stats.begin(), k_stats.end());
    } else {
      saved->insert(saved->end(), {q, k});
    }
    saved->insert(saved->end(), {v, out});
  }
  return Project(ops::MergeHeads(value), W[o_], W.Opt(ob_), conv1d_);
}

AttentionPart::Saved AttentionPart::Read(SavedReader* r) const {
  Saved s;
  if (qk_ != QkNorm::kNone) {
    s.q_lin = r->Next();
    s.k_lin = r->Next();
    s.q_stats = &r->Next();
    for (int i = 1; i < q_norm_.num_stats(); ++i) r->Next();
    s.k_stats = &r->Next();
    for (int i = 1; i < k_norm_.num_stats(); ++i) r->Next();
  } else {
    s.q = r->Next();
    s.k = r->Next();
  }
  s.v = r->Next();
  s.out = r->Next();
  return s;
}

at::Tensor AttentionPart::HeadsBackward(const Weights& W, const MicroBatch& mb,
                                        const at::Tensor& dheads, const at::Tensor& lin,
                                        const NormPart& norm, int64_t heads,
                                        const at::Tensor* stats, const Emit& emit) const {
  at::Tensor d = dheads;
  if (rope_) {
    const at::Tensor *cos, *sin;
    Rope(mb, &cos, &sin);
    d = ops::ApplyRopeBackward(d, *cos, *sin);
  }
  d = ops::MergeHeads(d);  // [B, T, heads * head_dim], contiguous
  if (qk_ == QkNorm::kWhole) {
    d = norm.Backward(W, d, lin, stats, emit);
  } else if (qk_ == QkNorm::kPerHead) {
    const auto shape = std::vector<int64_t>{lin.size(0), lin.size(1), heads, head_dim_};
    d = norm.Backward(W, d.view(shape), lin.reshape(shape), stats, emit).flatten(2);
  }
  return d;
}

at::Tensor AttentionPart::Backward(const Weights& W, const MicroBatch& mb, const at::Tensor& dout,
                                   const std::function<at::Tensor()>& input, const Saved& s,
                                   const at::Tensor* aux, const Emit& emit) const {
  at::Tensor dw, db;
  // Plain rows saved the kernel's output: the attention's value adds the values' mean back.
  const at::Tensor value = Plain(mb, s.v) ? ops::AttentionValue(s.out, aux) : s.out;
  at::Tensor dattn =
      ProjectBackward(dout, ops::MergeHeads(value), W[o_], ob_ != kAbsent, conv1d_, &dw, &db);
  emit(o_, dw);
  if (ob_ != kAbsent) emit(ob_, db);
  const bool normed = qk_ != QkNorm::kNone;
  at::Tensor q = s.q, k = s.k;
  if (normed) {
    q = Heads(W, mb, s.q_lin, q_norm_, heads_, s.q_stats, nullptr);
    k = Heads(W, mb, s.k_lin, k_norm_, kv_heads_, s.k_stats, nullptr);
  }
  at::Tensor dq, dk, dv;
  const int64_t window = Window(q.size(2));
  const at::Tensor dheads = ops::SplitHeads(dattn, heads_, head_dim_);
  if (Plain(mb, q)) {
    ops::AttentionBackward(dheads, q, k, s.v, s.out, aux, scale_, at::Tensor(), &dq, &dk, &dv, 0.0,
                           window);
  } else {
    at::Tensor dsinks;
    ops::DocumentAttentionBackward(dheads, q, k, s.v, s.out, aux, scale_, mb.docs, window, softcap_,
                                   &dq, &dk, &dv, W.Opt(sinks_), &dsinks);
    if (sinks_ != kAbsent) emit(sinks_, dsinks);
  }
  q = k = at::Tensor();
  // Gradients of the norms' weights come first (they sit after the projections), then q, k, v.
  dq = normed ? HeadsBackward(W, mb, dq, s.q_lin, q_norm_, heads_, s.q_stats, emit)
              : HeadsBackward(W, mb, dq, {}, q_norm_, heads_, nullptr, emit);
  dk = normed ? HeadsBackward(W, mb, dk, s.k_lin, k_norm_, kv_heads_, s.k_stats, emit)
              : HeadsBackward(W, mb, dk, {}, k_norm_, kv_heads_, nullptr, emit);
  dv = ops::MergeHeads(dv);
  const at::Tensor n = input();
  if (qkv_ != kAbsent) {
    at::Tensor dqkv = at::cat({dq, dk, dv}, -1);
    at::Tensor dn = ProjectBackward(dqkv, n, W[qkv_], qkvb_ != kAbsent, conv1d_, &dw, &db);
    emit(qkv_, dw);
    if (qkvb_ != kAbsent) emit(qkvb_, db);
    return dn;
  }
  at::Tensor dn = ProjectBackward(dq, n, W[q_], qb_ != kAbsent, conv1d_, &dw, &db);
  emit(q_, dw);
  if (qb_ != kAbsent) emit(qb_, db);
  ProjectBackward(dk, n, W[k_], kb_ != kAbsent, conv1d_, &dw, &db, &dn);
  emit(k_, dw);
  if (kb_ != kAbsent) emit(kb_, db);
  ProjectBackward(dv, n, W[v_], vb_ != kAbsent, conv1d_, &dw, &db, &dn);
  emit(v_, dw);
  if (vb_ != kAbsent) emit(vb_, db);
  return dn;
}

int64_t AttentionPart::SavedBytes(int64_t batch, int64_t seq, double e) const {
  const double n = static_cast<double>(batch) * seq;
  const double qd = heads_ * head_dim_, kvd = kv_heads_ * head_dim_;
  double bytes = n * e * (qd + 2 * kvd + qd);  // q (or q_lin), k (or k_lin), v, out
  if (qk_ != QkNorm::kNone) {
    const double rows_q = qk_ == QkNorm::kWhole ? n : n * heads_;
    const double rows_k = qk_ == QkNorm::kWhole ? n : n * kv_heads_;
    bytes += q_norm_.SavedBytes(rows_q) + k_norm_.SavedBytes(rows_k);
  }
  // The fused kernels' logsumexp. The tiled path (soft-capping; on the CPU a window shorter than
  // the sequence) saves nothing more; the windowed flash kernel's logsumexp on CUDA is left out.
  if (softcap_ <= 0 && sinks_ == kAbsent && Window(seq) == 0) bytes += n * 4 * heads_;
  if (e < 4) bytes += static_cast<double>(batch) * kvd * 4;  // the values' mean (ops::Attention)
  return static_cast<int64_t>(bytes);
}

double AttentionPart::Flops(int64_t batch, int64_t seq) const {
  const double n = static_cast<double>(batch) * seq;
  const double qd = heads_ * head_dim_, kvd = kv_heads_ * head_dim_;
  const double proj = 2 * n * hidden_ * (2 * qd + 2 * kvd);
  // QK^T and PV over the (query, key) pairs attended: T(T+1)/2 causal, T*w - w(w-1)/2 within a
  // window w < T. Plain causal keeps the T^2 / 2 figure the planner has always used.
  const double t = static_cast<double>(seq);
  double pairs = t * t / 2;
  if (window_ > 0 && window_ < seq) {
    const double w = static_cast<double>(window_);
    pairs = t * w - w * (w - 1) / 2;
  }
  return proj + 4.0 * batch * heads_ * pairs * head_dim_;
}

std::string AttentionPart::Describe(c10::Device device, c10::ScalarType dtype, int64_t seq) const {
  if (softcap_ > 0) return "aten (tiled exact attention: attn_logit_softcapping)";
  if (sinks_ != kAbsent) return "aten (tiled exact attention: attention sinks)";
  if (window_ > 0 && window_ < seq) {
    if (ops::WindowedFlashFits(device, dtype, head_dim_)) return "fused (flash, sliding window)";
    return "aten (tiled exact attention: sliding_window " + std::to_string(window_) +
           " < sequence " + std::to_string(seq) + ")";
  }
  return device.is_cuda() ? "fused" : "fused (CPU flash)";
}

}  // namespace offloadd::engine::parts
