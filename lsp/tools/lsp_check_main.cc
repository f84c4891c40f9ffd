// offloadd-lsp-check: runs the LSP compressor and Adam in the subspace on given gradients and dumps
// what the Python tests compare against dense PyTorch (tests/python/lsp).
//
//   offloadd-lsp-check --in IN.safetensors --out OUT.safetensors [--rank S] [--nonzeros D]
//       [--seed N] [--identity] [--lr LR] [--beta1 B1] [--beta2 B2] [--eps E] [--weight-decay WD]
//       [--kernel auto|portable|avx2|avx512|avx512bf16]
//
// IN holds "w0" [m, n] and "grad/0", "grad/1", ... [m, n] (fp32 or bf16), one per step. The tool
// draws the projector pair (or the identity), and per step compresses the gradient (P^T G Q) and
// applies the CPU workers' fused AdamW kernel to the subspace coordinates A (from zero). OUT
// receives "p_index", "p_values", "q_index", "q_values" ([rows, d]), "compressed/<k>", "a", "exp_avg",
// "exp_avg_sq" and "w" = w0 + P A Q^T.
#include <ATen/ATen.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "engine/tensor_io.h"
#include "engine/torch_boundary.h"
#include "lsp/projector.h"
#include "workers/adamw_kernel.h"

namespace offloadd::lsp {
namespace {

struct Args {
  std::string in, out, kernel = "auto";
  int64_t rank = 512, nonzeros = 16;
  uint64_t seed = 0;
  bool identity = false;
  workers::AdamWHyper hyper;
};

Status Run(const Args& a) {
  ASSIGN_OR_RETURN(auto in, engine::LoadTensorFile(a.in));
  auto w0_it = in.find("w0");
  if (w0_it == in.end() || w0_it->second.dim() != 2) return InvalidArgumentError(a.in + ": no 2-D \"w0\"");
  const at::Tensor w0 = w0_it->second.to(at::kFloat);
  const int64_t m = w0.size(0), n = w0.size(1);
  const at::Device cpu(at::kCPU);
  const ProjectorPair pq = a.identity ? ProjectorPair::Identity(m, n, cpu)
                                      : ProjectorPair::Random(m, n, a.rank, a.nonzeros, a.seed, cpu);
  ASSIGN_OR_RETURN(const workers::KernelChoice kernel, workers::ResolveKernelPath(a.kernel));
  const int64_t sm = pq.rank_rows(), sn = pq.rank_cols();
  at::Tensor coords = at::zeros({sm, sn}), exp_avg = at::zeros({sm, sn}), exp_avg_sq = at::zeros({sm, sn});
  std::map<std::string, at::Tensor> out;
  workers::AdamWHyper h = a.hyper;
  for (uint64_t k = 0;; ++k) {
    auto g = in.find("grad/" + std::to_string(k));
    if (g == in.end()) break;
    if (g->second.sizes() != w0.sizes()) return InvalidArgumentError("grad/" + std::to_string(k) + " is not [m, n]");
    const at::Tensor c = pq.Compress(g->second).contiguous();
    out["compressed/" + std::to_string(k)] = c;
    h.step = k + 1;
    RETURN_IF_ERROR(workers::ValidateHyper(h));
    workers::AdamWSpan span;
    span.grad = c.data_ptr();
    span.grad_dtype = workers::GradDtype::kFp32;
    span.master = coords.data_ptr<float>();
    span.exp_avg = exp_avg.data_ptr<float>();
    span.exp_avg_sq = exp_avg_sq.data_ptr<float>();
    span.weight_dtype = workers::WeightDtype::kNone;
    span.n = static_cast<size_t>(sm * sn);
    workers::FusedAdamW(span, h, kernel.path);
  }
  out["p_index"] = pq.p().index().contiguous();
  out["p_values"] = pq.p().values().contiguous();
  out["q_index"] = pq.q().index().contiguous();
  out["q_values"] = pq.q().values().contiguous();
  out["a"] = coords;
  out["exp_avg"] = exp_avg;
  out["exp_avg_sq"] = exp_avg_sq;
  out["w"] = w0 + pq.Decompress(coords);
  return engine::SaveTensorFile(a.out, {out.begin(), out.end()});
}

}  // namespace
}  // namespace offloadd::lsp

int main(int argc, char** argv) {
  offloadd::lsp::Args a;
  CLI::App app{"offloadd-lsp-check: LSP compression and subspace AdamW on given gradients"};
  app.add_option("--in", a.in, "safetensors with w0 and grad/<k>")->required();
  app.add_option("--out", a.out, "safetensors to write")->required();
  app.add_option("--rank", a.rank, "subspace size s")->check(CLI::PositiveNumber);
  app.add_option("--nonzeros", a.nonzeros, "nonzeros per projector row d")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "projector seed");
  app.add_flag("--identity", a.identity, "identity projectors (s = the full dimensions)");
  app.add_option("--lr", a.hyper.lr);
  app.add_option("--beta1", a.hyper.beta1);
  app.add_option("--beta2", a.hyper.beta2);
  app.add_option("--eps", a.hyper.eps);
  app.add_option("--weight-decay", a.hyper.weight_decay);
  app.add_option("--kernel", a.kernel, "AdamW kernel path");
  CLI11_PARSE(app, argc, argv);
  const offloadd::Status st =
      offloadd::engine::RunTorch("LSP check", [&] { return offloadd::lsp::Run(a); });
  if (!st.ok()) {
    std::fprintf(stderr, "offloadd-lsp-check: %s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
