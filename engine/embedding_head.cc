// The embedding and head blocks and the model's assembly ([embedding, layers..., head]) from a
// ModelConfig. Embedding: token table (+ GPT-2's learned positions), times sqrt(hidden) rounded
// to the compute dtype for Gemma (transformers multiplies by a tensor of that dtype). Head: the
// final norm of the family's kind, the LM head (tied to the embedding or not), Gemma 2's
// final-logit soft-capping, and the chunked loss.
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "engine/blocks.h"
#include "engine/head_chunk.h"
#include "engine/head_chunk_size.h"
#include "engine/ops.h"
#include "engine/parts.h"
#include "engine/rope.h"

namespace offloadd::engine {
namespace {

std::atomic<int64_t> g_head_chunk_bytes{kHeadChunkBytes};

using parts::NormPart;
using parts::ParamList;
using parts::Weights;

class Embedding final : public Block {
 public:
  // params: token table[, position table].
  Embedding(const ModelConfig& c, std::vector<Param> params)
      : Block(Kind::kEmbedding, 0, "embedding"),
        scale_(c.scale_embeddings ? std::sqrt(static_cast<double>(c.hidden_size)) : 0.0),
        padding_idx_(c.pad_token_id) {
    params_ = std::move(params);
  }

 protected:
  at::Tensor Scale(const at::Tensor& like) const {
    return at::scalar_tensor(scale_, like.options());
  }
  at::Tensor Run(const MicroBatch& mb, const at::Tensor&, std::vector<at::Tensor>*) override {
    at::Tensor h = at::embedding(P(0), mb.input_ids);
    if (params_.size() > 1) h = h + at::embedding(P(1), mb.position_ids);
    if (scale_ > 0) h = h * Scale(h);
    return h;
  }
  at::Tensor Backprop(const MicroBatch& mb, const at::Tensor& dy, std::vector<at::Tensor>&,
                      const GradCallback& on_grad) override {
    const at::Tensor d = scale_ > 0 ? dy * Scale(dy) : dy;
    if (params_.size() > 1) {
      on_grad(params_[1].name,
              at::embedding_dense_backward(d, mb.position_ids, P(1).size(0), -1, false));
    }
    on_grad(params_[0].name,
            at::embedding_dense_backward(d, mb.input_ids, P(0).size(0), padding_idx_, false));
    return at::Tensor();
  }

 private:
  double scale_;         // 0: none
  int64_t padding_idx_;  // the row the lookup gives no gradient (-1: none), as nn.Embedding
};

class Head final : public Block {
 public:
  Head(const ModelConfig& c, int index, NormPart norm, size_t lm_head, std::vector<Param> params,
       Param* tied)
      : Block(Kind::kHead, index, "head"),
        norm_(norm),
        lm_head_(lm_head),
        softcap_(c.final_logit_softcap) {
    params_ = std::move(params);
    if (tied) shared_.push_back(tied);
  }

  BlockCost EstimateCost(int64_t batch, int64_t seq, c10::ScalarType dtype) const override {
    const double n = static_cast<double>(batch) * seq;
    const double e = static_cast<double>(c10::elementSize(dtype));
    const double h = P(0).size(0), v = HeadWeight().value.size(0);
    BlockCost cost;
    cost.param_bytes = OwnedParamBytes();
    // x, d loss / d n, the norm's stats, d loss / d W.
    cost.saved_bytes_keep = static_cast<int64_t>(2 * n * h * e + norm_.SavedBytes(n) + v * h * e);
    cost.saved_bytes_recompute = static_cast<int64_t>(n * h * e);
    cost.forward_flops = 6 * n * h * v;  // logits, dn, dW
    return cost;
  }

 protected:
  const Param& HeadWeight() const { return shared_.empty() ? params_[lm_head_] : *shared_[0]; }

  at::Tensor RunLogits(const MicroBatch&, const at::Tensor& x) override {
    std::vector<at::Tensor> stats;
    at::Tensor logits = ops::Linear(norm_.Forward(Weights(params_), x, &stats), HeadWeight().value,
                                    {});
    if (softcap_ > 0) logits = at::tanh(logits / softcap_) * softcap_;  // Gemma 2
    return logits;
  }
  // The training forward also computes the head's backward (it is the last block): saved are x,
  // the norm's stats, d loss / d n and d loss / d W, so no [tokens, vocab] tensor outlives it.
  at::Tensor Run(const MicroBatch& mb, const at::Tensor& x,
                 std::vector<at::Tensor>* saved) override {
    std::vector<at::Tensor> stats;
    at::Tensor dn, dw;
    at::Tensor n = norm_.Forward(Weights(params_), x, &stats);
    at::Tensor loss = ops::LmHeadLoss(n, HeadWeight().value, mb.targets, mb.num_trained_tokens,
                                      saved ? &dn : nullptr, saved ? &dw : nullptr,
                                      HeadChunkBytes(), mb.loss_scale, softcap_);
    // The MoE load-balancing loss (its gradient is the sparse layers' backward's).
    if (mb.moe && mb.moe->aux_coef > 0) loss = loss + mb.moe->AuxLoss() * mb.moe->aux_coef;
    if (saved) {
      *saved = {x};
      saved->insert(saved->end(), stats.begin(), stats.end());
      saved->insert(saved->end(), {dn, dw});
    }
    return loss;
  }
  at::Tensor Backprop(const MicroBatch&, const at::Tensor& scale, std::vector<at::Tensor>& s,
                      const GradCallback& on_grad) override {
    const at::Tensor& x = s[0];
    const at::Tensor* stats = s.data() + 1;
    at::Tensor dn = s[1 + norm_.num_stats()], dw = s[2 + norm_.num_stats()];
    if (scale.defined()) {
      dn = dn * scale.to(dn.scalar_type());
      dw = dw * scale.to(dw.scalar_type());
    }
    on_grad(HeadWeight().name, dw);
    const parts::Emit emit = [&](size_t i, const at::Tensor& g) { on_grad(params_[i].name, g); };
    return norm_.Backward(Weights(params_), dn, x, stats, emit);
  }

