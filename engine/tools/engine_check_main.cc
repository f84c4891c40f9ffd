// offloadd-engine-check: drives the block API on a model directory and dumps what the Python
// parity tests compare against transformers.
//
//   offloadd-engine-check --model DIR --inputs IN.safetensors --out OUT.safetensors
//       [--mode keep|recompute|offload|mixed] [--device cpu|cuda] [--dtype f32|bf16|fp16]
//       [--micro-batches N] [--loss-scale S] [--sgd-lr LR --export DIR]
//   offloadd-engine-check --model DIR --generate N --prompt 1,2,3 [--stop 2] --out OUT.safetensors
//
// IN holds "input_ids" [B, T] int64 and optionally "labels" [B, T] (HF convention: aligned with
// input_ids, -100 = ignored; shifted here), "position_ids" and "segment_ids" (packing). OUT
// receives "logits" [B, T, V] fp32, "loss" (sum over micro-batches, each normalised by the step's
// trained-token count) and "grad/<param>" fp32 (summed over micro-batches and tied uses). With
// --sgd-lr the parameters are updated p -= lr * grad, "logits_after" is dumped and the model
// exported to --export. Micro-batches split the batch dimension. "mixed" cycles
// keep/recompute/offload over blocks; offload copies the saved tensors to CPU and back (and drops
// the originals). The kernels each layer's parts run (Model::DescribeKernels) go to stderr.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/tensor_io.h"
#include "engine/torch_boundary.h"

namespace offloadd::engine {
namespace {

struct Args {
  std::string model, inputs, out, mode = "keep", device = "cpu", dtype = "f32", export_dir;
  int micro_batches = 1;
  double sgd_lr = 0;
  double loss_scale = 1;  // fp16: the head's gradients are of loss * S; dumped grads are / S
  int64_t generate = 0;
  std::vector<int64_t> prompt, stop;
};

std::vector<int64_t> ParseIds(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) ids.push_back(std::stoll(item));
  }
  return ids;
}

StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return InvalidArgumentError("missing value for " + k);
    std::string v = argv[++i];
    try {
      if (k == "--model")
        a.model = v;
      else if (k == "--inputs")
        a.inputs = v;
      else if (k == "--out")
        a.out = v;
      else if (k == "--mode")
        a.mode = v;
      else if (k == "--device")
        a.device = v;
      else if (k == "--dtype")
        a.dtype = v;
      else if (k == "--micro-batches")
        a.micro_batches = std::stoi(v);
      else if (k == "--sgd-lr")
        a.sgd_lr = std::stod(v);
      else if (k == "--loss-scale")
        a.loss_scale = std::stod(v);
      else if (k == "--export")
        a.export_dir = v;
      else if (k == "--generate")
        a.generate = std::stoll(v);
      else if (k == "--prompt")
        a.prompt = ParseIds(v);
      else if (k == "--stop")
        a.stop = ParseIds(v);
      else
        return InvalidArgumentError("unknown flag " + k);
    } catch (const std::exception&) {
      return InvalidArgumentError("bad value for " + k + ": " + v);
    }
  }
  if (a.model.empty() || a.out.empty())
    return InvalidArgumentError("--model and --out are required");
  if (a.generate == 0 && a.inputs.empty()) return InvalidArgumentError("--inputs is required");
  if (a.micro_batches < 1) return InvalidArgumentError("--micro-batches must be >= 1");
  return a;
}

StatusOr<std::vector<SaveMode>> Modes(const std::string& mode, int n) {
  std::vector<SaveMode> modes(n);
  const SaveMode cycle[] = {SaveMode::kKeep, SaveMode::kRecompute, SaveMode::kOffload};
  for (int i = 0; i < n; ++i) {
    if (mode == "keep")
      modes[i] = SaveMode::kKeep;
    else if (mode == "recompute")
      modes[i] = SaveMode::kRecompute;
    else if (mode == "offload")
      modes[i] = SaveMode::kOffload;
    else if (mode == "mixed")
      modes[i] = cycle[i % 3];
    else
      return InvalidArgumentError("unknown --mode " + mode);
  }
  return modes;
}

