// offloadd-optim-tool: drives the optimizer kernel (and, with `train`, a real WorkerPool) on raw
// little-endian tensor files, for the Python reference tests and the benchmarks.
//
//   offloadd-optim-tool paths
//   offloadd-optim-tool adamw --path=avx2 --n=N --grad=g.bin --grad-dtype=bf16|fp16|fp32
//       --master=p.bin --exp-avg=m.bin --exp-avg-sq=v.bin [--weights=w.bin
//       --weight-dtype=bf16|fp16]
//       --lr= --beta1= --beta2= --eps= --weight-decay= --step= [--grad-scale=]
//     (master/exp_avg/exp_avg_sq are updated in place; prints {"sq_norm": ...})
//   offloadd-optim-tool accumulate --path= --n= --grad= --grad-dtype= --acc=a.bin [--overwrite]
//   offloadd-optim-tool norm --path= --n= --grad= --grad-dtype=
//   offloadd-optim-tool compact --state-dtype=fp32|bf16|int8 --master-dtype=fp32|bf16 (and the
//       adamw flags; --master holds fp32, or the bf16 master with --master-comp beside it;
//       --exp-avg/--exp-avg-sq hold the states' dtype, int8 with --exp-avg-scale and
//       --exp-avg-sq-scale, one fp32 per 256; [--seed=]) : workers/adamw_compact.h, in place
//   offloadd-optim-tool train --spec=dir/spec.json  (see workers/tools/train.cc)
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "workers/adamw_compact.h"
#include "workers/adamw_kernel.h"
#include "workers/tools/train.h"

namespace offloadd::workers {
namespace {

using Flags = std::map<std::string, std::string>;

StatusOr<std::vector<uint8_t>> ReadFile(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open " + path);
  std::vector<uint8_t> data(bytes);
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(in.gcount()) != bytes) {
    return InvalidArgumentError(path + " holds fewer than the " + std::to_string(bytes) +
                                " bytes --n asks for");
  }
  return data;
}

Status WriteFile(const std::string& path, const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  return out ? OkStatus() : InternalError("cannot write " + path);
}

StatusOr<std::string> Need(const Flags& f, const std::string& key) {
  auto it = f.find(key);
  if (it == f.end()) return InvalidArgumentError("missing --" + key);
  return it->second;
}

StatusOr<double> NeedNumber(const Flags& f, const std::string& key) {
  ASSIGN_OR_RETURN(std::string s, Need(f, key));
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    return InvalidArgumentError("--" + key + "=" + s + " is not a number");
  }
}

StatusOr<GradDtype> ParseGradDtype(const std::string& s) {
  if (s == "bf16") return GradDtype::kBf16;
  if (s == "fp32") return GradDtype::kFp32;
  if (s == "fp16") return GradDtype::kFp16;
  return InvalidArgumentError("--grad-dtype must be bf16, fp16 or fp32, not '" + s + "'");
}

StatusOr<AdamWHyper> ReadHyper(const Flags& f) {
  AdamWHyper h;
  ASSIGN_OR_RETURN(h.lr, NeedNumber(f, "lr"));
  ASSIGN_OR_RETURN(h.beta1, NeedNumber(f, "beta1"));
  ASSIGN_OR_RETURN(h.beta2, NeedNumber(f, "beta2"));
  ASSIGN_OR_RETURN(h.eps, NeedNumber(f, "eps"));
  ASSIGN_OR_RETURN(h.weight_decay, NeedNumber(f, "weight-decay"));
  ASSIGN_OR_RETURN(double step, NeedNumber(f, "step"));
  h.step = static_cast<uint64_t>(step);
  if (f.count("grad-scale")) {
    ASSIGN_OR_RETURN(double gs, NeedNumber(f, "grad-scale"));
    h.grad_scale = static_cast<float>(gs);
  }
  RETURN_IF_ERROR(ValidateHyper(h));
  return h;
}

// The compact modes on files (the convergence study drives it step by step).
StatusOr<double> RunCompact(const Flags& f, KernelPath path, const void* grad, GradDtype grad_dtype,
                            size_t n) {
  ASSIGN_OR_RETURN(AdamWHyper h, ReadHyper(f));
  ASSIGN_OR_RETURN(OptimizerMode mode,
                   ParseOptimizerMode(f.count("state-dtype") ? f.at("state-dtype") : "",
                                      f.count("master-dtype") ? f.at("master-dtype") : ""));
  const size_t sb = mode.state == StateDtype::kFp32 ? 4 : mode.state == StateDtype::kBf16 ? 2 : 1;
  const size_t mb = mode.master == MasterDtype::kFp32 ? 4 : 2;
  std::vector<std::pair<std::string, size_t>> files = {
      {"master", n * mb}, {"exp-avg", n * sb}, {"exp-avg-sq", n * sb}};
  if (mode.master == MasterDtype::kBf16) files.push_back({"master-comp", n * 2});
  if (mode.state == StateDtype::kInt8) {
    files.push_back({"exp-avg-scale", Int8Blocks(n) * 4});
    files.push_back({"exp-avg-sq-scale", Int8Blocks(n) * 4});
  }
  std::map<std::string, std::vector<uint8_t>> data;
  for (const auto& [key, bytes] : files) {
    ASSIGN_OR_RETURN(std::string p, Need(f, key));
    ASSIGN_OR_RETURN(data[key], ReadFile(p, bytes));
  }
  const auto at = [&](const char* key) -> void* {
    auto it = data.find(key);
    return it == data.end() ? nullptr : it->second.data();
  };
  CompactSpan span;
  span.grad = grad;
  span.grad_dtype = grad_dtype;
  span.master = at("master");
  span.master_comp = static_cast<uint16_t*>(at("master-comp"));
  span.exp_avg = at("exp-avg");
  span.exp_avg_sq = at("exp-avg-sq");
  span.exp_avg_scale = static_cast<float*>(at("exp-avg-scale"));
  span.exp_avg_sq_scale = static_cast<float*>(at("exp-avg-sq-scale"));
  span.weight_dtype = WeightDtype::kNone;
  span.n = n;
  if (f.count("seed")) {
    ASSIGN_OR_RETURN(double seed, NeedNumber(f, "seed"));
    span.seed = static_cast<uint64_t>(seed);
  }
  ASSIGN_OR_RETURN(double sq, CompactAdamW(span, mode, h, path));
  for (const auto& [key, bytes] : files) RETURN_IF_ERROR(WriteFile(f.at(key), data[key]));
  return sq;
}

