// Llama / Mistral / Qwen2 blocks, following transformers' modeling_llama.py:
//   h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = rmsnorm(x)
//   y = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),                   n2 = rmsnorm(h)
// Saved for backward (per layer): x, rstd1, q, k (after rope), v, attention output, h, rstd2,
// gate, up, attention aux (logsumexp, rng state). Normalised inputs and the SwiGLU product are
// cheap elementwise recomputations in backward instead of being stored.
#include <ATen/ATen.h>

#include <cmath>

#include "engine/blocks.h"
#include "engine/ops.h"

namespace offloadd::engine {
namespace {

using Shape = std::vector<int64_t>;
using Spec = std::vector<std::pair<std::string, Shape>>;

class LlamaEmbedding final : public Block {
 public:
  LlamaEmbedding(std::vector<Param> params) : Block(Kind::kEmbedding, 0, "embedding") {
    params_ = std::move(params);
  }

 protected:
  at::Tensor Run(const MicroBatch& mb, const at::Tensor&, std::vector<at::Tensor>*) override {
    return at::embedding(P(0), mb.input_ids);
  }
  at::Tensor Backprop(const MicroBatch& mb, const at::Tensor& dy, std::vector<at::Tensor>&,
                      const GradCallback& on_grad) override {
    on_grad(params_[0].name,
            at::embedding_dense_backward(dy, mb.input_ids, P(0).size(0), -1, false));
    return at::Tensor();
  }
};

class LlamaLayer final : public Block {
 public:
  enum : size_t { kInNorm, kQ, kK, kV, kO, kPostNorm, kGate, kUp, kDown, kNumWeights };

  LlamaLayer(const ModelConfig& c, int layer, std::vector<Param> params)
      : Block(Kind::kDecoderLayer, layer + 1, "model.layers." + std::to_string(layer)), c_(c) {
    params_ = std::move(params);
    size_t next = kNumWeights;
    if (c.qkv_bias) {
      qb_ = next;
      next += 3;
    }
    if (c.o_bias) ob_ = next;
  }

 protected:
  at::Tensor Bias(size_t base, size_t i) const {
    return base == kNone ? at::Tensor() : P(base + i);
  }

  at::Tensor Run(const MicroBatch& mb, const at::Tensor& x,
                 std::vector<at::Tensor>* saved) override {
    const int64_t d = c_.head_dim;
    at::Tensor rstd1, rstd2;
    at::Tensor n1 = ops::RmsNorm(x, P(kInNorm), c_.norm_eps, &rstd1);
    at::Tensor q = ops::SplitHeads(ops::Linear(n1, P(kQ), Bias(qb_, 0)), c_.num_heads, d);
    at::Tensor k = ops::SplitHeads(ops::Linear(n1, P(kK), Bias(qb_, 1)), c_.num_kv_heads, d);
    at::Tensor v = ops::SplitHeads(ops::Linear(n1, P(kV), Bias(qb_, 2)), c_.num_kv_heads, d);
    q = ops::ApplyRope(q, mb.rope_cos, mb.rope_sin);
    k = ops::ApplyRope(k, mb.rope_cos, mb.rope_sin);
    std::vector<at::Tensor> aux;
    at::Tensor attn = ops::Attention(q, k, v, Scale(), mb.attn_mask, saved ? &aux : nullptr);
    at::Tensor h = x + ops::Linear(ops::MergeHeads(attn), P(kO), Bias(ob_, 0));
    at::Tensor n2 = ops::RmsNorm(h, P(kPostNorm), c_.norm_eps, &rstd2);
    at::Tensor gate = ops::Linear(n2, P(kGate), {});
    at::Tensor up = ops::Linear(n2, P(kUp), {});
    at::Tensor y = h + ops::Linear(ops::SwiGlu(gate, up), P(kDown), {});
    if (saved) {
      *saved = {x, rstd1, q, k, v, attn, h, rstd2, gate, up};
      saved->insert(saved->end(), aux.begin(), aux.end());
    }
    return y;
  }

