#pragma once
// BlockLayout: where each parameter of a block lives in the block's flat buffers (compute
// weights, gradient staging, fp32 masters: one layout for all of them), and the binding of a
// flat buffer to the block's Params. Plain value types; binding mutates the engine's Params, so
// it is for the step loop's thread.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "engine/model.h"

namespace offloadd::trainer {

struct ParamSlot {
  engine::Param* param = nullptr;  // owned by the block (LSP mode: the coordinates' shadow Param)
  // LSP mode: the model's weight whose subspace coordinates A this slot holds
  // (trainer/pipeline/lsp_mode.h); its gradients are compressed into the slot. Null for a parameter
  // trained as itself.
  engine::Param* compressed = nullptr;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // elements into the block's flat buffers
  uint64_t numel = 0;

  // This parameter's part of a flat buffer laid out like its block.
  at::Tensor View(const at::Tensor& flat) const {
    return flat.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(numel)).view(shape);
  }
};

struct BlockLayout {
  std::vector<ParamSlot> params;
  uint64_t numel = 0;

  // Makes the block compute with `flat` (views of it become the Params' tensors).
  void Bind(const at::Tensor& flat) const {
    for (const auto& slot : params) slot.param->value = slot.View(flat);
  }
  // Leaves the block without weights (streamed out).
  void Unbind() const {
    for (const auto& slot : params) slot.param->value = at::Tensor();
  }
};

}  // namespace offloadd::trainer
