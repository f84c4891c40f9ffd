#pragma once
// The LM head computes logits over chunks of tokens so that no [tokens, vocab] fp32 tensor is
// larger than this (ops::LmHeadLoss; engine/ops.cc asserts the two constants agree). Torch-free:
// the daemon's memory estimates use it without LibTorch.
#include <cstdint>

namespace offloadd::engine {

inline constexpr int64_t kHeadChunkBytes = 512ll << 20;

}  // namespace offloadd::engine