  at::Tensor Backprop(const MicroBatch& mb, const at::Tensor& dy, std::vector<at::Tensor>& s,
                      const GradCallback& on_grad) override {
    const at::Tensor &x = s[0], &rstd1 = s[1], &q = s[2], &k = s[3], &v = s[4], &attn = s[5],
                     &h = s[6], &rstd2 = s[7], &gate = s[8], &up = s[9];
    const at::Tensor* aux = s.data() + 10;
    at::Tensor dw, db;
    auto emit = [&](size_t i, const at::Tensor& g) { on_grad(params_[i].name, g); };

    // MLP half: y = h + down(a), a = swiglu(gate(n2), up(n2)). a is rebuilt by the SwiGLU
    // backward's pass over gate and up, so down's weight gradient is taken after it.
    const int64_t hs = c_.hidden_size, ff = c_.intermediate_size;
    at::Tensor dy2 = dy.reshape({-1, hs});
    at::Tensor act, dgate, dup;
    ops::SwiGluBackward(dy2.mm(P(kDown)), gate.reshape({-1, ff}), up.reshape({-1, ff}), &dgate,
                        &dup, &act);
    emit(kDown, dy2.t().mm(act));
    act = at::Tensor();
    at::Tensor n2 = ops::RmsNormFromRstd(h, P(kPostNorm), rstd2);
    at::Tensor dn2 = ops::LinearBackward(dgate, n2, P(kGate), false, &dw, nullptr);
    emit(kGate, dw);
    ops::LinearBackward(dup, n2, P(kUp), false, &dw, nullptr, &dn2);
    emit(kUp, dw);
    at::Tensor dh = ops::RmsNormBackward(dn2.view(h.sizes()), h, P(kPostNorm), rstd2, &dw, dy);
    emit(kPostNorm, dw);

    // Attention half: h = x + o(attn(rope(q), rope(k), v)).
    at::Tensor dattn =
        ops::LinearBackward(dh, ops::MergeHeads(attn), P(kO), ob_ != kNone, &dw, &db);
    emit(kO, dw);
    if (ob_ != kNone) emit(ob_, db);
    at::Tensor dq, dk, dv;
    ops::AttentionBackward(ops::SplitHeads(dattn, c_.num_heads, c_.head_dim), q, k, v, attn, aux,
                           Scale(), mb.attn_mask, &dq, &dk, &dv);
    dq = ops::MergeHeads(ops::ApplyRopeBackward(dq, mb.rope_cos, mb.rope_sin));
    dk = ops::MergeHeads(ops::ApplyRopeBackward(dk, mb.rope_cos, mb.rope_sin));
    dv = ops::MergeHeads(dv);
    at::Tensor n1 = ops::RmsNormFromRstd(x, P(kInNorm), rstd1);
    const bool qkv_bias = qb_ != kNone;
    at::Tensor dn1 = ops::LinearBackward(dq, n1, P(kQ), qkv_bias, &dw, &db);
    emit(kQ, dw);
    if (qkv_bias) emit(qb_ + 0, db);
    ops::LinearBackward(dk, n1, P(kK), qkv_bias, &dw, &db, &dn1);
    emit(kK, dw);
    if (qkv_bias) emit(qb_ + 1, db);
    ops::LinearBackward(dv, n1, P(kV), qkv_bias, &dw, &db, &dn1);
    emit(kV, dw);
    if (qkv_bias) emit(qb_ + 2, db);
    at::Tensor dx = ops::RmsNormBackward(dn1, x, P(kInNorm), rstd1, &dw, dh);
    emit(kInNorm, dw);
    return dx;
  }

  BlockCost EstimateCost(int64_t batch, int64_t seq, c10::ScalarType dtype) const override {
    const double n = static_cast<double>(batch * seq),
                 e = static_cast<double>(c10::elementSize(dtype));
    const double h = c_.hidden_size, qd = c_.q_dim(), kvd = c_.kv_dim(), ff = c_.intermediate_size;
    BlockCost cost;
    cost.param_bytes = OwnedParamBytes();
    // x, q, k, v, attn, h, gate, up in dtype; rstd1, rstd2 and the attention logsumexp in fp32.
    cost.saved_bytes_keep = static_cast<int64_t>(n * e * (2 * h + 2 * qd + 2 * kvd + 2 * ff) +
                                                 n * 4 * (2 + c_.num_heads));
    cost.saved_bytes_recompute = static_cast<int64_t>(n * h * e);
    cost.forward_flops = 2 * n * h * (2 * qd + 2 * kvd + 3 * ff) +
                         2.0 * batch * c_.num_heads * double(seq) * seq * c_.head_dim;  // causal
    return cost;
  }

 private:
  static constexpr size_t kNone = SIZE_MAX;
  double Scale() const { return 1.0 / std::sqrt(static_cast<double>(c_.head_dim)); }
  ModelConfig c_;
  size_t qb_ = kNone;  // first of q/k/v bias
  size_t ob_ = kNone;
};

class LlamaHead final : public Block {
 public:
  LlamaHead(const ModelConfig& c, int index, std::vector<Param> params, Param* tied)
      : Block(Kind::kHead, index, "head"), eps_(c.norm_eps) {
    params_ = std::move(params);
    if (tied) shared_.push_back(tied);
  }

 protected:
  const Param& HeadWeight() const { return shared_.empty() ? params_[1] : *shared_[0]; }

