#pragma once
// Causal attention within documents, without a [T, T] mask (engine-internal).
//
// A packed micro-batch's documents are described by their offsets into the flattened [B * T]
// token sequence (FlashAttention's cu_seqlens), not by a dense [B, 1, T, T] mask: at T = 32K the
// mask alone is 2 GiB in bf16 and it rules out the fused kernels. Two implementations share
// DocumentAttention / DocumentAttentionBackward:
//   - CUDA, bf16/fp16, head size a multiple of 8 up to 256, no logit soft-capping:
//   FlashAttention-2's
//     variable-length kernels (at::_flash_attention_forward/backward with cum_seq_q/k), with the
//     kernel's own sliding window (window_size_left) and grouped-query heads as they are;
//   - otherwise (CPU, fp32, Gemma 2's soft-capping): an exact tiled implementation that walks each
//     document in query tiles, attending each tile to its document's keys up to the tile's end
//     (or the window's start). Its arithmetic is transformers' eager attention restricted to the
//     visible keys (scores in the compute dtype, softmax in fp32, probabilities cast back), so it
//     matches the masked reference to rounding; no tensor larger than O(T) per head is built.
//     The backward recomputes each tile's probabilities (nothing O(T^2) is saved) and accumulates
//     d K and d V in fp32 before one rounding.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/tiles.h"

namespace offloadd::engine::ops {

// The documents of a micro-batch [B, T]: runs of equal segment ids within a row (a run ends where
// the id changes or the row ends), as offsets into the flattened B * T tokens.
struct Documents {
  at::Tensor cu_seqlens;         // int32 [n + 1] on the compute device (the flash kernels')
  std::vector<int64_t> offsets;  // the same on the host: 0 = offsets[0] < ... < offsets[n] = B * T
  int64_t seq = 0;               // T (documents never cross a row)
  int64_t max_len = 0;           // the longest document
  bool defined() const { return !offsets.empty(); }
};
// From segment_ids [B, T] int64 (any device); the result's tensor lives on `device`.
Documents DocumentsOf(const at::Tensor& segment_ids, c10::Device device);
// One document per row (unpacked rows that still need the tiled path, e.g. soft-capping).
Documents RowDocuments(int64_t batch, int64_t seq, c10::Device device);

// Whether the variable-length flash kernels run for these inputs (else the tiled path).
bool VarlenFlashFits(c10::Device device, c10::ScalarType dtype, int64_t head_dim, double softcap);

// q: [B, Hq, T, D]; k, v: [B, Hkv, T, D] with Hq % Hkv == 0. Token i attends to token j iff both
// are in the same document, j <= i and, with window > 0, i - j < window. softcap > 0 caps the
// scaled logits as softcap * tanh(logits / softcap) (tiled path only). Returns out [B, Hq, T, D]
// (possibly a strided view); appends to `aux` what the backward needs besides q, k, v, out.
// `sinks` ([Hq], gpt-oss's attention sinks): one more logit per head in every query's softmax
// denominator, attending to nothing (tiled path; the backward gives d sinks, fp32-summed).
at::Tensor DocumentAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             double scale, const Documents& docs, int64_t window, double softcap,
                             std::vector<at::Tensor>* aux, const at::Tensor& sinks = at::Tensor());
void DocumentAttentionBackward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& out, const at::Tensor* aux,
                               double scale, const Documents& docs, int64_t window, double softcap,
                               at::Tensor* dq, at::Tensor* dk, at::Tensor* dv,
                               const at::Tensor& sinks = at::Tensor(),
                               at::Tensor* dsinks = nullptr);

// The tiled path's query tile: engine/tiles.h (QueryTile, kTileScoreBytes).

}  // namespace offloadd::engine::ops
