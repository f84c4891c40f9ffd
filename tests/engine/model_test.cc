// Block API tests on random tiny models (no Python): save modes, gradient delivery, offload
// callbacks, tied weights, error paths, export round trip. Numerical parity with transformers is
// covered by tests/python/engine.
#include "engine/model.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

#include "common/file.h"
#include "engine/ops.h"
#include "engine/tensor_io.h"
#include "tests/engine/tiny_model.h"

namespace offloadd::engine {
namespace {

using testing::TinyArch;
using testing::WriteTinyModel;

std::string TempDir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string d =
      JoinPath(tmp ? tmp : "/tmp", "engine_model_test_" + std::to_string(::getpid()) + "_" + tag);
  EXPECT_TRUE(RemoveTree(d).ok());
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

struct Batch {
  at::Tensor ids, targets;
};

Batch MakeBatch(int64_t vocab, int64_t b = 3, int64_t t = 10) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  Batch x;
  x.ids = at::randint(vocab, {b, t}, gen, at::kLong);
  x.targets = Model::ShiftLabels(x.ids);
  x.targets.narrow(1, 0, 2).fill_(kIgnoreIndex);
  return x;
}

// Runs forward/backward block by block with the given modes; returns grads (summed per name) and
// checks that every gradient arrives while its own block's Backward is running.
struct RunResult {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  std::map<std::string, int> deliveries;
  std::vector<int64_t> held_bytes;
  int offloaded = 0;
};

RunResult RunBlocks(Model& m, const MicroBatch& mb, const std::vector<SaveMode>& modes) {
  RunResult r;
  std::map<uint64_t, std::vector<at::Tensor>> store;
  uint64_t next = 1;
  OffloadCallbacks cb;
  cb.offload = [&](int, std::vector<at::Tensor> saved) -> StatusOr<uint64_t> {
    std::vector<at::Tensor> host;
    for (auto& t : saved) host.push_back(t.clone());
    store[next] = std::move(host);
    ++r.offloaded;
    return next++;
  };
  cb.fetch = [&](int, uint64_t ticket) -> StatusOr<std::vector<at::Tensor>> {
    auto v = std::move(store.at(ticket));
    store.erase(ticket);
    return v;
  };
  int current = -1;
  GradCallback on_grad = [&](const std::string& name, const at::Tensor& g) {
    // Must belong to (or be shared with) the block whose Backward is running.
    const Block& b = m.block(current);
    bool mine = false;
    for (const auto& p : b.params()) mine = mine || p.name == name;
    for (const Param* p : b.shared_params()) mine = mine || p->name == name;
    EXPECT_TRUE(mine) << name << " delivered during " << b.name();
    r.deliveries[name]++;
    auto it = r.grads.find(name);
    if (it == r.grads.end())
      r.grads[name] = g.clone();
    else
      it->second = it->second + g;
  };
  std::vector<SavedState> saved(m.num_blocks());
  at::Tensor x;
  for (int i = 0; i < m.num_blocks(); ++i) {
    auto out = m.block(i).Forward(mb, x, modes[i], &saved[i], &cb);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    x = *out;
    r.held_bytes.push_back(saved[i].held_bytes());
  }
  r.loss = x;
  at::Tensor g;
  for (int i = m.num_blocks() - 1; i >= 0; --i) {
    current = i;
    auto out = m.block(i).Backward(mb, g, &saved[i], on_grad, &cb);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    g = *out;
    EXPECT_FALSE(saved[i].ready());
  }
  EXPECT_TRUE(store.empty());
  return r;
}

class ModelTest : public ::testing::TestWithParam<TinyArch> {};

TEST_P(ModelTest, SaveModesGiveIdenticalGradientsDeliveredPerBlock) {
  auto dir = TempDir("modes_" + std::to_string(static_cast<int>(GetParam())));
  WriteTinyModel(dir, GetParam(), /*tied=*/GetParam() != TinyArch::kLlama);
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Batch b = MakeBatch((*m)->config().vocab_size);
  auto mb = (*m)->PrepareBatch(b.ids, b.targets, Model::CountTrainedTokens(b.targets));
  ASSERT_TRUE(mb.ok()) << mb.status().ToString();
  const int n = (*m)->num_blocks();
  ASSERT_EQ(n, 4);  // embedding, 2 layers, head

  RunResult keep = RunBlocks(**m, *mb, std::vector<SaveMode>(n, SaveMode::kKeep));
  RunResult rec = RunBlocks(**m, *mb, std::vector<SaveMode>(n, SaveMode::kRecompute));
  RunResult off = RunBlocks(**m, *mb, std::vector<SaveMode>(n, SaveMode::kOffload));
  RunResult mix = RunBlocks(
      **m, *mb, {SaveMode::kOffload, SaveMode::kRecompute, SaveMode::kKeep, SaveMode::kRecompute});
  EXPECT_EQ(off.offloaded, n);
  // Every parameter got a gradient; identical across modes (same kernels on the same inputs).
  std::set<std::string> names;
  for (int i = 0; i < n; ++i) {
    for (const auto& p : (*m)->block(i).params()) names.insert(p.name);
  }
  EXPECT_EQ(keep.grads.size(), names.size());
  for (const RunResult* r : {&rec, &off, &mix}) {
    EXPECT_TRUE(at::equal(r->loss, keep.loss));
    ASSERT_EQ(r->grads.size(), keep.grads.size());
    for (const auto& [name, g] : keep.grads) {
      EXPECT_TRUE(at::equal(r->grads.at(name), g)) << name;
      EXPECT_GT(g.abs().max().item<float>(), 0.f) << name;
    }
  }
  // Memory held between forward and backward: offload none, recompute only the block input.
  for (int i = 1; i < n; ++i) {
    EXPECT_EQ(off.held_bytes[i], 0);
    EXPECT_EQ(rec.held_bytes[i], 3 * 10 * 32 * 4) << i;  // [3, 10, 32] fp32 input
    // Decoder layers keep ~10 activations of the input's size; the head keeps x and dlogits.
    EXPECT_GT(keep.held_bytes[i], (i + 1 < n ? 4 : 2) * rec.held_bytes[i]) << i;
  }
  // The cost model predicts the saved bytes measured here.
  for (int i = 0; i < n; ++i) {
    const BlockCost cost = (*m)->block(i).EstimateCost(3, 10, at::kFloat);
    EXPECT_EQ(cost.saved_bytes_keep, keep.held_bytes[i]) << i;
    EXPECT_EQ(cost.saved_bytes_recompute, rec.held_bytes[i]) << i;
    if (i > 0) {
      EXPECT_GT(cost.forward_flops, 0) << i;
    }
    EXPECT_GT(cost.param_bytes, 0) << i;
  }
  // Tied weights are delivered by the head and by the embedding.
  if ((*m)->config().tie_word_embeddings) {
    EXPECT_EQ(keep.deliveries.at((*m)->block(0).params()[0].name), 2);
  }
  // The whole-model helper agrees with the manual loop.
  std::map<std::string, at::Tensor> whole;
  auto loss = (*m)->ForwardBackward(*mb, {}, [&](const std::string& name, const at::Tensor& g) {
    whole[name] = whole.count(name) ? whole[name] + g : g;
  });
  ASSERT_TRUE(loss.ok());
  EXPECT_TRUE(at::equal(*loss, keep.loss));
  for (const auto& [name, g] : keep.grads) EXPECT_TRUE(at::equal(whole.at(name), g)) << name;
  (void)RemoveTree(dir);
}

TEST_P(ModelTest, MicroBatchesAndLossScale) {
  auto dir = TempDir("mb_" + std::to_string(static_cast<int>(GetParam())));
  WriteTinyModel(dir, GetParam(), /*tied=*/false);
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Batch b = MakeBatch((*m)->config().vocab_size, 4, 8);
  const double total = static_cast<double>(Model::CountTrainedTokens(b.targets));
  auto collect = [](std::map<std::string, at::Tensor>* into) {
    return [into](const std::string& name, const at::Tensor& g) {
      (*into)[name] = into->count(name) ? (*into)[name] + g : g;
    };
  };
  std::map<std::string, at::Tensor> full, halves;
  auto mb = (*m)->PrepareBatch(b.ids, b.targets, total);
  ASSERT_TRUE(mb.ok());
  at::Tensor loss_full = *(*m)->ForwardBackward(*mb, {}, collect(&full));
  at::Tensor loss_sum = at::zeros({});
  for (int h = 0; h < 2; ++h) {
    auto half = (*m)->PrepareBatch(b.ids.narrow(0, 2 * h, 2), b.targets.narrow(0, 2 * h, 2), total);
    ASSERT_TRUE(half.ok());
    loss_sum = loss_sum + *(*m)->ForwardBackward(*half, {}, collect(&halves));
  }
  EXPECT_TRUE(at::allclose(loss_sum, loss_full, 1e-5, 1e-6));
  for (const auto& [name, g] : full)
    EXPECT_TRUE(at::allclose(halves.at(name), g, 1e-4, 1e-6)) << name;

  // A loss scale passed to the head's Backward scales every gradient.
  std::vector<SavedState> saved((*m)->num_blocks());
  at::Tensor x;
  for (int i = 0; i < (*m)->num_blocks(); ++i) {
    x = *(*m)->block(i).Forward(*mb, x, SaveMode::kKeep, &saved[i]);
  }
  std::map<std::string, at::Tensor> scaled;
  at::Tensor g = at::full({}, 4.0);
  for (int i = (*m)->num_blocks() - 1; i >= 0; --i) {
    g = *(*m)->block(i).Backward(*mb, g, &saved[i], collect(&scaled));
  }
  for (const auto& [name, gf] : full)
    EXPECT_TRUE(at::allclose(scaled.at(name), 4 * gf, 1e-4, 1e-6)) << name;
  (void)RemoveTree(dir);
}

TEST_P(ModelTest, Bf16ComputeTracksFp32) {
  auto dir = TempDir("bf16_" + std::to_string(static_cast<int>(GetParam())));
  WriteTinyModel(dir, GetParam(), /*tied=*/true);
  auto m32 = Model::Load(dir);
  auto m16 = Model::Load(dir, {c10::kBFloat16, c10::Device(c10::kCPU)});
  ASSERT_TRUE(m32.ok() && m16.ok());
  Batch b = MakeBatch((*m32)->config().vocab_size);
  const double n = static_cast<double>(Model::CountTrainedTokens(b.targets));
  std::map<std::string, at::Tensor> g32, g16;
  auto l32 = (*m32)->ForwardBackward(
      *(*m32)->PrepareBatch(b.ids, b.targets, n), {},
      [&](const std::string& k, const at::Tensor& g) { g32[k] = g32.count(k) ? g32[k] + g : g; });
  auto l16 = (*m16)->ForwardBackward(*(*m16)->PrepareBatch(b.ids, b.targets, n), {},
                                     [&](const std::string& k, const at::Tensor& g) {
                                       EXPECT_EQ(g.scalar_type(), at::kBFloat16) << k;
                                       at::Tensor f = g.to(at::kFloat);
                                       g16[k] = g16.count(k) ? g16[k] + f : f;
                                     });
  ASSERT_TRUE(l32.ok() && l16.ok()) << l16.status().ToString();
  EXPECT_EQ(l16->scalar_type(), at::kFloat);
  EXPECT_NEAR(l16->item<double>(), l32->item<double>(), 2e-2 * l32->item<double>());
  // bf16 has 8 mantissa bits: relative error of whole gradient tensors within a few percent.
  for (const auto& [k, g] : g32) {
    const double rel = ((g16.at(k) - g).norm() / (g.norm() + 1e-12)).item<double>();
    EXPECT_LT(rel, 5e-2) << k;
  }
  (void)RemoveTree(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, ModelTest,
                         ::testing::Values(TinyArch::kLlama, TinyArch::kQwen2, TinyArch::kGpt2),
                         testing::TinyArchName);

TEST(Ops, ChunkedHeadLossMatchesOneShot) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  at::Tensor n = at::randn({3, 7, 16}, gen), w = at::randn({50, 16}, gen);
  at::Tensor t = at::randint(50, {3, 7}, gen, at::kLong);
  t.narrow(1, 0, 2).fill_(kIgnoreIndex);
  at::Tensor dn1, dw1, dn2, dw2;
  at::Tensor l1 = ops::LmHeadLoss(n, w, t, 15.0, &dn1, &dw1);
  at::Tensor l2 =
      ops::LmHeadLoss(n, w, t, 15.0, &dn2, &dw2, /*chunk_bytes=*/50 * 4 * 4);  // 4 tokens
  EXPECT_TRUE(at::allclose(l1, l2, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(dn1, dn2, 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(dw1, dw2, 1e-5, 1e-6));
  // Reference: full logits, log-softmax cross-entropy.
  at::Tensor logits = at::matmul(n, w.t()).reshape({-1, 50});
  at::Tensor tf = t.reshape({-1});
  at::Tensor mask = tf.ne(kIgnoreIndex);
  at::Tensor nll = -at::log_softmax(logits, -1).gather(1, tf.clamp_min(0).unsqueeze(1)).squeeze(1);
  EXPECT_NEAR(l2.item<double>(), (nll * mask).sum().item<double>() / 15.0, 1e-5);
}

TEST(ModelErrors, MisuseIsAnErrorNotACrash) {
  auto dir = TempDir("errors");
  WriteTinyModel(dir, TinyArch::kLlama, false);
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok());
  Batch b = MakeBatch(64);
  auto mb = *(*m)->PrepareBatch(b.ids, b.targets, 10);
  Block& layer = (*m)->block(1);
  SavedState s;
  GradCallback ignore = [](const std::string&, const at::Tensor&) {};
  at::Tensor x = *(*m)->block(0).Forward(mb, {}, SaveMode::kNone, nullptr);

  EXPECT_EQ(layer.Backward(mb, x, &s, ignore).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(layer.Forward(mb, x, SaveMode::kOffload, &s).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(layer.Forward(mb, x, SaveMode::kKeep, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(layer.Forward(mb, x.narrow(1, 0, 3), SaveMode::kKeep, &s).status().code(),
            StatusCode::kInvalidArgument);
  // Inference forward cannot be back-propagated.
  ASSERT_TRUE(layer.Forward(mb, x, SaveMode::kNone, &s).ok());
  EXPECT_EQ(layer.Backward(mb, x, &s, ignore).status().code(), StatusCode::kFailedPrecondition);
  // Head without targets.
  MicroBatch no_targets = *(*m)->PrepareBatch(b.ids, at::Tensor(), 0);
  EXPECT_EQ((*m)->block(3).Forward(no_targets, x, SaveMode::kKeep, &s).status().code(),
            StatusCode::kInvalidArgument);
  // A fetch that returns the wrong tensors.
  OffloadCallbacks bad;
  bad.offload = [](int, std::vector<at::Tensor>) -> StatusOr<uint64_t> { return 7; };
  bad.fetch = [](int, uint64_t) -> StatusOr<std::vector<at::Tensor>> {
    return std::vector<at::Tensor>{};
  };
  ASSERT_TRUE(layer.Forward(mb, x, SaveMode::kOffload, &s, &bad).ok());
  EXPECT_EQ(layer.Backward(mb, x, &s, ignore, &bad).status().code(), StatusCode::kDataLoss);
  // Offload failures propagate.
  bad.offload = [](int, std::vector<at::Tensor>) -> StatusOr<uint64_t> {
    return ResourceExhaustedError("full");
  };
  EXPECT_EQ(layer.Forward(mb, x, SaveMode::kOffload, &s, &bad).status().code(),
            StatusCode::kResourceExhausted);
  // A parameter in the wrong dtype, or streamed out, is named.
  ASSERT_TRUE(layer.To(c10::Device(c10::kCPU), c10::kBFloat16).ok());
  auto st = layer.Forward(mb, x, SaveMode::kKeep, &s);
  EXPECT_EQ(st.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.status().message().find("model.layers.0.input_layernorm.weight"), std::string::npos);
  ASSERT_TRUE(layer.To(c10::Device(c10::kCPU), c10::kFloat).ok());
  at::Tensor saved_w = layer.params()[2].value;
  layer.params()[2].value = at::Tensor();
  EXPECT_NE(layer.Forward(mb, x, SaveMode::kKeep, &s).status().message().find("not resident"),
            std::string::npos);
  layer.params()[2].value = saved_w;
  EXPECT_TRUE(layer.Forward(mb, x, SaveMode::kKeep, &s).ok());

  // Bad micro-batches.
  EXPECT_FALSE((*m)->PrepareBatch(b.ids.to(at::kInt), b.targets, 10).ok());
  EXPECT_FALSE((*m)->PrepareBatch(b.ids + 64, b.targets, 10).ok());
  EXPECT_FALSE((*m)->PrepareBatch(b.ids, b.targets, 0).ok());
  EXPECT_FALSE((*m)->PrepareBatch(b.ids, b.targets + 1000, 10).ok());
  EXPECT_FALSE((*m)->PrepareBatch(b.ids.flatten(), b.targets, 10).ok());
  (void)RemoveTree(dir);
}

TEST(ModelLoad, CheckpointProblemsAreNamed) {
  auto dir = TempDir("load");
  ModelConfig c = WriteTinyModel(dir, TinyArch::kLlama, false);
  auto tensors = *LoadTensorFile(JoinPath(dir, "model.safetensors"));
  auto rewrite = [&](std::map<std::string, at::Tensor> t) {
    std::vector<std::pair<std::string, at::Tensor>> v(t.begin(), t.end());
    ASSERT_TRUE(SaveTensorFile(JoinPath(dir, "model.safetensors"), v).ok());
  };
  auto expect = [&](const std::string& needle) {
    auto m = Model::Load(dir);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().ToString();
  };
  auto t = tensors;
  t["model.layers.1.mlp.up_proj.weight"] = at::zeros({47, 32});
  rewrite(t);
  expect("model.layers.1.mlp.up_proj.weight\" has shape [47, 32], config.json implies [48, 32]");
  t = tensors;
  t.erase("model.norm.weight");
  rewrite(t);
  expect("no tensor \"model.norm.weight\"");
  t = tensors;
  t["model.layers.0.extra.weight"] = at::zeros({2});
  rewrite(t);
  expect("model.layers.0.extra.weight\" is not a parameter");
  t = tensors;
  t["model.norm.weight"] = at::ones({32}, at::kLong);
  rewrite(t);
  expect("has dtype I64");
  // Half-precision checkpoints load and convert.
  t = tensors;
  for (auto& [k, v] : t) v = v.to(at::kHalf);
  rewrite(t);
  auto m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->block(1).params()[1].value.scalar_type(), at::kFloat);
  std::ofstream(JoinPath(dir, "model.safetensors"), std::ios::trunc) << "garbage!garbage!";
  expect("model.safetensors: invalid safetensors file");
  (void)RemoveTree(dir);
  (void)c;
}

// The set-up reads initial values in pieces on several threads, converted
// straight from the mapping: any slice equals that slice of the whole value, in every dtype.
TEST(ModelLoad, InitialValuesReadInSlicesEqualTheWholeValue) {
  auto dir = TempDir("slices");
  WriteTinyModel(dir, TinyArch::kLlama, false);
  auto tensors = *LoadTensorFile(JoinPath(dir, "model.safetensors"));
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    std::vector<std::pair<std::string, at::Tensor>> v;
    for (const auto& [k, t] : tensors) v.push_back({k, t.to(dtype)});
    ASSERT_TRUE(SaveTensorFile(JoinPath(dir, "model.safetensors"), v).ok());
    LoadOptions lo;
    lo.materialize = LoadOptions::Materialize::kLazy;
    auto m = Model::Load(dir, lo);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const std::string name = "model.layers.1.mlp.up_proj.weight";  // [48, 32]
    const at::Tensor whole = *(*m)->ReadInitialValue(name);
    EXPECT_TRUE(at::equal(whole, tensors[name].to(dtype).to(at::kFloat)));
    std::vector<float> out(whole.numel(), -1.0f);
    for (int64_t begin = 0; begin < whole.numel(); begin += 500) {  // uneven pieces
      const int64_t count = std::min<int64_t>(500, whole.numel() - begin);
      ASSERT_TRUE((*m)->ReadInitialValueInto(name, begin, count, out.data() + begin).ok());
    }
    EXPECT_TRUE(at::equal(at::from_blob(out.data(), whole.sizes(), at::kFloat), whole))
        << c10::toString(dtype);
    const Status past = (*m)->ReadInitialValueInto(name, whole.numel() - 1, 2, out.data());
    EXPECT_FALSE(past.ok());
    EXPECT_NE(past.message().find("outside its 1536"), std::string::npos) << past.ToString();
  }
  // A random initialisation is drawn whole (per-parameter generator): slices are refused.
  LoadOptions lo;
  lo.materialize = LoadOptions::Materialize::kRandom;
  auto r = Model::Load(dir, lo);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<float> out(1536);
  EXPECT_TRUE((*r)->ReadInitialValueInto("model.layers.1.mlp.up_proj.weight", 0, 1536, out.data()).ok());
  EXPECT_FALSE((*r)->ReadInitialValueInto("model.layers.1.mlp.up_proj.weight", 0, 100, out.data()).ok());
  (void)RemoveTree(dir);
}

TEST(ModelExport, RoundTripKeepsNamesDtypesAndBuffers) {
  for (TinyArch arch : {TinyArch::kGpt2, TinyArch::kQwen2}) {
    auto dir = TempDir("export_src");
    auto out = TempDir("export_out");
    WriteTinyModel(dir, arch, /*tied=*/true);
    std::ofstream(JoinPath(dir, "tokenizer.json")) << "{}";
    auto m = Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    for (int i = 0; i < (*m)->num_blocks(); ++i) {
      for (auto& p : (*m)->block(i).params()) p.value.add_(0.5);
    }
    ASSERT_TRUE((*m)->Export(out).ok());
    EXPECT_FALSE((*m)->Export(dir).ok());  // never overwrite the source
    EXPECT_TRUE(PathExists(JoinPath(out, "config.json")));
    EXPECT_TRUE(PathExists(JoinPath(out, "tokenizer.json")));
    auto src = *LoadTensorFile(JoinPath(dir, "model.safetensors"));
    auto dst = *LoadTensorFile(JoinPath(out, "model.safetensors"));
    ASSERT_EQ(src.size(), dst.size());
    for (const auto& [k, v] : src) {
      ASSERT_TRUE(dst.count(k)) << k;
      EXPECT_EQ(dst[k].scalar_type(), v.scalar_type());
      const bool buffer =
          k.find(".attn.bias") != std::string::npos && k.find("c_attn") == std::string::npos;
      EXPECT_TRUE(at::equal(dst[k], buffer ? v : v + 0.5)) << k;
    }
    EXPECT_FALSE(dst.count("lm_head.weight"));
    auto again = Model::Load(out);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    (void)RemoveTree(dir);
    (void)RemoveTree(out);
  }
}

}  // namespace
}  // namespace offloadd::engine