  at::Tensor RunLogits(const MicroBatch&, const at::Tensor& x) override {
    at::Tensor rstd;
    return ops::Linear(ops::RmsNorm(x, P(0), eps_, &rstd), HeadWeight().value, {});
  }
  // Training forward also computes the head's backward (it is the last block): saved are x,
  // rstd, d loss/d n and d loss/d W, so no [tokens, vocab] tensor outlives the forward.
  at::Tensor Run(const MicroBatch& mb, const at::Tensor& x,
                 std::vector<at::Tensor>* saved) override {
    at::Tensor rstd, dn, dw;
    at::Tensor n = ops::RmsNorm(x, P(0), eps_, &rstd);
    at::Tensor loss = ops::LmHeadLoss(n, HeadWeight().value, mb.targets, mb.num_trained_tokens,
                                      saved ? &dn : nullptr, saved ? &dw : nullptr,
                                      ops::kHeadChunkBytes, mb.loss_scale);
    if (saved) *saved = {x, rstd, dn, dw};
    return loss;
  }
  at::Tensor Backprop(const MicroBatch&, const at::Tensor& scale, std::vector<at::Tensor>& s,
                      const GradCallback& on_grad) override {
    const at::Tensor &x = s[0], &rstd = s[1];
    at::Tensor dn = s[2], dw = s[3];
    if (scale.defined()) {
      dn = dn * scale.to(dn.scalar_type());
      dw = dw * scale.to(dw.scalar_type());
    }
    on_grad(HeadWeight().name, dw);
    at::Tensor dnorm_w;
    at::Tensor dx = ops::RmsNormBackward(dn, x, P(0), rstd, &dnorm_w);
    on_grad(params_[0].name, dnorm_w);
    return dx;
  }

 public:
  BlockCost EstimateCost(int64_t batch, int64_t seq, c10::ScalarType dtype) const override {
    const double n = static_cast<double>(batch * seq),
                 e = static_cast<double>(c10::elementSize(dtype));
    const double h = P(0).size(0), v = HeadWeight().value.size(0);
    BlockCost cost;
    cost.param_bytes = OwnedParamBytes();
    cost.saved_bytes_keep =
        static_cast<int64_t>(2 * n * h * e + n * 4 + v * h * e);  // x, dn, rstd, dW
    cost.saved_bytes_recompute = static_cast<int64_t>(n * h * e);
    cost.forward_flops = 6 * n * h * v;  // logits, dn, dW
    return cost;
  }

 private:
  double eps_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Block>>> BuildLlamaBlocks(const ModelConfig& c,
                                                               const ParamLoader& load) {
  std::vector<std::unique_ptr<Block>> blocks;
  const int64_t hs = c.hidden_size;
  ASSIGN_OR_RETURN(auto emb, LoadParams(load, {{"model.embed_tokens.weight", {c.vocab_size, hs}}}));
  blocks.push_back(std::make_unique<LlamaEmbedding>(std::move(emb)));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Spec spec = {
        {p + "input_layernorm.weight", {hs}},
        {p + "self_attn.q_proj.weight", {c.q_dim(), hs}},
        {p + "self_attn.k_proj.weight", {c.kv_dim(), hs}},
        {p + "self_attn.v_proj.weight", {c.kv_dim(), hs}},
        {p + "self_attn.o_proj.weight", {hs, c.q_dim()}},
        {p + "post_attention_layernorm.weight", {hs}},
        {p + "mlp.gate_proj.weight", {c.intermediate_size, hs}},
        {p + "mlp.up_proj.weight", {c.intermediate_size, hs}},
        {p + "mlp.down_proj.weight", {hs, c.intermediate_size}},
    };
    if (c.qkv_bias) {
      spec.push_back({p + "self_attn.q_proj.bias", {c.q_dim()}});
      spec.push_back({p + "self_attn.k_proj.bias", {c.kv_dim()}});
      spec.push_back({p + "self_attn.v_proj.bias", {c.kv_dim()}});
    }
    if (c.o_bias) spec.push_back({p + "self_attn.o_proj.bias", {hs}});
    ASSIGN_OR_RETURN(auto params, LoadParams(load, spec));
    blocks.push_back(std::make_unique<LlamaLayer>(c, i, std::move(params)));
  }
  Spec head = {{"model.norm.weight", {hs}}};
  if (!c.tie_word_embeddings) head.push_back({"lm_head.weight", {c.vocab_size, hs}});
  ASSIGN_OR_RETURN(auto params, LoadParams(load, head));
  Param* tied = c.tie_word_embeddings ? &blocks[0]->params()[0] : nullptr;
  blocks.push_back(
      std::make_unique<LlamaHead>(c, static_cast<int>(blocks.size()), std::move(params), tied));
  return blocks;
}

}  // namespace offloadd::engine
