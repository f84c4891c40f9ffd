#include "engine/rope.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace offloadd::engine::ops {
namespace {

// Each function below follows the op sequence of its transformers counterpart in
// modeling_rope_utils.py (python floats where it uses python floats, fp32 tensors where it uses
// tensors), so that the tables are bit-identical to transformers' on the same device.

at::TensorOptions Floats(c10::Device device) {
  return at::TensorOptions().dtype(at::kFloat).device(device);
}

// arange(0, dim, 2, dtype=int64).float() / dim
at::Tensor Exponent(int64_t dim, c10::Device device) {
  return at::arange(0, dim, 2, Floats(device).dtype(at::kLong)).to(at::kFloat) /
         static_cast<double>(dim);
}

// _compute_default_rope_parameters: 1 / base ** (arange(0, dim, 2) / dim).
at::Tensor DefaultInvFreq(double base, int64_t dim, c10::Device device) {
  return 1.0 / at::pow(base, Exponent(dim, device));
}

// _compute_llama3_parameters.
at::Tensor Llama3InvFreq(const RopeConfig& rope, int64_t dim) {
  at::Tensor inv_freq = DefaultInvFreq(rope.theta, dim, c10::kCPU);
  const double old_ctx = static_cast<double>(rope.original_max_position_embeddings);
  const double low_wavelen = old_ctx / rope.low_freq_factor;
  const double high_wavelen = old_ctx / rope.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor llama = at::where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq);
  at::Tensor smooth =
      (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * llama / rope.factor + smooth * llama;
  at::Tensor medium =
      (wavelen < high_wavelen).logical_not() & (wavelen > low_wavelen).logical_not();
  return at::where(medium, smoothed, llama);
}

// _compute_dynamic_ntk_parameters. Up to max_position_embeddings transformers keeps the
// frequencies of model init (seq_len = max_position_embeddings, python floats: the default ones
// for any factor); past it, dynamic_rope_update recomputes them from the sequence length as an
// fp32 tensor on the input's device.
at::Tensor DynamicInvFreq(const RopeConfig& rope, int64_t dim, int64_t seq_len,
                          c10::Device device) {
  const double max_pos = static_cast<double>(rope.original_max_position_embeddings);
  const double power = static_cast<double>(dim) / static_cast<double>(dim - 2);
  if (seq_len <= rope.original_max_position_embeddings) {
    const double base =
        rope.theta * std::pow(rope.factor * max_pos / max_pos - (rope.factor - 1), power);
    return DefaultInvFreq(base, dim, c10::kCPU);
  }
  const at::Tensor len = at::scalar_tensor(seq_len, Floats(device).dtype(at::kLong));
  const at::Tensor base =
      ((len * rope.factor) / rope.original_max_position_embeddings - (rope.factor - 1)).pow(power) *
      rope.theta;
  return 1.0 / at::pow(base, Exponent(dim, device));
}

// _compute_yarn_parameters.
at::Tensor YarnInvFreq(const RopeConfig& rope, int64_t dim) {
  const double base = rope.theta;
  at::Tensor pos_freqs =
      at::pow(base, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
  at::Tensor extrapolation = 1.0 / pos_freqs;
  at::Tensor interpolation = 1.0 / (pos_freqs * rope.factor);
  const double original = static_cast<double>(rope.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI))) /
           (2 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor's singularity guard
  at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation_factor = 1 - ramp;
  return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
}

// _compute_longrope_parameters: short factors up to original_max_position_embeddings (computed at
// init), long ones beyond it (dynamic_rope_update computes them on the input's device).
at::Tensor LongRopeInvFreq(const RopeConfig& rope, int64_t dim, int64_t seq_len,
                           c10::Device device) {
  const bool is_long = seq_len > rope.original_max_position_embeddings;
  const c10::Device where = is_long ? device : c10::Device(c10::kCPU);
  const std::vector<double>& f = is_long ? rope.long_factor : rope.short_factor;
  TORCH_CHECK(static_cast<int64_t>(f.size()) == dim / 2, "longrope: ", f.size(), " factors for ",
              dim / 2, " rotary frequencies");
  at::Tensor ext = at::tensor(f, at::kDouble).to(at::kFloat).to(where);
  return 1.0 / (ext * at::pow(rope.theta, Exponent(dim, where)));
}

}  // namespace

