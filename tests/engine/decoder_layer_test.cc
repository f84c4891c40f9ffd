// The decoder layer assembled from parts, for a tiny model of each family as the family table
// maps it (ModelConfigs built here): the analytic backward against central differences of the
// loss, bit-identical gradients across save modes, the cost model against the measured saved
// bytes, and the reach of sliding-window layers.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/blocks.h"
#include "engine/ops.h"

namespace offloadd::engine {
namespace {

ModelConfig Base(const std::string& family) {
  ModelConfig c;
  c.model_type = family;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.norm_eps = 1e-6;
  c.rope.theta = 10000.0;
  return c;
}

// What the family table gives each family, for the parts (tensor names as transformers writes
// them). Windows of 3 tokens against sequences of 8 make the sliding layers mask.
ModelConfig Family(const std::string& f) {
  ModelConfig c = Base(f);
  TensorNames& n = c.names;
  if (f == "llama_bias") {  // attention_bias and mlp_bias
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
  } else if (f == "mistral") {
    c.sliding = {true, true};
    c.sliding_window = 3;
  } else if (f == "qwen3") {  // head_dim independent of hidden / heads, per-head q/k norm
    c.head_dim = 16;
    c.qk_norm = QkNorm::kPerHead;
    n.q_norm = "self_attn.q_norm";
    n.k_norm = "self_attn.k_norm";
    c.sliding = {false, true};
    c.sliding_window = 3;
    c.tie_word_embeddings = true;
  } else if (f == "gemma2" || f == "gemma3") {
    c.norm = NormKind::kRmsOneOffset;
    c.norm_placement = NormPlacement::kSandwich;
    n.pre_mlp_norm = "pre_feedforward_layernorm";
    n.post_mlp_norm = "post_feedforward_layernorm";
    c.mlp = MlpKind::kGeGluTanh;
    c.attn_scale = 1.0 / std::sqrt(24.0);  // query_pre_attn_scalar 24
    c.scale_embeddings = true;
    c.tie_word_embeddings = true;
    c.sliding = {true, false};
    c.sliding_window = 3;
    if (f == "gemma2") {
      c.attn_logit_softcap = 1.5;  // small, so that the tanh bends the logits of these weights
      c.final_logit_softcap = 2.0;
    } else {
      c.qk_norm = QkNorm::kPerHead;
      n.q_norm = "self_attn.q_norm";
      n.k_norm = "self_attn.k_norm";
      c.has_local_rope = true;
      c.rope_local.theta = 100.0;
    }
  } else if (f == "olmo2") {
    c.norm_placement = NormPlacement::kPost;
    n.input_norm = "";
    n.post_mlp_norm = "post_feedforward_layernorm";
    c.qk_norm = QkNorm::kWhole;
    n.q_norm = "self_attn.q_norm";
    n.k_norm = "self_attn.k_norm";
  } else if (f == "phi3") {
    n.qkv = "self_attn.qkv_proj";
    n.q = n.k = n.v = "";
    n.gate_up = "mlp.gate_up_proj";
    n.gate = n.up = "";
  } else if (f == "gpt2") {
    c.arch = Architecture::kGpt2;
    c.norm = NormKind::kLayer;
    c.mlp = MlpKind::kGeluMlp;
    c.num_kv_heads = c.num_heads;
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    c.norm_eps = 1e-5;
    c.tie_word_embeddings = true;
    n = TensorNames();
    n.embed = "wte.weight";
    n.position_embed = "wpe.weight";
    n.final_norm = "ln_f.weight";
    n.final_norm_bias = "ln_f.bias";
    n.layer_prefix = "h.";
    n.input_norm = "ln_1";
    n.post_attn_norm = "ln_2";
    n.qkv = "attn.c_attn";
    n.o = "attn.c_proj";
    n.up = "mlp.c_fc";
    n.down = "mlp.c_proj";
  }
  return c;
}

// A tiny model of blocks with seeded random weights (fp32, CPU) and a driver for it.
struct Tiny {
  explicit Tiny(const ModelConfig& config) : c(config) {
    uint64_t seed = 1;
    ParamLoader load = [&](const std::string& name,
                           const std::vector<int64_t>& shape) -> StatusOr<at::Tensor> {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed++);
      at::Tensor r = at::randn(shape, gen);
      const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      if (shape.size() == 1 && !bias && c.norm != NormKind::kRmsOneOffset) return 1.0 + 0.1 * r;
      return (shape.size() == 1 ? 0.1 : 0.3) * r;
    };
    auto built = BuildBlocks(c, load);
    EXPECT_TRUE(built.ok()) << built.status().ToString();
    blocks = std::move(*built);
  }

