// The decoder layer, assembled from the parts its ModelConfig selects (engine/parts.h):
//
//   kPre      (Llama, Mistral, Qwen, Phi-3, GPT-2):  h = x + attn(norm1(x));  y = h + mlp(norm2(h))
//   kSandwich (Gemma 2/3):  h = x + post_attn_norm(attn(norm1(x)))
//                           y = h + post_mlp_norm(mlp(pre_mlp_norm(h)))
//   kPost     (OLMo 2):     h = x + post_attn_norm(attn(x));  y = h + post_mlp_norm(mlp(h))
//
// Saved for backward, in order: x, norm1's stats, the attention's tensors, [the attention output
// and post_attn_norm's stats], h, [the MLP's pre-norm stats], the MLP's tensors, [the MLP output
// and post_mlp_norm's stats], then the attention kernel's statistics. Normalised inputs are
// re-applied from their stats in backward.
#include <ATen/ATen.h>

#include <optional>

#include "engine/blocks.h"
#include "engine/parts.h"

namespace offloadd::engine {
namespace {

using parts::AttentionPart;
using parts::MlpPart;
using parts::MoePart;
using parts::NormPart;
using parts::ParamList;
using parts::SavedReader;
using parts::Weights;

// A norm's stats in the saved list (nullptr when the norm is absent).
const at::Tensor* ReadStats(SavedReader* r, const NormPart& n) {
  if (!n.present()) return nullptr;
  const at::Tensor* first = &r->Next();
  for (int i = 1; i < n.num_stats(); ++i) r->Next();
  return first;
}

// The feed-forward: the dense MLP, or the mixture of experts on a sparse layer.
struct LayerParts {
  NormPart in_norm, attn_post, mlp_pre, mlp_post;
  AttentionPart attn;
  std::optional<MlpPart> mlp;
  std::optional<MoePart> moe;
};

// Registers the layer's parameters in checkpoint order of the parts: norm1, attention,
// [post_attn_norm], MLP pre-norm, MLP, [post_mlp_norm].
LayerParts MakeParts(const ModelConfig& c, int layer, const std::string& p, ParamList* pl) {
  const TensorNames& n = c.names;
  auto norm = [&](const std::string& name) {
    return name.empty() ? NormPart()
                        : NormPart(c, p + name + ".weight", p + name + ".bias", c.hidden_size, pl);
  };
  const NormPlacement place = c.norm_placement;
  NormPart in_norm = norm(place == NormPlacement::kPost ? "" : n.input_norm);
  AttentionPart attn(c, layer, p, pl);
  NormPart attn_post = norm(place == NormPlacement::kPre ? "" : n.post_attn_norm);
  NormPart mlp_pre = norm(place == NormPlacement::kPre        ? n.post_attn_norm
                          : place == NormPlacement::kSandwich ? n.pre_mlp_norm
                                                              : "");
  std::optional<MlpPart> mlp;
  std::optional<MoePart> moe;
  if (c.layer_sparse(layer)) {
    moe.emplace(c, layer, p, pl);
  } else {
    mlp.emplace(c, p, pl);
  }
  NormPart mlp_post = norm(place == NormPlacement::kPre ? "" : n.post_mlp_norm);
  return {in_norm, attn_post, mlp_pre, mlp_post, std::move(attn), std::move(mlp), std::move(moe)};
}

class DecoderLayer final : public Block {
 public:
  DecoderLayer(const ModelConfig& c, int layer, std::string name, LayerParts parts,
               std::vector<Param> params)
      : Block(Kind::kDecoderLayer, layer + 1, std::move(name)),
        p_(std::move(parts)),
        hidden_(c.hidden_size) {
    params_ = std::move(params);
  }

  BlockCost EstimateCost(int64_t batch, int64_t seq, c10::ScalarType dtype) const override {
    const double n = static_cast<double>(batch) * seq;
    const double e = static_cast<double>(c10::elementSize(dtype));
    const double hidden_bytes = n * hidden_ * e;
    double keep = 2 * hidden_bytes;  // x, h
    keep += p_.attn.SavedBytes(batch, seq, e) +
            (p_.moe ? p_.moe->SavedBytes(n, e) : p_.mlp->SavedBytes(n, e));
    for (const NormPart* norm : {&p_.in_norm, &p_.attn_post, &p_.mlp_pre, &p_.mlp_post}) {
      if (norm->present()) keep += norm->SavedBytes(n);
    }
    if (p_.attn_post.present()) keep += hidden_bytes;  // the attention output it normalises
    if (p_.mlp_post.present()) keep += hidden_bytes;   // the MLP output
    BlockCost cost;
    cost.param_bytes = OwnedParamBytes();
    cost.saved_bytes_keep = static_cast<int64_t>(keep);
    cost.saved_bytes_recompute = static_cast<int64_t>(hidden_bytes);
    cost.forward_flops = p_.attn.Flops(batch, seq) + (p_.moe ? p_.moe->Flops(n) : p_.mlp->Flops(n));
    return cost;
  }

  std::vector<std::string> DescribeParts(c10::Device device, c10::ScalarType dtype,
                                         int64_t seq) const {
    const NormPart& norm = p_.in_norm.present() ? p_.in_norm : p_.attn_post;
    return {"norm: " + norm.Describe(device, dtype),
            "attention: " + p_.attn.Describe(device, dtype, seq),
            p_.moe ? "moe: " + p_.moe->Describe(device, dtype)
                   : "mlp: " + p_.mlp->Describe(device, dtype)};
  }

