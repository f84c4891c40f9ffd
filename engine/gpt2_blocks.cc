// GPT-2 blocks, following transformers' modeling_gpt2.py (Conv1D weights are [in, out]):
//   h = x + c_proj(attn(split(c_attn(ln_1(x)))));   y = h + mlp.c_proj(gelu_new(c_fc(ln_2(h))))
// Token + learned position embeddings; final ln_f; LM head tied to wte unless the config unties
// it. The causal-mask buffers (attn.bias / attn.masked_bias) of old checkpoints are not
// parameters; Model::Load skips them and Export copies them through.
#include <ATen/ATen.h>

#include <cmath>

#include "engine/blocks.h"
#include "engine/ops.h"

namespace offloadd::engine {
namespace {

using Shape = std::vector<int64_t>;
using Spec = std::vector<std::pair<std::string, Shape>>;

class Gpt2Embedding final : public Block {
 public:
  explicit Gpt2Embedding(std::vector<Param> params) : Block(Kind::kEmbedding, 0, "embedding") {
    params_ = std::move(params);  // wte, wpe
  }

 protected:
  at::Tensor Run(const MicroBatch& mb, const at::Tensor&, std::vector<at::Tensor>*) override {
    return at::embedding(P(0), mb.input_ids) + at::embedding(P(1), mb.position_ids);
  }
  at::Tensor Backprop(const MicroBatch& mb, const at::Tensor& dy, std::vector<at::Tensor>&,
                      const GradCallback& on_grad) override {
    on_grad(params_[1].name,
            at::embedding_dense_backward(dy, mb.position_ids, P(1).size(0), -1, false));
    on_grad(params_[0].name,
            at::embedding_dense_backward(dy, mb.input_ids, P(0).size(0), -1, false));
    return at::Tensor();
  }
};

class Gpt2Layer final : public Block {
 public:
  enum : size_t {
    kLn1W,
    kLn1B,
    kAttnW,
    kAttnB,
    kProjW,
    kProjB,
    kLn2W,
    kLn2B,
    kFcW,
    kFcB,
    kOutW,
    kOutB
  };

  Gpt2Layer(const ModelConfig& c, int layer, const std::string& prefix, std::vector<Param> params)
      : Block(Kind::kDecoderLayer, layer + 1, prefix + "h." + std::to_string(layer)), c_(c) {
    params_ = std::move(params);
  }

 protected:
  at::Tensor Run(const MicroBatch& mb, const at::Tensor& x,
                 std::vector<at::Tensor>* saved) override {
    const int64_t hs = c_.hidden_size;
    at::Tensor mean1, rstd1, mean2, rstd2;
    at::Tensor n1 = ops::LayerNorm(x, P(kLn1W), P(kLn1B), c_.norm_eps, &mean1, &rstd1);
    at::Tensor qkv = ops::Conv1D(n1, P(kAttnW), P(kAttnB));
    at::Tensor q = ops::SplitHeads(qkv.narrow(-1, 0, hs), c_.num_heads, c_.head_dim);
    at::Tensor k = ops::SplitHeads(qkv.narrow(-1, hs, hs), c_.num_heads, c_.head_dim);
    at::Tensor v = ops::SplitHeads(qkv.narrow(-1, 2 * hs, hs), c_.num_heads, c_.head_dim);
    std::vector<at::Tensor> aux;
    at::Tensor attn = ops::Attention(q, k, v, Scale(), mb.attn_mask, saved ? &aux : nullptr);
    at::Tensor h = x + ops::Conv1D(ops::MergeHeads(attn), P(kProjW), P(kProjB));
    at::Tensor n2 = ops::LayerNorm(h, P(kLn2W), P(kLn2B), c_.norm_eps, &mean2, &rstd2);
    at::Tensor fc = ops::Conv1D(n2, P(kFcW), P(kFcB));
    at::Tensor y = h + ops::Conv1D(at::gelu(fc, "tanh"), P(kOutW), P(kOutB));
    if (saved) {
      *saved = {x, mean1, rstd1, q, k, v, attn, h, mean2, rstd2, fc};
      saved->insert(saved->end(), aux.begin(), aux.end());
    }
    return y;
  }