Status Run(const std::string& op, const Flags& f) {
  if (op == "paths") {
    nlohmann::json j = nlohmann::json::array();
    for (KernelPath p : SupportedPaths()) j.push_back(std::string(KernelPathName(p)));
    std::cout << j.dump() << "\n";
    return OkStatus();
  }
  if (op == "train") {
    ASSIGN_OR_RETURN(std::string spec, Need(f, "spec"));
    return RunTrainSpec(spec);
  }
  ASSIGN_OR_RETURN(KernelPath path, ParseKernelPath(f.count("path") ? f.at("path") : "auto"));
  ASSIGN_OR_RETURN(double n_d, NeedNumber(f, "n"));
  const size_t n = static_cast<size_t>(n_d);
  ASSIGN_OR_RETURN(std::string gdt, Need(f, "grad-dtype"));
  ASSIGN_OR_RETURN(GradDtype grad_dtype, ParseGradDtype(gdt));
  const size_t gbytes = n * GradBytes(grad_dtype);
  ASSIGN_OR_RETURN(std::string grad_path, Need(f, "grad"));
  ASSIGN_OR_RETURN(std::vector<uint8_t> grad, ReadFile(grad_path, gbytes));
  nlohmann::json out;
  if (op == "norm") {
    out["sq_norm"] = GradSquaredNorm(grad.data(), grad_dtype, n, path);
  } else if (op == "accumulate") {
    ASSIGN_OR_RETURN(std::string acc_path, Need(f, "acc"));
    ASSIGN_OR_RETURN(std::vector<uint8_t> acc, ReadFile(acc_path, n * 4));
    out["sq_norm"] = AccumulateGrad(reinterpret_cast<float*>(acc.data()), grad.data(), grad_dtype,
                                    n, f.count("overwrite") > 0, path);
    RETURN_IF_ERROR(WriteFile(acc_path, acc));
  } else if (op == "compact") {
    ASSIGN_OR_RETURN(out["sq_norm"], RunCompact(f, path, grad.data(), grad_dtype, n));
  } else if (op == "adamw") {
    ASSIGN_OR_RETURN(AdamWHyper h, ReadHyper(f));
    std::vector<std::vector<uint8_t>> state;
    std::vector<std::string> paths;
    for (const char* key : {"master", "exp-avg", "exp-avg-sq"}) {
      ASSIGN_OR_RETURN(std::string p, Need(f, key));
      ASSIGN_OR_RETURN(std::vector<uint8_t> data, ReadFile(p, n * 4));
      state.push_back(std::move(data));
      paths.push_back(p);
    }
    AdamWSpan span;
    span.grad = grad.data();
    span.grad_dtype = grad_dtype;
    span.master = reinterpret_cast<float*>(state[0].data());
    span.exp_avg = reinterpret_cast<float*>(state[1].data());
    span.exp_avg_sq = reinterpret_cast<float*>(state[2].data());
    span.n = n;
    std::vector<uint8_t> weights;
    span.weight_dtype = WeightDtype::kNone;
    if (f.count("weights")) {
      const std::string wdt = f.count("weight-dtype") ? f.at("weight-dtype") : "bf16";
      if (wdt != "bf16" && wdt != "fp16") return InvalidArgumentError("--weight-dtype bf16|fp16");
      span.weight_dtype = wdt == "bf16" ? WeightDtype::kBf16 : WeightDtype::kFp16;
      weights.resize(n * 2);
      span.weights = weights.data();
    }
    out["sq_norm"] = FusedAdamW(span, h, path);
    for (size_t i = 0; i < 3; ++i) RETURN_IF_ERROR(WriteFile(paths[i], state[i]));
    if (f.count("weights")) RETURN_IF_ERROR(WriteFile(f.at("weights"), weights));
  } else {
    return InvalidArgumentError("unknown command '" + op +
                                "' (paths, adamw, compact, accumulate, norm, train)");
  }
  out["path"] = std::string(KernelPathName(path));
  std::cout << out.dump() << "\n";
  return OkStatus();
}

}  // namespace
}  // namespace offloadd::workers

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr, "usage: offloadd-optim-tool paths|adamw|accumulate|norm|train [--key=value ...]\n");
    return 2;
  }
  offloadd::workers::Flags flags;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      std::fprintf(stderr, "unexpected argument '%s'\n", argv[i]);
      return 2;
    }
    const size_t eq = a.find('=');
    if (eq == std::string::npos) {
      flags[a.substr(2)] = "";
    } else {
      flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
    }
  }
  offloadd::Status st = offloadd::workers::Run(argv[1], flags);
  if (!st.ok()) {
    std::fprintf(stderr, "offloadd-optim-tool: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
