#pragma once
// The chunk the head's training forward computes with in this process (ops::LmHeadLoss's
// chunk_bytes): kHeadChunkBytes (engine/head_chunk.h) unless the trainer chose a smaller one from
// its GPU budget (trainer/tile_plan.h); <= 0 restores the default. Defined with the head
// (embedding_head.cc). Thread-safe (an atomic).
#include <cstdint>

namespace offloadd::engine {

void SetHeadChunkBytes(int64_t bytes);
int64_t HeadChunkBytes();

}  // namespace offloadd::engine
