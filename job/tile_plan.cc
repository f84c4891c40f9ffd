#include "job/tile_plan.h"

#include <algorithm>

#include "common/units.h"

namespace offloadd::trainer {
namespace {

int64_t RowBytes(const TileShape& s) { return std::max<int64_t>(1, 2 * s.ffn * s.elem); }
int64_t LogitBytes(const TileShape& s) { return std::max<int64_t>(1, s.vocab * 4); }

}  // namespace

TileChoice TilesAt(const TileShape& s, int64_t mlp_tile_bytes, int64_t head_chunk_bytes) {
  TileChoice t;
  t.mlp_tile_bytes = std::max(mlp_tile_bytes, kMinMlpTileRows * RowBytes(s));
  t.head_chunk_bytes = std::max(head_chunk_bytes, kMinHeadChunkTokens * LogitBytes(s));
  // As the engine computes them: engine::MlpTileRows, ops::LmHeadLoss's chunk.
  const int64_t rows = engine::MlpTileRows(s.ffn, s.elem, t.mlp_tile_bytes);
  if (s.gated && s.ffn > 0 && s.tokens > rows) {
    t.mlp_rows = rows;
    t.mlp_bytes = 3 * rows * RowBytes(s);
  }
  t.head_tokens = std::min(s.tokens, std::max<int64_t>(1, t.head_chunk_bytes / LogitBytes(s)));
  t.head_bytes = t.head_tokens * s.vocab * (2 * s.elem + 12);
  return t;
}

TileChoice DefaultTiles(const TileShape& s) {
  return TilesAt(s, engine::kMlpTileBytes, engine::kHeadChunkBytes);
}

TileChoice ChooseTiles(const TileShape& s, int64_t room) {
  const TileChoice d = DefaultTiles(s);
  if (d.bytes() <= room) return d;
  // Each part alone within the room: the MLP's 3 tiles of gate and up, the head's chunk at its
  // bytes per fp32 logit.
  const int64_t r = std::max<int64_t>(0, room);
  int64_t mlp = d.mlp_bytes <= r ? d.mlp_tile_bytes : r / 3;
  int64_t head =
      d.head_bytes <= r ? d.head_chunk_bytes : r / std::max<int64_t>(1, 2 * s.elem + 12) * 4;
  TileChoice t = TilesAt(s, std::min(mlp, d.mlp_tile_bytes), std::min(head, d.head_chunk_bytes));
  t.from_budget = true;
  return t;
}

std::string TileChoice::Describe() const {
  std::string out = mlp_rows > 0 ? "MLP in tiles of " + std::to_string(mlp_rows) + " rows (" +
                                       FormatByteSize(static_cast<uint64_t>(mlp_bytes)) + ")"
                                 : "MLP untiled";
  out += ", LM head in chunks of " + std::to_string(head_tokens) + " tokens (" +
         FormatByteSize(static_cast<uint64_t>(head_bytes)) + ")";
  if (from_budget) out += ", smaller than the defaults to fit the GPU budget";
  return out;
}

}  // namespace offloadd::trainer