  MicroBatch Batch(int64_t b, int64_t t, uint64_t seed = 7) const {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    MicroBatch mb;
    mb.input_ids = at::randint(c.vocab_size, {b, t}, gen, at::kLong);
    mb.position_ids = at::arange(t, at::kLong).unsqueeze(0).expand({b, t}).contiguous();
    mb.targets = at::randint(c.vocab_size, {b, t}, gen, at::kLong);
    mb.targets.index_put_({0, 0}, kIgnoreIndex);
    mb.num_trained_tokens = static_cast<double>(b * t - 1);
    PrepareLayerInputs(c, at::kFloat, &mb);
    return mb;
  }

  double Loss(const MicroBatch& mb) {
    at::Tensor x;
    for (auto& b : blocks) x = *b->Forward(mb, x, SaveMode::kNone, nullptr);
    return x.item<double>();
  }

  // Gradients summed per name (tied weights arrive twice).
  std::map<std::string, at::Tensor> Grads(const MicroBatch& mb, SaveMode mode) {
    std::vector<SavedState> saved(blocks.size());
    OffloadCallbacks offload;
    uint64_t next = 1;
    std::map<uint64_t, std::vector<at::Tensor>> store;
    offload.offload = [&](int, std::vector<at::Tensor> s) -> StatusOr<uint64_t> {
      for (auto& t : s) t = t.defined() ? t.clone() : t;
      store[next] = std::move(s);
      return next++;
    };
    offload.fetch = [&](int, uint64_t ticket) -> StatusOr<std::vector<at::Tensor>> {
      return store.at(ticket);
    };
    at::Tensor x;
    for (size_t i = 0; i < blocks.size(); ++i) {
      x = *blocks[i]->Forward(mb, x, mode, &saved[i], &offload);
    }
    std::map<std::string, at::Tensor> grads;
    GradCallback on_grad = [&](const std::string& name, const at::Tensor& g) {
      auto it = grads.find(name);
      if (it == grads.end()) {
        grads[name] = g.clone();
      } else {
        it->second = it->second + g;
      }
    };
    at::Tensor g;
    for (size_t i = blocks.size(); i-- > 0;) {
      auto r = blocks[i]->Backward(mb, g, &saved[i], on_grad, &offload);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      g = *r;
    }
    return grads;
  }

  at::Tensor* Find(const std::string& name) {
    for (auto& b : blocks) {
      for (auto& p : b->params()) {
        if (p.name == name) return &p.value;
      }
    }
    return nullptr;
  }

