#pragma once
// Sequence tiles of the long-context paths, torch-free so that the trainer's and the daemon's
// memory estimates price the tiles the engine runs: the tiled attention path's query tile
// (engine/doc_attention.h) and the tiled MLP's rows (engine/parts.h MlpPart).
#include <algorithm>
#include <cstdint>

namespace offloadd::engine {

// One tile's fp32 scores [heads, rows, keys] stay within this: its working set is about five
// such copies (the scores, their fp32 softmax and the backward's fp32 dP, P and dS).
inline constexpr int64_t kTileScoreBytes = 64ll << 20;

// Query rows per tile for `heads` heads and up to `keys` keys per tile (at least 16, at most 512).
inline int64_t QueryTile(int64_t heads, int64_t keys) {
  const int64_t per_row = std::max<int64_t>(1, heads * keys * 4);
  return std::clamp<int64_t>(kTileScoreBytes / per_row, 16, 512);
}

// A gated MLP over more tokens than fit this (one tile's gate and up together) runs in tiles.
inline constexpr int64_t kMlpTileBytes = int64_t{1} << 30;
// Rows per MLP tile for an ffn width and elements of `elem` bytes.
inline int64_t MlpTileRows(int64_t ffn, int64_t elem, int64_t tile_bytes = kMlpTileBytes) {
  return std::max<int64_t>(1, tile_bytes / std::max<int64_t>(1, 2 * ffn * elem));
}

}  // namespace offloadd::engine
