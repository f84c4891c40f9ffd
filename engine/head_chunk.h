#pragma once
// The LM head computes logits over chunks of tokens so that no [tokens, vocab] fp32 tensor is
// larger than this (ops::LmHeadLoss; engine/ops.cc asserts the two constants agree). Torch-free:
// the daemon's memory estimates use it without LibTorch.
#include <cstdint>

namespace offloadd::engine {

// 128 MiB: a chunk's working set is ~16 B per logit (bf16 logits and gradient, the fp32 softmax),
// so 512 MiB chunks made the head the largest transient of the step (2.2 GB at TinyLlama batch 8
// on the H200, 2/3 of that step's peak); at 128 MiB a chunk is still >= 1,000 tokens, GEMMs far
// beyond the size where the H200 runs at its rate.
inline constexpr int64_t kHeadChunkBytes = 128ll << 20;

}  // namespace offloadd::engine
