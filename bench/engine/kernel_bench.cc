// offloadd-engine-kernel-bench: each fused CUDA kernel of engine/cuda/ against the ATen op
// sequence it replaces (engine/ops with OFFLOADD_FUSED_KERNELS forced to fused, then aten), on
// the family benchmark shapes: batch 16 x seq 1024 tokens of a Qwen3-8B (hidden 4096, 32/8
// heads of 128, ffn 12288), a Gemma-3-4B (hidden 2560, 8/4 heads of 256, ffn 10240) and an
// OLMo-2-7B (hidden 4096, q/k norm over the whole 4096-wide projection) layer. Prints a
// markdown table: mean ms per call over --iters after --warmup, and the fused kernel's minimal
// memory traffic per second.
//
//   offloadd-engine-kernel-bench [--device cuda|cpu] [--tokens 16384] [--iters 20] [--warmup 3]
//       [--filter substring]
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#if OFFLOADD_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "engine/ops.h"

namespace offloadd::engine {
namespace {

using ops::RmsScale;

void Sync(const c10::Device& d) {
#if OFFLOADD_WITH_CUDA
  if (d.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)d;
}

struct Case {
  std::string name;   // what runs, e.g. "RMSNorm bwd+res (Gemma 1+w)"
  std::string shape;  // e.g. "[16384, 2560]"
  double bytes;       // the fused kernel's minimal traffic: each input read and output written once
  std::function<void()> run;
};

double TimeMs(const c10::Device& device, const std::function<void()>& f, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) f();
  Sync(device);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  Sync(device);
  return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
         iters;
}

std::string Shape(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Forward, re-apply from rstd, backward (with the residual add when `residual`) of one norm.
void AddNorm(std::vector<Case>* cases, const std::string& what, RmsScale scale,
             const std::vector<int64_t>& shape, const c10::Device& device, bool residual) {
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const int64_t h = shape.back();
  auto x = std::make_shared<at::Tensor>(at::randn(shape, opts));
  auto w = std::make_shared<at::Tensor>(at::randn({h}, opts) * 0.1 + 1);
  auto dy = std::make_shared<at::Tensor>(at::randn(shape, opts));
  auto res = std::make_shared<at::Tensor>(residual ? at::randn(shape, opts) : at::Tensor());
  auto rstd = std::make_shared<at::Tensor>();
  ops::RmsNorm(*x, *w, 1e-6, rstd.get(), scale);
  const double tensor_bytes = static_cast<double>(x->numel()) * 2;
  const double rstd_bytes = static_cast<double>(x->numel() / h) * 4;
  cases->push_back({what + " fwd", Shape(*x), 2 * tensor_bytes + rstd_bytes, [=] {
                      at::Tensor r;
                      ops::RmsNorm(*x, *w, 1e-6, &r, scale);
                    }});
  cases->push_back({what + " from rstd", Shape(*x), 2 * tensor_bytes + rstd_bytes,
                    [=] { ops::RmsNormFromRstd(*x, *w, *rstd, scale); }});
  cases->push_back({what + (residual ? " bwd+res" : " bwd"), Shape(*x),
                    (residual ? 4 : 3) * tensor_bytes + rstd_bytes, [=] {
                      at::Tensor dw;
                      ops::RmsNormBackward(*dy, *x, *w, *rstd, &dw, *res, scale);
                    }});
}

void AddGlu(std::vector<Case>* cases, const std::string& what, bool gelu, int64_t tokens,
            int64_t ffn, const c10::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(device);
  auto g = std::make_shared<at::Tensor>(at::randn({tokens, ffn}, opts));
  auto u = std::make_shared<at::Tensor>(at::randn({tokens, ffn}, opts));
  auto da = std::make_shared<at::Tensor>(at::randn({tokens, ffn}, opts));
  const double tb = static_cast<double>(g->numel()) * 2;
  cases->push_back({what + " fwd", Shape(*g), 3 * tb, [=] {
                      if (gelu) {
                        ops::GeGluTanh(*g, *u);
                      } else {
                        ops::SwiGlu(*g, *u);
                      }
                    }});
  cases->push_back({what + " bwd (+ product)", Shape(*g), 6 * tb, [=] {
                      at::Tensor dg, du, a;
                      if (gelu) {
                        ops::GeGluTanhBackward(*da, *g, *u, &dg, &du, &a);
                      } else {
                        ops::SwiGluBackward(*da, *g, *u, &dg, &du, &a);
                      }
                    }});
}

int Main(int argc, char** argv) {
  std::string device_name = "cuda", filter;
  int64_t tokens = 16 * 1024;
  int iters = 20, warmup = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device") {
      device_name = v;
    } else if (k == "--tokens") {
      tokens = std::stoll(v);
    } else if (k == "--iters") {
      iters = std::stoi(v);
    } else if (k == "--warmup") {
      warmup = std::stoi(v);
    } else if (k == "--filter") {
      filter = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  const c10::Device device(device_name == "cuda" ? c10::kCUDA : c10::kCPU);
  if (device.is_cuda() && !at::hasCUDA()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::vector<Case> cases;
  // Qwen3-8B: decoder norms (Llama rounding), per-head q/k norm, SwiGLU.
  AddNorm(&cases, "RMSNorm w (Qwen3 hidden)", RmsScale::kCastThenScale, {tokens, 4096}, device,
          true);
  AddNorm(&cases, "q norm per head (Qwen3)", RmsScale::kCastThenScale, {tokens, 32, 128}, device,
          false);
  AddNorm(&cases, "k norm per head (Qwen3)", RmsScale::kCastThenScale, {tokens, 8, 128}, device,
          false);
  AddGlu(&cases, "SwiGLU (Qwen3)", false, tokens, 12288, device);
  // Gemma-3-4B: (1 + w) norms (sandwich: two per sublayer), per-head q/k norm of 256, GeGLU.
  AddNorm(&cases, "RMSNorm 1+w (Gemma3 hidden)", RmsScale::kOneOffset, {tokens, 2560}, device,
          true);
  AddNorm(&cases, "q norm 1+w per head (Gemma3)", RmsScale::kOneOffset, {tokens, 8, 256}, device,
          false);
  AddGlu(&cases, "GeGLU tanh (Gemma3)", true, tokens, 10240, device);
  // OLMo-2-7B: norms scaled before the cast, q/k norm over the whole projection.
  AddNorm(&cases, "RMSNorm fp32 w (OLMo2 hidden)", RmsScale::kScaleThenCast, {tokens, 4096},
          device, true);
  AddNorm(&cases, "q norm whole proj (OLMo2)", RmsScale::kScaleThenCast, {tokens, 4096}, device,
          false);

  std::printf("# fused kernels vs ATen op sequences: %ld tokens, bf16, %s, %d iters after %d "
              "warmup\n",
              static_cast<long>(tokens), device.is_cuda() ? "cuda" : "cpu", iters, warmup);
  std::printf("| op | shape | ATen ms | fused ms | speedup | fused GB/s |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  for (const Case& c : cases) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    ops::SetFusedKernels("aten");
    const double aten_ms = TimeMs(device, c.run, warmup, iters);
    double fused_ms = 0;
    if (device.is_cuda()) {
      ops::SetFusedKernels("fused");
      fused_ms = TimeMs(device, c.run, warmup, iters);
    }
    ops::SetFusedKernels("auto");
    if (fused_ms > 0) {
      std::printf("| %s | %s | %.3f | %.3f | %.2fx | %.0f |\n", c.name.c_str(), c.shape.c_str(),
                  aten_ms, fused_ms, aten_ms / fused_ms, c.bytes / (fused_ms * 1e-3) / 1e9);
    } else {
      std::printf("| %s | %s | %.3f | — | — | — |\n", c.name.c_str(), c.shape.c_str(),
                  aten_ms);
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace offloadd::engine

int main(int argc, char** argv) {
  try {
    return offloadd::engine::Main(argc, argv);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s\n", e.what_without_backtrace());
    return 1;
  }
}
