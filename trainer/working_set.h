#pragma once
// What a training step holds on the GPU beyond the static estimate's saved activations, weights
// and workspace (trainer_batch.cc EstimateMemory), for the two cases the estimate priced as if
// they were the plain step (Llama-2-7B, LSP, packed Alpaca records, batch 8 in
// 24 GiB ran out of memory in layer 31's backward):
//   - packed batches (segment ids) take the explicit-softmax attention path (engine/ops.cc
//     Attention / AttentionBackward), whose [batch, heads, seq, seq] scores, probabilities and
//     their gradients are O(seq^2) per head instead of the fused kernels' O(seq);
//   - LSP on CUDA: the resident W_base and sparse projectors, each computing block's effective
//     weights W_base + P A Q^T, the products and densified projectors that build them, the
//     compression P^T G Q of each gradient, and the projector check's dense fp32 gradients.
// Priced at the job's shape (batch x max_seq_length) from the shapes alone, so that a plan that
// does not fit is refused before the first step, naming the largest micro-batch that fits.
//
// Torch-free (tests/trainer/working_set_test.cc); the trainer fills the shapes.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace offloadd::trainer {

// Peak bytes of the explicit-softmax attention inside one layer's backward at [batch, heads,
// seq, seq], beyond the saved activations (one such layer at a time: recompute, then backward).
// In AttentionBackward's softmax-backward statement every temporary lives to its end: the saved
// probabilities p and dp = dout V^T (elem each), dp and p upcast to fp32, the fp32 result, its
// cast back and the scaled product (elem each): (4 elem + 12) bytes per score. The recompute's
// forward peak (scores, their scaled and masked copies, the fp32 softmax) is below it.
int64_t PackedAttentionBytes(int64_t batch, int64_t seq, int64_t heads, int64_t elem);
// The micro-batch's additive mask [batch, 1, seq, seq] in the compute dtype (ops::SegmentMask),
// held while the micro-batch is, plus its construction's boolean temporaries.
int64_t PackedMaskBytes(int64_t batch, int64_t seq, int64_t elem);

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

}  // namespace offloadd::trainer
