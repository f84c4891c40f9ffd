#pragma once
// What a training step holds on the GPU beyond the static estimate's saved activations, weights
// and workspace (trainer_batch.cc EstimateMemory), for the two cases the estimate priced as if
// they were the plain step (Llama-2-7B, LSP, packed Alpaca records, batch 8 in
// 24 GiB ran out of memory in layer 31's backward):
//   - packed batches (segment ids) attend within documents (engine/doc_attention.h): the
//     variable-length flash kernels' layout copies and fp32 accumulators, or the tiled path's
//     tile and fp32 gradients, O(seq) per head (no [seq, seq] tensor: the mask path is gone);
//   - LSP on CUDA: the resident W_base and sparse projectors, each computing block's effective
//     weights W_base + P A Q^T, the products and densified projectors that build them, the
//     compression P^T G Q of each gradient, and the projector check's dense fp32 gradients.
// Priced at the job's shape (batch x max_seq_length) from the shapes alone, so that a plan that
// does not fit is refused before the first step, naming the largest micro-batch that fits.
//
// Torch-free (tests/job/working_set_test.cc); the trainer fills the shapes.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace offloadd::trainer {

// Peak bytes of a packed micro-batch's attention inside one layer's backward, beyond the saved
// activations (one layer at a time), for n = batch * seq tokens of head size d:
//   varlen_flash (CUDA, 16-bit): the [n, heads, d] layout copies of q, d out (and k, v at
//     kv_heads), the kernel's fp32 d q accumulator, and d k, d v expanded to every query head
//     before the group sum: n d (heads (3 elem + 4) + 2 kv_heads elem);
//   tiled (CPU, fp32, soft-capping): one query tile's scores (engine/tiles.h: at most
//     kTileScoreBytes of fp32, its rows at seq keys), five copies of them (elem + 4 x 4 bytes per
//     fp32-sized score, rounded up to 5 x 4), the repeated keys and values of a tile, and the
//     fp32 d k, d v: 5 tile + 2 seq heads d elem + 2 n kv_heads d 4.
int64_t DocumentAttentionBytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int64_t elem, bool varlen_flash);

// One LSP-compressed weight: [rows, cols] trained as W_base + P A Q^T with A [rank_rows,
// rank_cols]; P has rows x nonzeros entries, Q cols x nonzeros.
struct LspMatrixShape {
  int block = 0;
  int64_t rows = 0, cols = 0, rank_rows = 0, rank_cols = 0, nonzeros = 0;
};

struct LspWorkingSet {
  int64_t resident = 0;         // W_base of every matrix (compute dtype) and the sparse P, Q
  int64_t block_effective = 0;  // the largest block's effective weights (compute dtype)
  int64_t materialize = 0;      // building one matrix: dense P, Q, P A, A cast (largest matrix)
  int64_t compress = 0;  // compressing one gradient: dense P, P^T G (dtype, fp32), Q fp32, result
  int64_t check = 0;     // the projector check: a block's dense fp32 gradients + learning
  // Everything at once for `materialized_blocks` blocks' effective weights (the streaming
  // window's, while they compute): resident + n * block_effective + the largest transient.
  int64_t Total(int materialized_blocks) const;
  std::string Describe(int materialized_blocks) const;
};

LspWorkingSet PriceLspWorkingSet(const std::vector<LspMatrixShape>& matrices, int64_t elem);

// The largest b in [1, max_batch] with fits(b), for fits monotone (true up to some b, false
// after); 0 when not even 1 fits. Bisects: O(log max_batch) calls.
int LargestFittingBatch(int max_batch, const std::function<bool(int)>& fits);
// The largest multiple of 8 in [8, max_len] with fits(len), for fits monotone in the length
// (a refusal's "the largest max_seq_length that fits"); 0 when not even 8 fits.
int64_t LargestFittingLength(int64_t max_len, const std::function<bool(int64_t)>& fits);

}  // namespace offloadd::trainer
