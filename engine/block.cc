// Block: the save-mode state machine shared by every block kind. Concrete blocks only implement
// Run (forward math, optionally recording saved tensors) and Backprop (the analytic backward).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include "engine/blocks.h"
#include "engine/torch_boundary.h"

namespace offloadd::engine {

std::string_view SaveModeName(SaveMode mode) {
  switch (mode) {
    case SaveMode::kKeep:
      return "keep";
    case SaveMode::kRecompute:
      return "recompute";
    case SaveMode::kOffload:
      return "offload";
    case SaveMode::kNone:
      return "none";
  }
  return "?";
}

namespace {
int64_t TensorBytes(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) {
    if (t.defined()) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}
}  // namespace

int64_t SavedState::held_bytes() const { return TensorBytes(tensors_); }

void SavedState::Clear() {
  tensors_.clear();
  ready_ = false;
  ticket_ = 0;
  mode_ = SaveMode::kNone;
}

StatusOr<std::vector<Param>> LoadParams(
    const ParamLoader& load,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs) {
  std::vector<Param> params;
  params.reserve(specs.size());
  for (const auto& [name, shape] : specs) {
    ASSIGN_OR_RETURN(at::Tensor t, load(name, shape));
    params.push_back({name, std::move(t)});
  }
  return params;
}

Status Block::To(c10::Device device, c10::ScalarType dtype) {
  try {
    for (auto& p : params_) {
      if (p.value.defined()) p.value = p.value.to(device, dtype);
    }
  } catch (const std::exception& e) {  // LibTorch's c10::Error, out of memory included
    return TorchErrorStatus(name_ + ": moving parameters failed", e);
  }
  return OkStatus();
}

Status Block::CheckPlacement(const at::Tensor& like) const {
  auto check = [&](const Param& p) -> Status {
    if (!p.value.defined()) {
      return FailedPreconditionError(name_ + ": parameter " + p.name + " is not resident");
    }
    if (p.value.device() != like.device() || p.value.scalar_type() != like.scalar_type()) {
      return FailedPreconditionError(name_ + ": parameter " + p.name + " is " +
                                     std::string(c10::toString(p.value.scalar_type())) + " on " +
                                     p.value.device().str() + " but the block computes in " +
                                     std::string(c10::toString(like.scalar_type())) + " on " +
                                     like.device().str());
    }
    return OkStatus();
  };
  for (const auto& p : params_) RETURN_IF_ERROR(check(p));
  for (const Param* p : shared_) RETURN_IF_ERROR(check(*p));
  return OkStatus();
}

namespace {
// The tensor that fixes the compute device/dtype of a block: its input, or for the embedding
// (whose input is token ids) its first parameter placed on the ids' device.
Status CheckInput(const Block& b, const MicroBatch& mb, const at::Tensor& x) {
  if (!mb.input_ids.defined())
    return InvalidArgumentError(b.name() + ": micro-batch has no input_ids");
  if (b.kind() == Block::Kind::kEmbedding) return OkStatus();
  if (!x.defined() || x.dim() != 3 || x.size(0) != mb.input_ids.size(0) ||
      x.size(1) != mb.input_ids.size(1)) {
    return InvalidArgumentError(b.name() +
                                ": input must be [batch, seq, hidden] matching input_ids");
  }
  return OkStatus();
}
}  // namespace

StatusOr<at::Tensor> Block::Forward(const MicroBatch& mb, const at::Tensor& x, SaveMode mode,
                                    SavedState* saved, const OffloadCallbacks* offload) {
  RETURN_IF_ERROR(CheckInput(*this, mb, x));
  if (kind_ == Kind::kHead && !mb.targets.defined()) {
    return InvalidArgumentError(name_ + ": Forward needs targets (use Logits for inference)");
  }
  if (mode != SaveMode::kNone && saved == nullptr) {
    return InvalidArgumentError(name_ + ": SavedState required for save mode " +
                                std::string(SaveModeName(mode)));
  }
  if (mode == SaveMode::kOffload && (!offload || !offload->offload || !offload->fetch)) {
    return InvalidArgumentError(name_ + ": offload mode needs both offload and fetch callbacks");
  }
  if (kind_ != Kind::kEmbedding) {
    RETURN_IF_ERROR(CheckPlacement(x));
  } else if (!params_.empty() && params_[0].value.defined()) {
    RETURN_IF_ERROR(
        CheckPlacement(at::empty({0}, params_[0].value.options().device(mb.input_ids.device()))));
  }
  try {
    c10::NoGradGuard no_grad;  // all backward math is explicit
    at::Tensor out;
    if (mode == SaveMode::kKeep || mode == SaveMode::kOffload) {
      std::vector<at::Tensor> tensors;
      out = Run(mb, x, &tensors);
      last_saved_bytes_ = TensorBytes(tensors);
      saved->Clear();
      saved->mode_ = mode;
      saved->count_ = tensors.size();
      if (mode == SaveMode::kKeep) {
        saved->tensors_ = std::move(tensors);
      } else {
        ASSIGN_OR_RETURN(saved->ticket_, offload->offload(index_, std::move(tensors)));
      }
      saved->ready_ = true;
    } else {
      out = Run(mb, x, nullptr);
      if (mode == SaveMode::kRecompute) {
        saved->Clear();
        saved->mode_ = mode;
        saved->tensors_ = {x};
        saved->ready_ = true;
      }
    }
    return out;
  } catch (const std::exception& e) {  // LibTorch's c10::Error, out of memory included
    return TorchErrorStatus(name_ + " forward", e);
  }
}

StatusOr<at::Tensor> Block::Backward(const MicroBatch& mb, const at::Tensor& grad_out,
                                     SavedState* saved, const GradCallback& on_grad,
                                     const OffloadCallbacks* offload) {
  if (saved == nullptr || !saved->ready_) {
    return FailedPreconditionError(name_ + ": Backward without a matching Forward");
  }
  if (kind_ != Kind::kHead && !grad_out.defined()) {
    return InvalidArgumentError(name_ + ": grad_out is required");
  }
  try {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> tensors;
    switch (saved->mode_) {
      case SaveMode::kKeep:
        tensors = std::move(saved->tensors_);
        break;
      case SaveMode::kRecompute: {
        const at::Tensor x = saved->tensors_.empty() ? at::Tensor() : saved->tensors_[0];
        RETURN_IF_ERROR(CheckInput(*this, mb, x));
        Run(mb, x, &tensors);
        last_saved_bytes_ = TensorBytes(tensors);
        break;
      }
      case SaveMode::kOffload: {
        if (!offload || !offload->fetch) {
          return InvalidArgumentError(name_ + ": offloaded activations need a fetch callback");
        }
        ASSIGN_OR_RETURN(tensors, offload->fetch(index_, saved->ticket_));
        if (tensors.size() != saved->count_) {
          return DataLossError(name_ + ": fetch returned " + std::to_string(tensors.size()) +
                               " tensors, forward offloaded " + std::to_string(saved->count_));
        }
        break;
      }
      case SaveMode::kNone:
        return FailedPreconditionError(name_ + ": forward ran in inference mode");
    }
    // Saved tensor 0 is the block input for layers and the head: it fixes device and dtype.
    if (kind_ != Kind::kEmbedding && !tensors.empty() && tensors[0].defined()) {
      RETURN_IF_ERROR(CheckPlacement(tensors[0]));
    }
    saved->Clear();
    return Backprop(mb, grad_out, tensors, on_grad);
  } catch (const std::exception& e) {  // LibTorch's c10::Error, out of memory included
    return TorchErrorStatus(name_ + " backward", e);
  }
}

StatusOr<at::Tensor> Block::Logits(const MicroBatch& mb, const at::Tensor& x) {
  if (kind_ != Kind::kHead)
    return FailedPreconditionError(name_ + ": Logits is for the head block");
  RETURN_IF_ERROR(CheckInput(*this, mb, x));
  RETURN_IF_ERROR(CheckPlacement(x));
  try {
    c10::NoGradGuard no_grad;
    return RunLogits(mb, x);
  } catch (const std::exception& e) {  // LibTorch's c10::Error, out of memory included
    return TorchErrorStatus(name_ + " logits", e);
  }
}

int64_t Block::OwnedParamBytes() const {
  int64_t n = 0;
  for (const auto& p : params_) {
    if (p.value.defined()) n += static_cast<int64_t>(p.value.nbytes());
  }
  return n;
}

BlockCost Block::EstimateCost(int64_t, int64_t, c10::ScalarType) const {
  BlockCost c;
  c.param_bytes = OwnedParamBytes();
  return c;
}

at::Tensor Block::RunLogits(const MicroBatch&, const at::Tensor&) { return at::Tensor(); }

}  // namespace offloadd::engine
