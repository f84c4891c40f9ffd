// offloadd-engine-layer-bench: forward + backward time of one Llama decoder layer block driven
// through the engine's block API (random weights, no checkpoint). Prints one JSON object per
// (batch, mode) on stdout; bench/engine/bench_layer.py runs it next to transformers and prints
// the comparison table.
//
//   offloadd-engine-layer-bench [--device cuda|cpu] [--dtype bf16|f32] [--hidden 4096]
//       [--heads 32] [--kv-heads 32] [--intermediate 11008] [--seq 1024] [--batches 1,2,4,8,16]
//       [--iters 10] [--warmup 3] [--modes keep,recompute] [--docs 1]
// --docs N packs each row as N documents of equal length (segment ids, positions restarting per
// document): attention within documents (engine/doc_attention.h). On CUDA each row also reports
// the allocator's peak over the timed steps (peak_gib, the layer's weights and inputs included).
// --experts E (> 0) makes the feed-forward a mixture of experts (Qwen3-MoE's: a router, top
// --top-k of E SwiGLU experts of --expert-ff, renormalised with --norm-topk 1, experts packed
// [E, 2I, H] as the trainer's flat buffers view them); --head-dim sets the attention head size.
// OFFLOADD_EXPERT_GEMM picks the expert GEMMs (bench/engine/moe_layer_bench.py runs both).
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#if OFFLOADD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "engine/blocks.h"
#include "engine/model.h"
#include "engine/ops.h"

namespace offloadd::engine {
namespace {

struct Args {
  std::string device = "cuda", dtype = "bf16";
  int64_t hidden = 4096, heads = 32, kv_heads = 32, intermediate = 11008, seq = 1024;
  std::vector<int64_t> batches = {1, 2, 4, 8, 16};
  std::vector<std::string> modes = {"keep", "recompute"};
  int iters = 10, warmup = 3;
  int64_t docs = 1;
  int64_t experts = 0, top_k = 8, expert_ff = 768, head_dim = 0;
  bool norm_topk = true;
};

template <typename T>
std::vector<T> Split(const std::string& s, T (*conv)(const std::string&)) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(conv(item));
  return out;
}

void Sync(const c10::Device& d) {
#if OFFLOADD_WITH_CUDA
  if (d.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)d;
}

// The flags of the header comment; false (after a message) on an unknown one.
bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--device")
      a->device = v;
    else if (k == "--dtype")
      a->dtype = v;
    else if (k == "--hidden")
      a->hidden = std::stoll(v);
    else if (k == "--heads")
      a->heads = std::stoll(v);
    else if (k == "--kv-heads")
      a->kv_heads = std::stoll(v);
    else if (k == "--intermediate")
      a->intermediate = std::stoll(v);
    else if (k == "--seq")
      a->seq = std::stoll(v);
    else if (k == "--iters")
      a->iters = std::stoi(v);
    else if (k == "--warmup")
      a->warmup = std::stoi(v);
    else if (k == "--docs")
      a->docs = std::stoll(v);
    else if (k == "--experts")
      a->experts = std::stoll(v);
    else if (k == "--top-k")
      a->top_k = std::stoll(v);
    else if (k == "--expert-ff")
      a->expert_ff = std::stoll(v);
    else if (k == "--head-dim")
      a->head_dim = std::stoll(v);
    else if (k == "--norm-topk")
      a->norm_topk = v == "1";
    else if (k == "--batches")
      a->batches = Split<int64_t>(v, [](const std::string& x) -> int64_t { return std::stoll(x); });
    else if (k == "--modes")
      a->modes = Split<std::string>(v, [](const std::string& x) { return x; });
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return false;
    }
  }
  return true;
}

