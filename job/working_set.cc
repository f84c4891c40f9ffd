#include "job/working_set.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "common/units.h"
#include "engine/tiles.h"

namespace offloadd::trainer {

int64_t DocumentAttentionBytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int64_t elem, bool varlen_flash) {
  const int64_t n = batch * seq;
  if (varlen_flash) return n * head_dim * (heads * (3 * elem + 4) + 2 * kv_heads * elem);
  const int64_t tile_scores = engine::QueryTile(heads, seq) * heads * seq * 4;
  return 5 * tile_scores + 2 * seq * heads * head_dim * elem + 2 * n * kv_heads * head_dim * 4;
}

int64_t LspWorkingSet::Total(int materialized_blocks) const {
  return resident + materialized_blocks * block_effective +
         std::max({materialize, compress, check});
}

std::string LspWorkingSet::Describe(int materialized_blocks) const {
  auto b = [](int64_t v) { return FormatByteSize(static_cast<uint64_t>(std::max<int64_t>(0, v))); };
  std::ostringstream o;
  o << "LSP " << b(Total(materialized_blocks)) << ": W_base and projectors " << b(resident) << ", "
    << materialized_blocks << " blocks' effective weights "
    << b(materialized_blocks * block_effective) << ", the largest of building one ("
    << b(materialize) << "), compressing one gradient (" << b(compress)
    << ") and the projector check (" << b(check) << ")";
  return o.str();
}

LspWorkingSet PriceLspWorkingSet(const std::vector<LspMatrixShape>& matrices, int64_t elem) {
  LspWorkingSet w;
  std::map<int, int64_t> effective, grads32;
  int64_t largest_grad = 0;
  for (const LspMatrixShape& m : matrices) {
    const int64_t mn = m.rows * m.cols;
    // W_base in the compute dtype; P and Q as (position int64, value fp32) per nonzero.
    w.resident += mn * elem + (m.rows + m.cols) * m.nonzeros * 12;
    effective[m.block] += mn * elem;
    grads32[m.block] += mn * 4;
    largest_grad = std::max(largest_grad, mn);
    // LspMode::EffectiveDense: P dense (rows x s), A cast (s x s), P A (rows x s), Q dense
    // (cols x s), all in the compute dtype, and addmm's output (rows x cols) being written.
    const int64_t s = std::max(m.rank_rows, m.rank_cols);
    w.materialize =
        std::max(w.materialize, (m.rows * s * 2 + m.cols * s + s * s) * elem + mn * elem);
    // LspMode::CompressDense: P dense (rows x s, dtype), P^T G (s x cols, dtype, then fp32),
    // Q dense fp32 (cols x s), the fp32 result (s x s) and its cast.
    w.compress = std::max(w.compress, m.rows * s * elem + m.cols * s * (elem + 4) + m.cols * s * 4 +
                                          s * s * (4 + elem));
  }
  for (const auto& [block, bytes] : effective)
    w.block_effective = std::max(w.block_effective, bytes);
  // The check (StepSchedule::ProbeGradients): a block's gradients as fp32 while its matrices are
  // checked, the largest one's compute-dtype copy for the learning GEMMs, and its residual's
  // dense fp32 projectors.
  int64_t block_grads = 0;
  for (const auto& [block, bytes] : grads32) block_grads = std::max(block_grads, bytes);
  w.check = block_grads + largest_grad * (elem + 4);
  return w;
}

int LargestFittingBatch(int max_batch, const std::function<bool(int)>& fits) {
  if (max_batch < 1 || !fits(1)) return 0;
  int lo = 1, hi = max_batch;  // fits(lo)
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

int64_t LargestFittingLength(int64_t max_len, const std::function<bool(int64_t)>& fits) {
  const int64_t steps = max_len / 8;
  if (steps <= 0) return 0;
  int64_t lo = 0, hi = steps;  // fits(8 lo) holds (lo = 0: nothing checked yet)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(8 * mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return 8 * lo;
}

}  // namespace offloadd::trainer