  at::Tensor Backprop(const MicroBatch& mb, const at::Tensor& dy, std::vector<at::Tensor>& s,
                      const GradCallback& on_grad) override {
    const at::Tensor &x = s[0], &mean1 = s[1], &rstd1 = s[2], &q = s[3], &k = s[4], &v = s[5],
                     &attn = s[6], &h = s[7], &mean2 = s[8], &rstd2 = s[9], &fc = s[10];
    const at::Tensor* aux = s.data() + 11;
    at::Tensor dw, db;
    auto emit = [&](size_t wi, size_t bi) {
      on_grad(params_[wi].name, dw);
      on_grad(params_[bi].name, db);
    };

    at::Tensor dgelu = ops::Conv1DBackward(dy, at::gelu(fc, "tanh"), P(kOutW), &dw, &db);
    emit(kOutW, kOutB);
    at::Tensor dfc = at::gelu_backward(dgelu, fc, "tanh");
    at::Tensor n2 = ops::LayerNorm(h, P(kLn2W), P(kLn2B), c_.norm_eps, nullptr, nullptr);
    at::Tensor dn2 = ops::Conv1DBackward(dfc, n2, P(kFcW), &dw, &db);
    emit(kFcW, kFcB);
    at::Tensor dh = dy + ops::LayerNormBackward(dn2, h, P(kLn2W), P(kLn2B), mean2, rstd2, &dw, &db);
    emit(kLn2W, kLn2B);

    at::Tensor dattn = ops::Conv1DBackward(dh, ops::MergeHeads(attn), P(kProjW), &dw, &db);
    emit(kProjW, kProjB);
    at::Tensor dq, dk, dv;
    ops::AttentionBackward(ops::SplitHeads(dattn, c_.num_heads, c_.head_dim), q, k, v, attn, aux,
                           Scale(), mb.attn_mask, &dq, &dk, &dv);
    at::Tensor dqkv = at::cat({ops::MergeHeads(dq), ops::MergeHeads(dk), ops::MergeHeads(dv)}, -1);
    at::Tensor n1 = ops::LayerNorm(x, P(kLn1W), P(kLn1B), c_.norm_eps, nullptr, nullptr);
    at::Tensor dn1 = ops::Conv1DBackward(dqkv, n1, P(kAttnW), &dw, &db);
    emit(kAttnW, kAttnB);
    at::Tensor dx = dh + ops::LayerNormBackward(dn1, x, P(kLn1W), P(kLn1B), mean1, rstd1, &dw, &db);
    emit(kLn1W, kLn1B);
    return dx;
  }

  BlockCost EstimateCost(int64_t batch, int64_t seq, c10::ScalarType dtype) const override {
    const double n = static_cast<double>(batch * seq),
                 e = static_cast<double>(c10::elementSize(dtype));
    const double h = c_.hidden_size, ff = c_.intermediate_size;
    BlockCost cost;
    cost.param_bytes = OwnedParamBytes();
    // x, q, k, v, attn, h, fc in dtype; two (mean, rstd) pairs and the logsumexp in fp32.
    cost.saved_bytes_keep = static_cast<int64_t>(n * e * (6 * h + ff) + n * 4 * (4 + c_.num_heads));
    cost.saved_bytes_recompute = static_cast<int64_t>(n * h * e);
    cost.forward_flops =
        2 * n * h * (4 * h + 2 * ff) + 2.0 * batch * c_.num_heads * double(seq) * seq * c_.head_dim;
    return cost;
  }

 private:
  double Scale() const { return 1.0 / std::sqrt(static_cast<double>(c_.head_dim)); }
  ModelConfig c_;
};

class Gpt2Head final : public Block {
 public:
  Gpt2Head(const ModelConfig& c, int index, std::vector<Param> params, Param* tied)
      : Block(Kind::kHead, index, "head"), eps_(c.norm_eps) {
    params_ = std::move(params);  // ln_f.weight, ln_f.bias[, lm_head.weight]
    if (tied) shared_.push_back(tied);
  }

 protected:
  const Param& HeadWeight() const { return shared_.empty() ? params_[2] : *shared_[0]; }

