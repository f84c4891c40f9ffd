#pragma once
// What tests/trainer/state/checkpoint_test.cc and checkpoint_kill_test.cc share: a fake three-layer
// model with its fp32 state, saving it as the trainer does, and the fixture's output directory.
#include "trainer/state/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file.h"
#include "common/safe_path.h"
#include "engine/safetensors.h"
#include "trainer/state/export_files.h"

namespace offloadd::trainer {
namespace {

using ::testing::HasSubstr;

// A three-layer model (embedding, one decoder layer, head) with its fp32 state in flat buffers, the
// way the pipeline holds it. `scale` multiplies the layer sizes (the crash tests want bigger
// files).
struct FakeModel {
  std::vector<std::vector<ParamSpec>> params;
  std::vector<std::vector<float>> master, exp_avg, exp_avg_sq;

  FakeModel(uint32_t seed, int64_t scale = 1) {
    params = {{{"model.embed_tokens.weight", {16 * scale, 8}}},
              {{"model.layers.0.input_layernorm.weight", {8}},
               {"model.layers.0.mlp.up_proj.weight", {12 * scale, 8}},
               {"model.layers.0.self_attn.q_proj.bias", {0}}},
              {{"model.norm.weight", {8}}, {"lm_head.weight", {16 * scale, 8}}}};
    uint32_t x = seed * 2654435761u + 1;
    auto fill = [&x](std::vector<float>& v, int64_t n) {
      v.resize(n);
      for (float& f : v) {
        x = x * 1664525u + 1013904223u;
        std::memcpy(&f, &x, sizeof(f));  // any bit pattern: NaNs, infinities, denormals, -0
      }
    };
    for (const auto& p : params) {
      const int64_t n = NumElements(p);
      fill(master.emplace_back(), n);
      fill(exp_avg.emplace_back(), n);
      fill(exp_avg_sq.emplace_back(), n);
    }
  }
  int layers() const { return static_cast<int>(params.size()); }
  std::string fingerprint() const { return ModelFingerprint("llama", params); }

  LayerState State(int l) const {
    const std::vector<float>& w = master[l];
    // The master buffer in two pieces, as when a layer is split into shards.
    const size_t half = w.size() / 2;
    return {params[l],
            {std::span<const float>(w.data(), half),
             std::span<const float>(w.data() + half, w.size() - half)},
            {exp_avg[l]},
            {exp_avg_sq[l]},
            /*adam_step=*/100 + l};
  }
};

inline TrainerState MakeState(int64_t step, const FakeModel& m) {
  TrainerState s;
  s.global_step = step;
  s.max_steps = 1000;
  s.epoch = 0.1 * static_cast<double>(step) / 3;
  s.num_input_tokens_seen = step * 4096;
  s.seed = std::numeric_limits<uint64_t>::max();
  s.rng_state = std::string("mt19937 \"state\"\n\t\\ 42") + std::string(1, '\0') + "end";
  s.data_cursor = R"({"epoch":0,"index":17,"seed":42})";
  s.scheduler = {"cosine", 2e-5, 10, 1000};
  s.model_fingerprint = m.fingerprint();
  for (int64_t k = 1; k <= step; ++k) {
    s.log_history.push_back({k, 0.01 * k, 1.0 / 3 + k, 1e-5 * k, std::sqrt(2.0) * k});
  }
  if (!s.log_history.empty()) s.log_history.back().loss = std::numeric_limits<double>::quiet_NaN();
  if (s.log_history.size() > 1)
    s.log_history[0].grad_norm = -std::numeric_limits<double>::infinity();
  if (step % 2 == 1) s.grad_scaler = GradScalerState{.scale = 0x1p-3f, .growth_tracker = step};
  if (step % 2 == 1) s.auto_batch = TrainerState::BatchShape{.micro = 16, .accumulation = step};
  return s;
}

inline StatusOr<CheckpointInfo> Save(const std::string& out, int64_t step, const FakeModel& m) {
  ASSIGN_OR_RETURN(CheckpointWriter w, CheckpointWriter::Begin(out, step));
  for (int l = m.layers() - 1; l >= 0; --l) RETURN_IF_ERROR(w.WriteLayer(l, m.State(l)));
  return w.Commit(MakeState(step, m));
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline bool SameDouble(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Reads every layer of `dir` and compares with `m` bit for bit.
inline void ExpectHolds(const std::string& dir, const FakeModel& m) {
  auto r = CheckpointReader::Open(dir, m.fingerprint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->num_layers(), m.layers());
  for (int l = 0; l < m.layers(); ++l) {
    std::vector<float> w(m.master[l].size()), a(w.size()), v(w.size());
    auto step = r->ReadLayer(l, {m.params[l], {w}, {a}, {v}});
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, 100 + l);
    EXPECT_TRUE(SameBits(w, m.master[l])) << dir << " layer " << l;
    EXPECT_TRUE(SameBits(a, m.exp_avg[l])) << dir << " layer " << l;
    EXPECT_TRUE(SameBits(v, m.exp_avg_sq[l])) << dir << " layer " << l;
  }
}

inline std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::string n = e->d_name; n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd-checkpoint-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    out_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(out_).ok()); }
  std::string Dir(int64_t step) const {
    return JoinPath(out_, "checkpoint-" + std::to_string(step));
  }

  std::string out_;
};

}  // namespace
}  // namespace offloadd::trainer
