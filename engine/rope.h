#pragma once
// Rotary position embeddings (engine-internal), computed as transformers does: the inverse
// frequencies of ROPE_INIT_FUNCTIONS (default, linear, dynamic, llama3, yarn, longrope) with the
// same fp32 op sequence, the attention scaling yarn and longrope apply to cos/sin, the sequence-
// length-dependent choices of `dynamic_rope_update` (dynamic NTK growth past
// max_position_embeddings, longrope's short/long factors) and partial rotary (only the first
// rotary_dim dimensions of a head rotate, rotate_half over that part). Stateless and thread-safe.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "engine/model_config.h"

namespace offloadd::engine::ops {

// The dimensions per head `rope` rotates: rope.rotary_dim, or head_dim when unset (0).
int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim);

// The factor cos and sin are multiplied by: rope.attention_factor when set; else derived from
// factor (yarn: mscale / mscale_all_dim; longrope: sqrt(1 + ln(factor) / ln(original max)));
// 1 for the other types.
double RopeAttentionScaling(const RopeConfig& rope);

// Inverse frequencies [RotaryDim / 2], fp32, on `device`, for a forward pass whose largest position
// is seq_len - 1 (dynamic and longrope depend on it; the other types do not). Computed where
// transformers computes them: at model init on the CPU, and on the input's device for dynamic
// growth and longrope's long factors.
at::Tensor RopeInvFreq(const RopeConfig& rope, int64_t head_dim, int64_t seq_len,
                       c10::Device device);

// Rotary tables cos, sin [B, T, RotaryDim] (fp32 math, then cast to dtype) for position_ids
// [B, T] int64, for the sequence length max(position_ids) + 1 as transformers takes it.
void RopeTables(const RopeConfig& rope, int64_t head_dim, const at::Tensor& position_ids,
                c10::ScalarType dtype, at::Tensor* cos, at::Tensor* sin);

// x: [B, H, T, D]; cos/sin [B, T, R] with R <= D even: the first R dimensions rotate (HF's
// rotate_half convention), the rest pass through.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// The transpose of ApplyRope (a rotation per position): d loss / d x from d loss / d y.
at::Tensor ApplyRopeBackward(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace offloadd::engine::ops