 protected:
  at::Tensor Run(const MicroBatch& mb, const at::Tensor& x,
                 std::vector<at::Tensor>* saved) override {
    const Weights W(params_);
    std::vector<at::Tensor> aux;
    if (saved) saved->push_back(x);
    at::Tensor a;
    {
      const at::Tensor n1 = p_.in_norm.present() ? p_.in_norm.Forward(W, x, saved) : x;
      a = p_.attn.Forward(W, mb, n1, saved, saved ? &aux : nullptr);
    }
    if (p_.attn_post.present()) {
      if (saved) saved->push_back(a);
      a = p_.attn_post.Forward(W, a, saved);
    }
    at::Tensor h = x + a;
    a = at::Tensor();
    if (saved) saved->push_back(h);
    at::Tensor m;
    {
      const at::Tensor n2 = p_.mlp_pre.present() ? p_.mlp_pre.Forward(W, h, saved) : h;
      m = p_.moe ? p_.moe->Forward(W, mb, n2, saved) : p_.mlp->Forward(W, n2, saved);
    }
    if (p_.mlp_post.present()) {
      if (saved) saved->push_back(m);
      m = p_.mlp_post.Forward(W, m, saved);
    }
    if (saved) saved->insert(saved->end(), aux.begin(), aux.end());
    return h + m;
  }

  at::Tensor Backprop(const MicroBatch& mb, const at::Tensor& dy, std::vector<at::Tensor>& s,
                      const GradCallback& on_grad) override {
    const Weights W(params_);
    const parts::Emit emit = [&](size_t i, const at::Tensor& g) { on_grad(params_[i].name, g); };
    SavedReader r(s);
    const at::Tensor& x = r.Next();
    const at::Tensor* in_stats = ReadStats(&r, p_.in_norm);
    const AttentionPart::Saved as = p_.attn.Read(&r);
    const at::Tensor* attn_out = p_.attn_post.present() ? &r.Next() : nullptr;
    const at::Tensor* attn_post_stats = ReadStats(&r, p_.attn_post);
    const at::Tensor& h = r.Next();
    const at::Tensor* mlp_pre_stats = ReadStats(&r, p_.mlp_pre);
    MlpPart::Saved ms;
    MoePart::Saved es;
    if (p_.moe) {
      es = p_.moe->Read(&r);
    } else {
      ms = p_.mlp->Read(&r, h);
    }
    const at::Tensor* mlp_out = p_.mlp_post.present() ? &r.Next() : nullptr;
    const at::Tensor* mlp_post_stats = ReadStats(&r, p_.mlp_post);
    const at::Tensor* aux = r.Rest();

    // MLP half: y = h + post(mlp(pre(h))).
    at::Tensor dm = dy;
    if (p_.mlp_post.present()) dm = p_.mlp_post.Backward(W, dy, *mlp_out, mlp_post_stats, emit);
    auto n2 = [&] { return p_.mlp_pre.present() ? p_.mlp_pre.Reapply(W, h, mlp_pre_stats) : h; };
    at::Tensor dn2 =
        (p_.moe ? p_.moe->Backward(W, mb, dm, n2, es, emit) : p_.mlp->Backward(W, dm, n2, ms, emit))
            .view(h.sizes());
    dm = at::Tensor();
    at::Tensor dh = p_.mlp_pre.present() ? p_.mlp_pre.Backward(W, dn2, h, mlp_pre_stats, emit, dy)
                                         : dy + dn2;
    dn2 = at::Tensor();

    // Attention half: h = x + post(attn(norm1(x))).
    at::Tensor da = dh;
    if (p_.attn_post.present()) {
      da = p_.attn_post.Backward(W, dh, *attn_out, attn_post_stats, emit);
    }
    auto n1 = [&] { return p_.in_norm.present() ? p_.in_norm.Reapply(W, x, in_stats) : x; };
    at::Tensor dn1 = p_.attn.Backward(W, mb, da, n1, as, aux, emit).view(x.sizes());
    da = at::Tensor();
    return p_.in_norm.present() ? p_.in_norm.Backward(W, dn1, x, in_stats, emit, dh) : dh + dn1;
  }

 private:
  LayerParts p_;
  int64_t hidden_;
};

}  // namespace

StatusOr<std::unique_ptr<Block>> BuildDecoderLayer(const ModelConfig& c, int layer,
                                                   const ParamLoader& load) {
  const std::string name = c.names.layer_prefix + std::to_string(layer);
  ParamList pl;
  LayerParts parts = MakeParts(c, layer, name + ".", &pl);
  ASSIGN_OR_RETURN(auto params, LoadParams(load, pl.specs()));
  return std::unique_ptr<Block>(
      std::make_unique<DecoderLayer>(c, layer, name, std::move(parts), std::move(params)));
}

std::vector<std::string> DescribeLayerParts(const Block& layer, c10::Device device,
                                            c10::ScalarType dtype, int64_t seq) {
  const auto* d = dynamic_cast<const DecoderLayer*>(&layer);
  return d ? d->DescribeParts(device, dtype, seq) : std::vector<std::string>{};
}

}  // namespace offloadd::engine
