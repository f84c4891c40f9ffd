// LspMode: LSP-Offload in the trainer (see lsp_mode.h).
#include "trainer/pipeline/lsp_mode.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "engine/tensor_io.h"
#include "engine/torch_boundary.h"
#include "lsp/subspace.h"

namespace offloadd::trainer {
namespace {

constexpr char kSwitches[] = "lsp.switches";

Status CheckLspConfig(const LspConfig& c) {
  if (c.rank < 1) return InvalidArgumentError("lsp rank must be at least 1, got " + std::to_string(c.rank));
  if (c.nonzeros < 1)
    return InvalidArgumentError("lsp nonzeros must be at least 1, got " + std::to_string(c.nonzeros));
  if (c.check_every < 1)
    return InvalidArgumentError("lsp check_every must be at least 1, got " + std::to_string(c.check_every));
  if (!(c.threshold >= 0) || !std::isfinite(c.threshold))
    return InvalidArgumentError("lsp threshold must be a finite number >= 0");
  if (c.learn_steps < 0) return InvalidArgumentError("lsp learn_steps must be >= 0");
  if (!(c.learn_lr > 0) || !std::isfinite(c.learn_lr)) return InvalidArgumentError("lsp learn_lr must be > 0");
  if (!(c.gamma >= 0) || !std::isfinite(c.gamma)) return InvalidArgumentError("lsp gamma must be >= 0");
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<LspMode>> LspMode::Create(const LspConfig& config, uint64_t seed,
                                                   engine::Model* model, std::vector<BlockLayout>* layout,
                                                   c10::Device device, c10::ScalarType dtype) {
  RETURN_IF_ERROR(CheckLspConfig(config));
  std::unique_ptr<LspMode> mode(new LspMode(config, seed, layout, device, dtype));
  for (int b = 0; b < static_cast<int>(layout->size()); ++b) {
    if (model->block(b).kind() != engine::Block::Kind::kDecoderLayer) continue;
    BlockLayout& bl = (*layout)[b];
    bl.numel = 0;
    for (size_t i = 0; i < bl.params.size(); ++i) {
      ParamSlot& slot = bl.params[i];
      if (slot.shape.size() == 2) {
        const int64_t m = slot.shape[0], n = slot.shape[1];
        Matrix mx;
        mx.block = b;
        mx.slot = i;
        mx.weight = slot.param;
        mx.coords = std::make_unique<engine::Param>(engine::Param{slot.param->name + ".lsp_a", at::Tensor()});
        const uint64_t draw = seed * 1000003ull + mode->matrices_.size();
        mx.pq = config.identity ? lsp::ProjectorPair::Identity(m, n, device)
                                : lsp::ProjectorPair::Random(m, n, config.rank, config.nonzeros, draw, device);
        slot.compressed = slot.param;
        slot.param = mx.coords.get();
        slot.shape = {mx.pq.rank_rows(), mx.pq.rank_cols()};
        slot.numel = static_cast<uint64_t>(mx.pq.rank_rows() * mx.pq.rank_cols());
        mode->by_weight_[mx.weight->name] = mode->matrices_.size();
        mode->matrices_.push_back(std::move(mx));
      }
      slot.offset = bl.numel;
      bl.numel += slot.numel;
    }
  }
  if (mode->matrices_.empty()) {
    return InvalidArgumentError("LSP mode: the model has no 2-D decoder-layer weights to compress");
  }
  return mode;
}

Status LspMode::Initialize(const engine::Model& model) {
  c10::NoGradGuard no_grad;
  for (Matrix& mx : matrices_) {
    ASSIGN_OR_RETURN(at::Tensor init, model.ReadInitialValue(mx.weight->name));
    if (on_device()) {
      // A = 0: the effective weight is W_base itself until the first update.
      mx.base = init.to(device_, dtype_).contiguous().clone();
      mx.weight->value = mx.base;
      mx.a_version = mx.materialized = 0;
      continue;
    }
    mx.base = init.to(device_, at::kFloat).contiguous().clone();
    mx.effective = mx.base.to(dtype_).clone();
    mx.weight->value = mx.effective;
  }
  return OkStatus();
}

at::Tensor LspMode::Compress(const ParamSlot& slot, const at::Tensor& grad) const {
  const Matrix& mx = matrices_[by_weight_.at(slot.compressed->name)];
  if (on_device()) return CompressDense(mx, grad).to(grad.scalar_type());
  return mx.pq.Compress(grad).to(grad.scalar_type());
}

at::Tensor LspMode::EffectiveDense(const Matrix& mx) const {
  // A as the block's weights bring it to the device (the compute dtype, bound to the coordinates'
  // Param by WeightResidency); P A (m x s) and W_base + (P A) Q^T as GEMMs accumulating in fp32,
  // the latter with W_base as addmm's input: one rounding of the effective weight.
  const at::Tensor& a = mx.coords->value;
  const at::Tensor pa = at::matmul(mx.pq.p().Dense(dtype_), a.to(dtype_));
  return at::addmm(mx.base, pa, mx.pq.q().Dense(dtype_).t());
}

at::Tensor LspMode::CompressDense(const Matrix& mx, const at::Tensor& grad) const {
  // P^T G as a bf16 GEMM (s x n, accumulated in fp32, rounded to bf16), then (P^T G) Q in fp32.
  const at::Tensor ptg = at::matmul(mx.pq.p().Dense(grad.scalar_type()).t(), grad);
  return at::matmul(ptg.to(at::kFloat), mx.pq.q().Dense());
}

void LspMode::Materialize(int b) {
  c10::NoGradGuard no_grad;
  for (Matrix& mx : matrices_) {
    if (mx.block != b || mx.materialized == mx.a_version) continue;
    mx.effective = EffectiveDense(mx);
    mx.weight->value = mx.effective;
    mx.materialized = mx.a_version;
  }
}

bool LspMode::Stale(int b) const {
  return std::any_of(matrices_.begin(), matrices_.end(),
                     [b](const Matrix& mx) { return mx.block == b && mx.materialized != mx.a_version; });
}

void LspMode::Release(int b) {
  for (Matrix& mx : matrices_) {
    if (mx.block != b || !mx.effective.defined()) continue;
    mx.effective = at::Tensor();
    mx.weight->value = mx.base;
    mx.materialized = -1;
  }
}

LspWorkingSet LspMode::WorkingSet() const {
  if (!on_device()) return {};
  std::vector<LspMatrixShape> shapes;
  for (const Matrix& mx : matrices_) {
    shapes.push_back({mx.block, mx.pq.p().rows(), mx.pq.q().rows(), mx.pq.rank_rows(), mx.pq.rank_cols(),
                      std::max(mx.pq.p().nonzeros(), mx.pq.q().nonzeros())});
  }
  return PriceLspWorkingSet(shapes, static_cast<int64_t>(c10::elementSize(dtype_)));
}

at::Tensor LspMode::Coordinates(const Matrix& mx, const float* block_master) const {
  const ParamSlot& slot = layout_[mx.block].params[mx.slot];
  return at::from_blob(const_cast<float*>(block_master) + slot.offset, {mx.pq.rank_rows(), mx.pq.rank_cols()},
                       at::TensorOptions().dtype(at::kFloat));
}

void LspMode::Rebuild(Matrix& mx, const float* block_master) {
  if (on_device()) {
    // The block's weights (A among them, in the compute dtype) reach the device through
    // WeightResidency like any streamed block's; the next Materialize rebuilds from them.
    ++mx.a_version;
    return;
  }
  const at::Tensor a = Coordinates(mx, block_master).to(mx.base.device());
  mx.effective.copy_(mx.base + mx.pq.Decompress(a));
}

Status LspMode::OnUpdated(int b, const float* block_master) {
  if (block_master == nullptr) return FailedPreconditionError("LSP mode needs the fp32 masters in RAM");
  c10::NoGradGuard no_grad;  // the optimizer thread's grad mode is the default (on)
  try {
    for (Matrix& mx : matrices_) {
      if (mx.block == b) Rebuild(mx, block_master);
    }
  } catch (const std::exception& e) {  // on the optimizer thread: an error, never a terminate
    return engine::TorchErrorStatus("LSP: rebuilding block " + std::to_string(b) + "'s weights", e);
  }
  return OkStatus();
}

bool LspMode::CheckDue(int64_t step) const {
  return !cfg_.identity && (step - 1) % cfg_.check_every == 0;
}

StatusOr<LspMode::CheckSummary> LspMode::Check(int64_t step, const std::map<std::string, at::Tensor>& grads,
                                               const StateAccess& states) {
  const auto t0 = std::chrono::steady_clock::now();
  CheckSummary s;
  lsp::CheckOptions opt;
  opt.threshold = cfg_.threshold;
  opt.learn.steps = cfg_.learn_steps;
  opt.learn.lr = cfg_.learn_lr;
  opt.learn.gamma = cfg_.gamma;
  std::map<int, std::vector<std::pair<size_t, lsp::ProjectorPair>>> by_block;
  for (const auto& [name, g] : grads) {
    auto it = by_weight_.find(name);
    if (it == by_weight_.end()) continue;
    Matrix& mx = matrices_[it->second];
    opt.learn.seed = seed_ * 1000003ull + static_cast<uint64_t>(step) * 7919ull + it->second;
    // The learning's G-sized GEMMs in bf16 on CUDA (tensor cores; its range is fp32's, so a small
    // gradient does not underflow as in fp16); the decision and the reported biases stay fp32.
    opt.learn.gemm_dtype = on_device() ? at::kBFloat16 : at::kFloat;
    const auto l0 = std::chrono::steady_clock::now();
    lsp::CheckResult r = lsp::CheckAndUpdate(mx.pq, g, opt);
    s.learn_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - l0).count();
    ++s.checked;
    s.mean_bias += r.bias;
    if (r.updated) {
      s.mean_bias_after += r.learn.bias_after;
      by_block[mx.block].emplace_back(it->second, std::move(r.next));
    }
  }
  const auto s0 = std::chrono::steady_clock::now();
  std::vector<float> master, m, v;
  for (auto& [b, next] : by_block) {
    RETURN_IF_ERROR(states.read(b, &master, &m, &v));
    for (auto& [idx, pq] : next) {
      Matrix& mx = matrices_[idx];
      const ParamSlot& slot = layout_[b].params[mx.slot];
      const at::IntArrayRef shape = slot.shape;
      auto view = [&](std::vector<float>& buf) {
        return at::from_blob(buf.data() + slot.offset, shape, at::TensorOptions().dtype(at::kFloat));
      };
      at::Tensor a = view(master), m1 = view(m), m2 = view(v);
      if (on_device()) {
        // The fold W_base += P A Q^T in fp32, then rounded once to the resident bf16 W_base.
        at::Tensor base32 = mx.base.to(at::kFloat), ad = a.to(device_), m1d = m1.to(device_), m2d = m2.to(device_);
        RETURN_IF_ERROR(lsp::SwitchSubspace(mx.pq, pq, base32, ad, m1d, m2d));
        mx.base.copy_(base32);
        a.copy_(ad);
        m1.copy_(m1d);
        m2.copy_(m2d);
      } else {
        RETURN_IF_ERROR(lsp::SwitchSubspace(mx.pq, pq, mx.base, a, m1, m2));
      }
      mx.pq = std::move(pq);
      ++switches_;
      ++s.switched;
    }
    RETURN_IF_ERROR(states.restore(b, master, m, v));
    for (auto& [idx, pq] : next) {
      (void)pq;
      c10::NoGradGuard no_grad;
      Rebuild(matrices_[idx], master.data());
    }
  }
  s.switch_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
  if (s.checked > 0) s.mean_bias /= s.checked;
  if (s.switched > 0) s.mean_bias_after /= s.switched;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

StatusOr<std::string> LspMode::Serialize() const {
  std::map<std::string, at::Tensor> parts;
  for (const Matrix& mx : matrices_) {
    lsp::SaveProjectorPair(mx.pq, mx.weight->name + ".", &parts);
    parts[mx.weight->name + ".base"] = mx.base.to(at::kFloat);
  }
  parts[kSwitches] = at::tensor({switches_}, at::kLong);
  return engine::EncodeTensors({parts.begin(), parts.end()});
}

Status LspMode::Restore(const std::string& path) {
  ASSIGN_OR_RETURN(auto parts, engine::LoadTensorFile(path));
  auto sw = parts.find(kSwitches);
  if (sw == parts.end() || sw->second.numel() != 1 || sw->second.scalar_type() != at::kLong) {
    return DataLossError(path + ": no \"" + std::string(kSwitches) + "\" count");
  }
  std::vector<lsp::ProjectorPair> pairs;
  std::vector<at::Tensor> bases;
  for (const Matrix& mx : matrices_) {
    const at::Device device = mx.base.device();
    auto pq = lsp::LoadProjectorPair(parts, mx.weight->name + ".", device);
    if (!pq.ok()) return DataLossError(path + ": " + pq.status().message());
    if (pq->rank_rows() != mx.pq.rank_rows() || pq->rank_cols() != mx.pq.rank_cols() ||
        pq->p().rows() != mx.pq.p().rows() || pq->q().rows() != mx.pq.q().rows()) {
      return DataLossError(path + ": the projectors of " + mx.weight->name + " have another shape than this job's");
    }
    auto base = parts.find(mx.weight->name + ".base");
    if (base == parts.end() || base->second.scalar_type() != at::kFloat ||
        base->second.sizes() != mx.base.sizes()) {
      return DataLossError(path + ": no fp32 \"" + mx.weight->name + ".base\" of the weight's shape");
    }
    pairs.push_back(std::move(*pq));
    bases.push_back(base->second.to(device, mx.base.scalar_type()));
  }
  for (size_t i = 0; i < matrices_.size(); ++i) {  // all checked: nothing half-restored
    matrices_[i].pq = std::move(pairs[i]);
    matrices_[i].base.copy_(bases[i]);
    matrices_[i].materialized = -1;  // CUDA: rebuilt from the restored base at the next use
    if (on_device() && !matrices_[i].effective.defined()) matrices_[i].weight->value = matrices_[i].base;
  }
  switches_ = sw->second.item<int64_t>();
  return OkStatus();
}

int64_t LspMode::coordinate_count() const {
  int64_t c = 0;
  for (const Matrix& mx : matrices_) c += mx.pq.rank_rows() * mx.pq.rank_cols();
  return c;
}

std::string LspMode::Describe() const {
  int64_t weights = 0;
  for (const Matrix& mx : matrices_) weights += mx.pq.p().rows() * mx.pq.q().rows();
  std::ostringstream o;
  o << "LSP-Offload on " << matrices_.size() << " decoder-layer matrices ("
    << (cfg_.identity ? std::string("identity projectors")
                      : "s=" + std::to_string(cfg_.rank) + " d=" + std::to_string(cfg_.nonzeros) +
                            ", clamped per matrix") << ": " << coordinate_count() << " trained coordinates for "
    << weights << " weights";
  if (!cfg_.identity) {
    o << "; projectors checked every " << cfg_.check_every << " steps at relative bias "
      << cfg_.threshold << ", learned in " << cfg_.learn_steps << " Adam steps";
  }
  o << "; weight decay acts on the coordinates)";
  return o.str();
}

Status ParseLspSpec(const std::string& spec, LspConfig* out) {
  LspConfig c;
  if (spec == "none" || spec.empty()) {
    *out = c;
    return OkStatus();
  }
  if (spec.rfind("lsp", 0) != 0 || (spec.size() > 3 && spec[3] != ':')) {
    return InvalidArgumentError("compression must be none or lsp[:key=value,...], got '" + spec + "'");
  }
  c.enabled = true;
  std::stringstream ss(spec.size() > 4 ? spec.substr(4) : "");
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || value.empty())
      return InvalidArgumentError("compression lsp: '" + item + "' is not key=value");
    char* end = nullptr;
    errno = 0;
    const double num = std::strtod(value.c_str(), &end);
    const bool numeric = end && *end == '\0' && errno == 0;
    const bool integral = numeric && num == std::floor(num) && std::abs(num) < 1e15;
    auto need = [&](bool ok, const char* what) -> Status {
      return ok ? OkStatus()
                : InvalidArgumentError("compression lsp: " + key + " must be " + what + ", got '" + value + "'");
    };
    if (key == "rank") {
      RETURN_IF_ERROR(need(integral, "an integer"));
      c.rank = static_cast<int64_t>(num);
    } else if (key == "nonzeros") {
      RETURN_IF_ERROR(need(integral, "an integer"));
      c.nonzeros = static_cast<int64_t>(num);
    } else if (key == "check_every") {
      RETURN_IF_ERROR(need(integral, "an integer"));
      c.check_every = static_cast<int64_t>(num);
    } else if (key == "threshold") {
      RETURN_IF_ERROR(need(numeric, "a number"));
      c.threshold = num;
    } else if (key == "learn_steps") {
      RETURN_IF_ERROR(need(integral && num <= 1e6, "an integer"));
      c.learn_steps = static_cast<int>(num);
    } else if (key == "learn_lr") {
      RETURN_IF_ERROR(need(numeric, "a number"));
      c.learn_lr = num;
    } else if (key == "gamma") {
      RETURN_IF_ERROR(need(numeric, "a number"));
      c.gamma = num;
    } else if (key == "projectors") {
      RETURN_IF_ERROR(need(value == "learned" || value == "identity", "learned or identity"));
      c.identity = value == "identity";
    } else {
      return InvalidArgumentError("compression lsp: unknown key '" + key +
                                  "' (rank, nonzeros, check_every, threshold, learn_steps, learn_lr, gamma, "
                                  "projectors)");
    }
  }
  RETURN_IF_ERROR(CheckLspConfig(c));
  *out = c;
  return OkStatus();
}

}  // namespace offloadd::trainer