int Main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) return 2;
  const c10::Device device(a.device == "cuda" ? c10::kCUDA : c10::kCPU);
  const c10::ScalarType dtype = a.dtype == "bf16" ? c10::kBFloat16 : c10::kFloat;
  if (device.is_cuda() && !at::hasCUDA()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }

  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 32000;
  c.hidden_size = a.hidden;
  c.intermediate_size = a.intermediate;
  c.num_layers = 1;
  c.num_heads = a.heads;
  c.num_kv_heads = a.kv_heads;
  c.head_dim = a.head_dim > 0 ? a.head_dim : a.hidden / a.heads;
  if (a.experts > 0) {
    c.model_type = "qwen3_moe";
    c.moe.num_experts = a.experts;
    c.moe.top_k = a.top_k;
    c.moe.intermediate_size = a.expert_ff;
    c.moe.norm_topk_prob = a.norm_topk;
    c.moe.sparse = {true};
    c.moe.packed = true;
  }
  c.max_position_embeddings = std::max<int64_t>(4096, a.seq);
  c.norm_eps = 1e-5;
  c.hidden_act = "silu";
  ParamLoader load = [&](const std::string& name,
                         const std::vector<int64_t>& shape) -> StatusOr<at::Tensor> {
    // Small embedding/head: they are built but not timed.
    std::vector<int64_t> s = shape;
    if (name.find("embed") != std::string::npos || name.find("lm_head") != std::string::npos)
      s[0] = 8;
    auto opts = at::TensorOptions().dtype(dtype).device(device);
    return name.find("norm") != std::string::npos ? at::ones(s, opts) : at::randn(s, opts) * 0.02;
  };
  auto built = BuildDecoderLayer(c, 0, load);
  if (!built.ok()) {
    std::fprintf(stderr, "%s\n", built.status().ToString().c_str());
    return 1;
  }
  Block& layer = **built;
  GradCallback sink = [](const std::string&, const at::Tensor&) {};

  for (int64_t b : a.batches) {
    MicroBatch mb;
    mb.input_ids = at::zeros({b, a.seq}, at::TensorOptions().dtype(at::kLong).device(device));
    mb.position_ids = at::arange(a.seq, mb.input_ids.options()).unsqueeze(0).expand({b, a.seq});
    if (a.docs > 1) {
      const int64_t len = (a.seq + a.docs - 1) / a.docs;
      at::Tensor pos = at::arange(a.seq, mb.input_ids.options());
      mb.segment_ids = at::floor_divide(pos, len).unsqueeze(0).expand({b, a.seq}).contiguous();
      mb.position_ids = at::remainder(pos, len).unsqueeze(0).expand({b, a.seq});
      mb.docs = ops::DocumentsOf(mb.segment_ids, device);
    }
    ops::RopeTables(c.rope, c.head_dim, mb.position_ids, dtype, &mb.rope_cos, &mb.rope_sin);
    at::Tensor x = at::randn({b, a.seq, a.hidden}, at::TensorOptions().dtype(dtype).device(device));
    at::Tensor dy = at::randn_like(x) * 1e-3;
    for (const std::string& mode_name : a.modes) {
      const SaveMode mode = mode_name == "recompute" ? SaveMode::kRecompute : SaveMode::kKeep;
      auto step = [&](double* fwd_s, double* bwd_s) -> bool {
        SavedState saved;
        auto t0 = std::chrono::steady_clock::now();
        auto y = layer.Forward(mb, x, mode, &saved);
        Sync(device);
        auto t1 = std::chrono::steady_clock::now();
        if (!y.ok()) {
          std::fprintf(stderr, "%s\n", y.status().ToString().c_str());
          return false;
        }
        auto dx = layer.Backward(mb, dy, &saved, sink);
        Sync(device);
        auto t2 = std::chrono::steady_clock::now();
        if (!dx.ok()) {
          std::fprintf(stderr, "%s\n", dx.status().ToString().c_str());
          return false;
        }
        *fwd_s += std::chrono::duration<double>(t1 - t0).count();
        *bwd_s += std::chrono::duration<double>(t2 - t1).count();
        return true;
      };
      double f = 0, bw = 0;
      double peak_gib = 0;
      try {
        for (int i = 0; i < a.warmup; ++i) {
          if (!step(&f, &bw)) return 1;
        }
        f = bw = 0;
#if OFFLOADD_WITH_CUDA
        if (device.is_cuda())
          c10::cuda::CUDACachingAllocator::resetPeakStats(device.index() < 0 ? 0 : device.index());
#endif
        for (int i = 0; i < a.iters; ++i) {
          if (!step(&f, &bw)) return 1;
        }
#if OFFLOADD_WITH_CUDA
        if (device.is_cuda()) {
          const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
              device.index() < 0 ? 0 : device.index());
          peak_gib = static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 30);
        }
#endif
      } catch (const c10::Error& e) {
        std::printf("{\"impl\":\"offloadd\",\"mode\":\"%s\",\"batch\":%ld,\"error\":\"%s\"}\n",
                    mode_name.c_str(), static_cast<long>(b), "torch error (out of memory?)");
        std::fprintf(stderr, "%s\n", e.what_without_backtrace());
        continue;
      }
      const double fwd_ms = 1e3 * f / a.iters, bwd_ms = 1e3 * bw / a.iters;
      std::printf(
          "{\"impl\":\"offloadd\",\"mode\":\"%s\",\"batch\":%ld,\"seq\":%ld,\"docs\":%ld,"
          "\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"total_ms\":%.4f,\"tokens_per_s\":%.1f,"
          "\"peak_gib\":%.3f}\n",
          mode_name.c_str(), static_cast<long>(b), static_cast<long>(a.seq),
          static_cast<long>(a.docs), fwd_ms, bwd_ms, fwd_ms + bwd_ms,
          static_cast<double>(b * a.seq) / ((f + bw) / a.iters), peak_gib);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace offloadd::engine

int main(int argc, char** argv) { return offloadd::engine::Main(argc, argv); }