  at::Tensor RunLogits(const MicroBatch&, const at::Tensor& x) override {
    at::Tensor n = ops::LayerNorm(x, P(0), P(1), eps_, nullptr, nullptr);
    return ops::Linear(n, HeadWeight().value, {});
  }
  // As LlamaHead: the training forward computes the head's gradients (see LmHeadLoss).
  at::Tensor Run(const MicroBatch& mb, const at::Tensor& x,
                 std::vector<at::Tensor>* saved) override {
    at::Tensor mean, rstd, dn, dw;
    at::Tensor n = ops::LayerNorm(x, P(0), P(1), eps_, &mean, &rstd);
    at::Tensor loss = ops::LmHeadLoss(n, HeadWeight().value, mb.targets, mb.num_trained_tokens,
                                      saved ? &dn : nullptr, saved ? &dw : nullptr,
                                      ops::kHeadChunkBytes, mb.loss_scale);
    if (saved) *saved = {x, mean, rstd, dn, dw};
    return loss;
  }
  at::Tensor Backprop(const MicroBatch&, const at::Tensor& scale, std::vector<at::Tensor>& s,
                      const GradCallback& on_grad) override {
    const at::Tensor &x = s[0], &mean = s[1], &rstd = s[2];
    at::Tensor dn = s[3], dw = s[4];
    if (scale.defined()) {
      dn = dn * scale.to(dn.scalar_type());
      dw = dw * scale.to(dw.scalar_type());
    }
    on_grad(HeadWeight().name, dw);
    at::Tensor dnw, dnb;
    at::Tensor dx = ops::LayerNormBackward(dn, x, P(0), P(1), mean, rstd, &dnw, &dnb);
    on_grad(params_[0].name, dnw);
    on_grad(params_[1].name, dnb);
    return dx;
  }

 public:
  BlockCost EstimateCost(int64_t batch, int64_t seq, c10::ScalarType dtype) const override {
    const double n = static_cast<double>(batch * seq),
                 e = static_cast<double>(c10::elementSize(dtype));
    const double h = P(0).size(0), v = HeadWeight().value.size(0);
    BlockCost cost;
    cost.param_bytes = OwnedParamBytes();
    cost.saved_bytes_keep = static_cast<int64_t>(2 * n * h * e + 2 * n * 4 + v * h * e);
    cost.saved_bytes_recompute = static_cast<int64_t>(n * h * e);
    cost.forward_flops = 6 * n * h * v;
    return cost;
  }

 private:
  double eps_;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Block>>> BuildGpt2Blocks(const ModelConfig& c,
                                                              const std::string& prefix,
                                                              const ParamLoader& load) {
  std::vector<std::unique_ptr<Block>> blocks;
  const int64_t hs = c.hidden_size, ff = c.intermediate_size;
  ASSIGN_OR_RETURN(auto emb,
                   LoadParams(load, {{prefix + "wte.weight", {c.vocab_size, hs}},
                                     {prefix + "wpe.weight", {c.max_position_embeddings, hs}}}));
  blocks.push_back(std::make_unique<Gpt2Embedding>(std::move(emb)));
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = prefix + "h." + std::to_string(i) + ".";
    ASSIGN_OR_RETURN(auto params, LoadParams(load, {
                                                       {p + "ln_1.weight", {hs}},
                                                       {p + "ln_1.bias", {hs}},
                                                       {p + "attn.c_attn.weight", {hs, 3 * hs}},
                                                       {p + "attn.c_attn.bias", {3 * hs}},
                                                       {p + "attn.c_proj.weight", {hs, hs}},
                                                       {p + "attn.c_proj.bias", {hs}},
                                                       {p + "ln_2.weight", {hs}},
                                                       {p + "ln_2.bias", {hs}},
                                                       {p + "mlp.c_fc.weight", {hs, ff}},
                                                       {p + "mlp.c_fc.bias", {ff}},
                                                       {p + "mlp.c_proj.weight", {ff, hs}},
                                                       {p + "mlp.c_proj.bias", {hs}},
                                                   }));
    blocks.push_back(std::make_unique<Gpt2Layer>(c, i, prefix, std::move(params)));
  }
  Spec head = {{prefix + "ln_f.weight", {hs}}, {prefix + "ln_f.bias", {hs}}};
  if (!c.tie_word_embeddings) head.push_back({"lm_head.weight", {c.vocab_size, hs}});
  ASSIGN_OR_RETURN(auto params, LoadParams(load, head));
  Param* tied = c.tie_word_embeddings ? &blocks[0]->params()[0] : nullptr;
  blocks.push_back(
      std::make_unique<Gpt2Head>(c, static_cast<int>(blocks.size()), std::move(params), tied));
  return blocks;
}

}  // namespace offloadd::engine