Status Run(const Args& a) {
  const c10::Device device(a.device == "cuda" ? c10::kCUDA : c10::kCPU);
  if (a.device != "cpu" && a.device != "cuda") return InvalidArgumentError("--device cpu|cuda");
  if (a.dtype != "f32" && a.dtype != "bf16" && a.dtype != "fp16")
    return InvalidArgumentError("--dtype f32|bf16|fp16");
  const c10::ScalarType dtype = a.dtype == "bf16"   ? c10::kBFloat16
                                : a.dtype == "fp16" ? c10::kHalf
                                                    : c10::kFloat;
  ASSIGN_OR_RETURN(auto model, Model::Load(a.model, {dtype, device}));
  std::vector<std::pair<std::string, at::Tensor>> out;

  if (a.generate > 0) {
    ASSIGN_OR_RETURN(auto ids, model->GenerateGreedy(a.prompt, a.generate, a.stop));
    out.push_back({"generated", at::tensor(ids, at::kLong)});
    return SaveTensorFile(a.out, out);
  }

  ASSIGN_OR_RETURN(auto in, LoadTensorFile(a.inputs));
  if (!in.count("input_ids")) return InvalidArgumentError(a.inputs + ": no input_ids tensor");
  const at::Tensor ids = in["input_ids"];
  const at::Tensor labels = in.count("labels") ? in["labels"] : ids;
  const at::Tensor positions = in.count("position_ids") ? in["position_ids"] : at::Tensor();
  const at::Tensor segments = in.count("segment_ids") ? in["segment_ids"] : at::Tensor();
  for (const std::string& line : model->DescribeKernels(device, dtype, ids.size(-1))) {
    std::fprintf(stderr, "offloadd-engine-check: kernels: %s\n", line.c_str());
  }
  const at::Tensor targets = Model::ShiftLabels(labels);
  const double total = static_cast<double>(Model::CountTrainedTokens(targets));
  ASSIGN_OR_RETURN(auto modes, Modes(a.mode, model->num_blocks()));

  // Offload "store": pageable CPU copies keyed by ticket; the device originals are dropped.
  std::map<uint64_t, std::vector<at::Tensor>> store;
  uint64_t next_ticket = 1;
  OffloadCallbacks offload;
  offload.offload = [&](int, std::vector<at::Tensor> saved) -> StatusOr<uint64_t> {
    std::vector<at::Tensor> host;
    for (auto& t : saved)
      host.push_back(t.defined() ? t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true) : t);
    store[next_ticket] = std::move(host);
    return next_ticket++;
  };
  offload.fetch = [&](int, uint64_t ticket) -> StatusOr<std::vector<at::Tensor>> {
    auto it = store.find(ticket);
    if (it == store.end()) return NotFoundError("unknown ticket");
    std::vector<at::Tensor> back;
    for (auto& t : it->second) back.push_back(t.defined() ? t.to(device) : t);
    store.erase(it);
    return back;
  };

  std::map<std::string, at::Tensor> grads;
  GradCallback on_grad = [&](const std::string& name, const at::Tensor& g) {
    at::Tensor g32 = g.to(at::kCPU, at::kFloat);
    auto it = grads.find(name);
    if (it == grads.end())
      grads[name] = g32;
    else
      it->second.add_(g32);
  };

  at::Tensor loss = at::zeros({}, at::kFloat);
  std::vector<at::Tensor> logits;
  const int64_t b = ids.size(0);
  if (b % a.micro_batches != 0)
    return InvalidArgumentError("batch not divisible by --micro-batches");
  const int64_t mbs = b / a.micro_batches;
  for (int m = 0; m < a.micro_batches; ++m) {
    auto slice = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, m * mbs, mbs) : t; };
    ASSIGN_OR_RETURN(MicroBatch mb, model->PrepareBatch(slice(ids), slice(targets), total,
                                                        slice(positions), slice(segments)));
    mb.loss_scale = a.loss_scale;
    ASSIGN_OR_RETURN(at::Tensor lg, model->Logits(mb));
    logits.push_back(lg.to(at::kCPU, at::kFloat));
    ASSIGN_OR_RETURN(at::Tensor l, model->ForwardBackward(mb, modes, on_grad, &offload));
    loss += l.to(at::kCPU, at::kFloat);
  }
  if (!store.empty()) return InternalError("offloaded activations were never fetched");
  out.push_back({"logits", at::cat(logits, 0)});
  out.push_back({"loss", loss});
  for (auto& [name, g] : grads) {
    if (a.loss_scale != 1) g.div_(a.loss_scale);
    out.push_back({"grad/" + name, g});
  }

  if (a.sgd_lr != 0) {
    c10::NoGradGuard no_grad;
    for (int i = 0; i < model->num_blocks(); ++i) {
      for (auto& p : model->block(i).params()) {
        p.value.sub_(grads.at(p.name).to(p.value.device(), p.value.scalar_type()), a.sgd_lr);
      }
    }
    std::vector<at::Tensor> after;
    for (int m = 0; m < a.micro_batches; ++m) {
      auto slice = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, m * mbs, mbs) : t; };
      ASSIGN_OR_RETURN(MicroBatch mb, model->PrepareBatch(slice(ids), at::Tensor(), 0,
                                                          slice(positions), slice(segments)));
      ASSIGN_OR_RETURN(at::Tensor lg, model->Logits(mb));
      after.push_back(lg.to(at::kCPU, at::kFloat));
    }
    out.push_back({"logits_after", at::cat(after, 0)});
  }
  if (!a.export_dir.empty()) RETURN_IF_ERROR(model->Export(a.export_dir));
  return SaveTensorFile(a.out, out);
}

}  // namespace
}  // namespace offloadd::engine

int main(int argc, char** argv) {
  auto args = offloadd::engine::ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "offloadd-engine-check: %s\n", args.status().ToString().c_str());
    return 2;
  }
  const offloadd::Status st =
      offloadd::engine::RunTorch("engine check", [&] { return offloadd::engine::Run(*args); });
  if (!st.ok()) {
    std::fprintf(stderr, "offloadd-engine-check: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
