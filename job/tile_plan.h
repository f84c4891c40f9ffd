#pragma once
// The long-context paths' tile sizes from the GPU budget: the tiled MLP's rows (engine/tiles.h,
// ALST's sequence tiling) and the LM head's chunk of tokens (engine/head_chunk.h). Their defaults
// (1 GiB of gate and up per MLP tile, 128 MiB of fp32 logits per head chunk) keep the GEMMs large;
// where the step does not fit the budget with them at the requested length, the planner takes the
// largest smaller tiles whose working sets fit the room the rest of the step leaves.
//
// Working sets (what the tile allocates beyond what the layer saves):
//   MLP tile  = 3 x rows x 2 x ffn x elem: the tile's gate and up, then in its backward d(act),
//               d gate and d up with the activation product (SwiGluBackward), 6 [rows, ffn] at
//               once; 0 when the MLP is not tiled at this length (its gate and up are the layer's
//               saved tensors, counted there)
//   head chunk = tokens x vocab x (2 x elem + 12): the logits and their gradient in the compute
//               dtype and three fp32 buffers at the loss's peak (as job/memory_estimate.cc)
// The two never coexist (the MLP runs in the layers, the head after them): the step's tile term is
// the larger.
//
// Torch-free; thread-compatible.
#include <cstdint>
#include <string>

#include "engine/head_chunk.h"
#include "engine/tiles.h"

namespace offloadd::trainer {

struct TileShape {
  int64_t tokens = 0;  // per micro-batch: rows x sequence length
  int64_t ffn = 0;     // the dense MLP's width (0: none)
  int64_t vocab = 0;
  int64_t elem = 2;   // bytes per element of the compute dtype
  bool gated = true;  // SwiGLU / GeGLU: only those tile
};

// Smallest tiles the budget may choose: below them the GEMMs stop running at their rate.
inline constexpr int64_t kMinMlpTileRows = 256;
inline constexpr int64_t kMinHeadChunkTokens = 16;

struct TileChoice {
  int64_t mlp_tile_bytes = engine::kMlpTileBytes;
  int64_t head_chunk_bytes = engine::kHeadChunkBytes;
  int64_t mlp_rows = 0;     // rows per MLP tile; 0 when the MLP is not tiled at this length
  int64_t head_tokens = 0;  // tokens per head chunk
  int64_t mlp_bytes = 0, head_bytes = 0;  // their working sets
  bool from_budget = false;               // smaller than the defaults, to fit
  int64_t bytes() const { return mlp_bytes > head_bytes ? mlp_bytes : head_bytes; }
  // "MLP in tiles of 4096 rows (384 MiB), LM head in chunks of 1024 tokens (2.0 GiB)".
  std::string Describe() const;
};

// The choice at given tile budgets (clamped to at least the minima).
TileChoice TilesAt(const TileShape& s, int64_t mlp_tile_bytes, int64_t head_chunk_bytes);
// The defaults.
TileChoice DefaultTiles(const TileShape& s);
// The largest tiles, at most the defaults, whose working sets fit `room` bytes; the minima when
// even those do not (then bytes() > room: the caller refuses with its numbers).
TileChoice ChooseTiles(const TileShape& s, int64_t room);

}  // namespace offloadd::trainer