 private:
  NormPart norm_;
  size_t lm_head_;  // parts::kAbsent when tied
  double softcap_;
};

}  // namespace

void PrepareLayerInputs(const ModelConfig& c, c10::ScalarType dtype, MicroBatch* mb) {
  const c10::Device device = mb->input_ids.device();
  const int64_t t = mb->input_ids.size(1);
  if (c.moe.output_router_logits && c.moe.num_experts > 0) {
    mb->moe = std::make_shared<MoeRouterStats>();
    mb->moe->num_experts = c.moe.num_experts;
    mb->moe->aux_coef = c.moe.router_aux_loss_coef;
    mb->moe->counts.resize(c.num_layers);
    mb->moe->prob_sums.resize(c.num_layers);
    mb->moe->rows.assign(c.num_layers, 0);
  }
  // Unpacked rows run the document path (one document per row) where soft-capping or attention
  // sinks need it, or a sliding window shorter than the sequence that the windowed flash kernel
  // cannot take.
  const bool slides = std::find(c.sliding.begin(), c.sliding.end(), true) !=
                      c.sliding.end();
  const bool short_window = slides && c.sliding_window > 0 && c.sliding_window < t &&
                            !ops::WindowedFlashFits(device, dtype, c.head_dim);
  if (!mb->docs.defined() && (c.attn_logit_softcap > 0 || c.attention_sinks || short_window)) {
    mb->docs = ops::RowDocuments(mb->input_ids.size(0), t, device);
  }
  if (c.arch != Architecture::kLlama) return;
  // Tables over the rotated dimensions only (partial_rotary_factor); ApplyRope passes the rest
  // of each head through.
  ops::RopeTables(c.rope, c.head_dim, mb->position_ids, dtype, &mb->rope_cos, &mb->rope_sin);
  if (c.has_local_rope) {
    ops::RopeTables(c.rope_local, c.head_dim, mb->position_ids, dtype, &mb->rope_cos_local,
                    &mb->rope_sin_local);
  }
}

StatusOr<std::vector<std::unique_ptr<Block>>> BuildBlocks(const ModelConfig& c,
                                                          const ParamLoader& load) {
  const TensorNames& n = c.names;
  const int64_t hs = c.hidden_size;
  std::vector<std::unique_ptr<Block>> blocks;
  parts::Spec emb = {{n.embed, {c.vocab_size, hs}}};
  if (!n.position_embed.empty()) emb.push_back({n.position_embed, {c.max_position_embeddings, hs}});
  ASSIGN_OR_RETURN(auto emb_params, LoadParams(load, emb));
  blocks.push_back(std::make_unique<Embedding>(c, std::move(emb_params)));
  for (int i = 0; i < c.num_layers; ++i) {
    ASSIGN_OR_RETURN(auto layer, BuildDecoderLayer(c, i, load));
    blocks.push_back(std::move(layer));
  }
  ParamList pl;
  NormPart norm(c, n.final_norm, n.final_norm_bias, hs, &pl);
  const size_t lm_head =
      c.tie_word_embeddings ? parts::kAbsent : pl.Add(n.lm_head, {c.vocab_size, hs});
  ASSIGN_OR_RETURN(auto params, LoadParams(load, pl.specs()));
  Param* tied = c.tie_word_embeddings ? &blocks[0]->params()[0] : nullptr;
  blocks.push_back(std::make_unique<Head>(c, static_cast<int>(blocks.size()), norm, lm_head,
                                          std::move(params), tied));
  return blocks;
}

void SetHeadChunkBytes(int64_t bytes) {
  g_head_chunk_bytes.store(bytes > 0 ? bytes : kHeadChunkBytes, std::memory_order_relaxed);
}

int64_t HeadChunkBytes() { return g_head_chunk_bytes.load(std::memory_order_relaxed); }

}  // namespace offloadd::engine