int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim) {
  return rope.rotary_dim > 0 ? rope.rotary_dim : head_dim;
}

double RopeAttentionScaling(const RopeConfig& rope) {
  if (rope.attention_factor > 0) return rope.attention_factor;
  if (rope.type == "yarn") {
    auto mscale = [](double scale, double m) {
      return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    if (rope.mscale != 0 && rope.mscale_all_dim != 0) {
      return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim);
    }
    return mscale(rope.factor, 1.0);
  }
  if (rope.type == "longrope") {
    if (rope.factor <= 1) return 1.0;
    return std::sqrt(1 + std::log(rope.factor) /
                             std::log(static_cast<double>(rope.original_max_position_embeddings)));
  }
  return 1.0;
}

at::Tensor RopeInvFreq(const RopeConfig& rope, int64_t head_dim, int64_t seq_len,
                       c10::Device device) {
  const int64_t dim = RotaryDim(rope, head_dim);
  TORCH_CHECK(dim >= 2 && dim % 2 == 0 && dim <= head_dim, "RoPE: rotary dimension ", dim,
              " for head_dim ", head_dim);
  at::Tensor inv_freq;
  if (rope.type == "default") {
    inv_freq = DefaultInvFreq(rope.theta, dim, c10::kCPU);
  } else if (rope.type == "linear") {
    inv_freq = DefaultInvFreq(rope.theta, dim, c10::kCPU) / rope.factor;
  } else if (rope.type == "dynamic") {
    inv_freq = DynamicInvFreq(rope, dim, seq_len, device);
  } else if (rope.type == "llama3") {
    inv_freq = Llama3InvFreq(rope, dim);
  } else if (rope.type == "yarn") {
    inv_freq = YarnInvFreq(rope, dim);
  } else if (rope.type == "longrope") {
    inv_freq = LongRopeInvFreq(rope, dim, seq_len, device);
  } else {
    TORCH_CHECK(false, "unknown RoPE type '", rope.type, "'");
  }
  return inv_freq.to(device);
}

void RopeTables(const RopeConfig& rope, int64_t head_dim, const at::Tensor& position_ids,
                c10::ScalarType dtype, at::Tensor* cos, at::Tensor* sin) {
  // transformers takes the sequence length as max(position_ids) + 1 (a device sync, needed only
  // by the types that depend on it).
  int64_t seq_len = 0;
  if (rope.type == "dynamic" || rope.type == "longrope") {
    seq_len = position_ids.numel() == 0 ? 0 : position_ids.max().item<int64_t>() + 1;
  }
  const at::Tensor inv_freq = RopeInvFreq(rope, head_dim, seq_len, position_ids.device());
  // inv_freq @ position_ids with an inner dimension of 1: one rounded product per element.
  at::Tensor freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [B, T, R/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  at::Tensor c = emb.cos(), s = emb.sin();
  const double scaling = RopeAttentionScaling(rope);
  if (scaling != 1.0) {
    c = c * scaling;
    s = s * scaling;
  }
  *cos = c.to(dtype);
  *sin = s.to(dtype);
}

namespace {
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}
// Transpose of RotateHalf: [a, b] -> [b, -a].
at::Tensor RotateHalfT(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({x.narrow(-1, half, half), -x.narrow(-1, 0, half)}, -1);
}
}  // namespace

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  const int64_t r = cos.size(-1), d = x.size(-1);
  if (r == d) return x * c + RotateHalf(x) * s;
  // Partial rotary (Phi-3's apply_rotary_pos_emb): rotate the first r dimensions only.
  at::Tensor rot = x.narrow(-1, 0, r);
  return at::cat({rot * c + RotateHalf(rot) * s, x.narrow(-1, r, d - r)}, -1);
}

at::Tensor ApplyRopeBackward(const at::Tensor& dy, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  const int64_t r = cos.size(-1), d = dy.size(-1);
  if (r == d) return dy * c + RotateHalfT(dy * s);
  at::Tensor rot = dy.narrow(-1, 0, r);
  return at::cat({rot * c + RotateHalfT(rot * s), dy.narrow(-1, r, d - r)}, -1);
}

}  // namespace offloadd::engine::ops