  ModelConfig c;
  std::vector<std::unique_ptr<Block>> blocks;
};

class FamilyTest : public ::testing::TestWithParam<std::string> {};

// Every parameter's gradient against central differences of the loss along that gradient:
// D(h) = (L(p + h u) - L(p - h u)) / 2h with u = g / |g| estimates |g| with an error of
// c h^2 + O(h^4); Richardson's (4 D(h/2) - D(h)) / 3 removes the h^2 term (the weights here are
// large enough for it to reach 1%). The fp32 loss rounds at ~1e-7 * L, which the differences
// divide by h: a few 1e-4 absolute at h = 5e-3.
TEST_P(FamilyTest, GradientsMatchCentralDifferences) {
  Tiny m(Family(GetParam()));
  const MicroBatch mb = m.Batch(2, 8);
  const auto grads = m.Grads(mb, SaveMode::kKeep);
  int checked = 0;
  for (const auto& [name, g] : grads) {
    at::Tensor* p = m.Find(name);
    ASSERT_NE(p, nullptr) << name;
    const double norm = g.norm().item<double>();
    if (norm < 1e-4) continue;  // nothing to measure in fp32
    const at::Tensor orig = p->clone();
    auto central = [&](double h) {
      const at::Tensor step = g * (h / norm);
      *p = orig + step;
      const double up = m.Loss(mb);
      *p = orig - step;
      const double down = m.Loss(mb);
      *p = orig;
      return (up - down) / (2 * h);
    };
    const double fd = (4 * central(5e-3) - central(1e-2)) / 3;
    EXPECT_NEAR(fd, norm, 2e-3 * norm + 5e-4) << name;
    ++checked;
  }
  EXPECT_GE(checked, static_cast<int>(grads.size()) - 1);
}

// keep, recompute and offload run the same backward: bit-identical gradients.
TEST_P(FamilyTest, SaveModesGiveIdenticalGradients) {
  Tiny m(Family(GetParam()));
  const MicroBatch mb = m.Batch(2, 8);
  const auto keep = m.Grads(mb, SaveMode::kKeep);
  for (SaveMode mode : {SaveMode::kRecompute, SaveMode::kOffload}) {
    const auto other = m.Grads(mb, mode);
    ASSERT_EQ(other.size(), keep.size());
    for (const auto& [name, g] : keep) {
      EXPECT_TRUE(at::equal(g, other.at(name))) << name << " " << SaveModeName(mode);
    }
  }
}

// The planner's saved-bytes figure equals what a kKeep forward holds, for sequences shorter and
// longer than the sliding window (the explicit path saves probabilities instead of logsumexp).
TEST_P(FamilyTest, CostEqualsHeldBytes) {
  Tiny m(Family(GetParam()));
  for (int64_t t : {2, 8}) {
    const MicroBatch mb = m.Batch(2, t);
    at::Tensor x;
    for (auto& b : m.blocks) {
      SavedState saved;
      x = *b->Forward(mb, x, SaveMode::kKeep, &saved);
      if (b->kind() == Block::Kind::kEmbedding) continue;
      EXPECT_EQ(saved.held_bytes(), b->EstimateCost(2, t, at::kFloat).saved_bytes_keep)
          << b->name() << " seq " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyTest,
                         ::testing::Values("llama_bias", "mistral", "qwen3", "gemma2", "gemma3",
                                           "olmo2", "phi3", "gpt2"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// A sliding layer's token i sees tokens i - window + 1 .. i only: changing token 0 leaves the
// outputs from position `window` on bit-identical and changes the earlier ones.
TEST(SlidingWindow, ReachIsTheWindow) {
  ModelConfig c = Family("mistral");
  c.num_layers = 1;
  Tiny m(c);
  const MicroBatch mb = m.Batch(1, 8);
  Block& layer = *m.blocks[1];
  at::Tensor x = at::randn({1, 8, c.hidden_size});
  at::Tensor y = *layer.Forward(mb, x, SaveMode::kNone, nullptr);
  at::Tensor x2 = x.clone();
  x2.select(1, 0).add_(1.0);
  at::Tensor y2 = *layer.Forward(mb, x2, SaveMode::kNone, nullptr);
  for (int64_t i = 0; i < 8; ++i) {
    const bool same = at::equal(y.select(1, i), y2.select(1, i));
    EXPECT_EQ(same, i >= c.sliding_window) << "position " << i;
  }
}

// Packing and a window together: the sliding mask is the intersection of both.
TEST(SlidingWindow, MaskCombinesSegmentsAndWindow) {
  at::Tensor seg = at::tensor({0, 0, 0, 0, 1, 1, 1, 1}, at::kLong).unsqueeze(0);
  at::Tensor mask = ops::SegmentMask(seg, at::kFloat, 3).squeeze();
  for (int64_t i = 0; i < 8; ++i) {
    for (int64_t j = 0; j < 8; ++j) {
      const bool allowed = j <= i && i - j < 3 && (i < 4) == (j < 4);
      EXPECT_EQ(mask[i][j].item<float>() == 0.0f, allowed) << i << "," << j;
    }
  }
}

// nn.Embedding(padding_idx): the lookup gives the pad row no gradient (untied: nothing else does).
TEST(Embedding, PadRowGetsNoGradient) {
  ModelConfig c = Family("llama_bias");
  c.pad_token_id = 3;
  Tiny m(c);
  MicroBatch mb = m.Batch(2, 8);
  mb.input_ids.index_put_({0, 1}, 3);
  mb.input_ids.index_put_({0, 2}, 5);
  const auto grads = m.Grads(mb, SaveMode::kKeep);
  const at::Tensor& g = grads.at(c.names.embed);
  EXPECT_TRUE(at::equal(g[3], at::zeros_like(g[3])));
  EXPECT_GT(g[5].abs().sum().item<double>(), 0.0);
}

// Gemma 2's final soft-capping bounds every logit by the cap.
TEST(Softcap, FinalLogitsStayWithinTheCap) {
  Tiny m(Family("gemma2"));
  MicroBatch mb = m.Batch(2, 8);
  at::Tensor x;
  for (size_t i = 0; i + 1 < m.blocks.size(); ++i) {
    x = *m.blocks[i]->Forward(mb, x, SaveMode::kNone, nullptr);
  }
  at::Tensor logits = *m.blocks.back()->Logits(mb, x);
  EXPECT_LE(logits.abs().max().item<double>(), 2.0);
  EXPECT_GT(logits.abs().max().item<double>(), 1.0);  // the cap bends them, not zero
}

}  // namespace
}  // namespace offloadd::engine
