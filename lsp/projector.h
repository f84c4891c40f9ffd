#pragma once
// LSP-Offload's learned d-sparse subspace projectors (../shared/seeds/lsp-offload.txt
// §4.1, Alg. 2, Def. 1).
//
// A weight matrix W [m, n] is trained as W = W_base + P A Q^T with P [m, s_m] and Q [n, s_n]
// d-sparse (d nonzeros per row, at distinct columns) and A [s_m, s_n] the trained coordinates.
// The gradient of the loss with respect to A is P^T G Q (G = dL/dW), so Adam on A with the
// compressed gradient is exactly Adam on this reparameterised model: the CPU updates s_m x s_n
// numbers per matrix instead of m x n, and only those cross PCIe.
//
// Every product here costs O(m n d) or O((m + n) d s) and never forms a dense projector; Dense()
// exists for tests, the re-projection and debugging. Values are fp32; gradients may be bf16, fp16
// or fp32 and are accumulated in fp32. Device-agnostic ATen: the same code runs on the CPU (CI)
// and on CUDA.
#include <ATen/core/Tensor.h>

#include <cstdint>

#include "common/status.h"

namespace offloadd::lsp {

// A [rows, cols] matrix with `nonzeros` entries per row at distinct columns.
class SparseProjector {
 public:
  SparseProjector() = default;
  // Positions uniform without replacement per row, values N(0, 1/d) (standard deviation
  // 1/sqrt(d)), so that E[P P^T] = I and the compressor P P^T G Q Q^T is unbiased (§4.1).
  // Drawn on the CPU from `seed` and moved to `device`: the same seed gives the same projector
  // everywhere.
  static SparseProjector Random(int64_t rows, int64_t cols, int64_t nonzeros, uint64_t seed,
                                at::Device device);
  // The identity (rows == cols, one nonzero of 1 per row).
  static SparseProjector Identity(int64_t n, at::Device device);
  // From saved positions [rows, d] (int64, distinct per row, in [0, cols)) and values [rows, d].
  static StatusOr<SparseProjector> FromParts(int64_t cols, const at::Tensor& index,
                                             const at::Tensor& values);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t nonzeros() const { return index_.defined() ? index_.size(0) : 0; }
  // [rows, d] views of the positions and values (stored [d, rows] so each pass reads a
  // contiguous column of them).
  at::Tensor index() const { return index_.t(); }
  at::Tensor values() const { return values_.t(); }
  // The same positions with other values (the projector learning's trial values, [rows, d]).
  SparseProjector WithValues(const at::Tensor& values) const;
  SparseProjector To(at::Device device) const;

  at::Tensor ProjectRows(const at::Tensor& x) const;     // P^T x: [rows, k] -> [cols, k]
  at::Tensor ProjectColumns(const at::Tensor& x) const;  // x P:   [k, rows] -> [k, cols]
  at::Tensor Expand(const at::Tensor& y) const;          // P y:   [cols, k] -> [rows, k]
  at::Tensor ExpandColumns(const at::Tensor& z) const;   // z P^T: [k, cols] -> [k, rows]
  // [rows, cols] in `dtype` (positions are distinct per row, so each entry is one value, rounded once).
  at::Tensor Dense(at::ScalarType dtype = at::kFloat) const;

 private:
  at::Tensor Project(const at::Tensor& x, int64_t dim) const;  // P^T applied along dim
  at::Tensor Gather(const at::Tensor& y, int64_t dim) const;   // P applied along dim

  int64_t rows_ = 0, cols_ = 0;
  at::Tensor index_;   // [d, rows] int64
  at::Tensor values_;  // [d, rows] fp32
};

struct LearnOptions {
  int steps = 50;        // Adam steps on the projector values
  double lr = 1e-2;
  double gamma = 1e-4;   // the seed's norm regulariser, on ||P||_F^2 + ||Q||_F^2
  uint64_t seed = 0;     // positions and initial values of the new projectors
  // The dtype of the learning loop's G-sized GEMMs (P^T G and its gradient) in the GEMM form
  // (CUDA): fp32 by default; the trainer's LSP mode on CUDA passes its compute dtype (bf16), whose
  // tensor-core GEMMs are ~10x faster. P^T G accumulates in fp32 either way and is rounded once to
  // this dtype; everything s x s stays fp32, and the biases reported (and the threshold decision)
  // are computed in fp32 whatever this is.
  at::ScalarType gemm_dtype = at::kFloat;
};

struct LearnReport {
  double bias_before = 0;  // RelativeBias of the old projectors on the gradient
  double bias_initial = 0; // of the freshly drawn ones
  double bias_after = 0;   // of the learned ones
  int steps = 0;
};

// The projector pair of one weight matrix [m, n] (P: [m, s_m], Q: [n, s_n]).
class ProjectorPair {
 public:
  ProjectorPair() = default;
  ProjectorPair(SparseProjector p, SparseProjector q) : p_(std::move(p)), q_(std::move(q)) {}
  // s and d clamped to the shape: s_m = min(s, m), s_n = min(s, n), d <= s per side. P and Q get
  // different streams of `seed`.
  static ProjectorPair Random(int64_t m, int64_t n, int64_t s, int64_t d, uint64_t seed,
                              at::Device device);
  static ProjectorPair Identity(int64_t m, int64_t n, at::Device device);

  const SparseProjector& p() const { return p_; }
  const SparseProjector& q() const { return q_; }
  int64_t rank_rows() const { return p_.cols(); }  // s_m
  int64_t rank_cols() const { return q_.cols(); }  // s_n

  at::Tensor Compress(const at::Tensor& g) const;    // P^T G Q: [m, n] -> [s_m, s_n] fp32
  at::Tensor Decompress(const at::Tensor& a) const;  // P A Q^T: [s_m, s_n] -> [m, n] fp32
  // ||P P^T G Q Q^T - G||_F^2 / ||G||_F^2: the empirical bias of the compressor on G, relative
  // (0 when G lies in the subspace; 0 for a zero G).
  double RelativeBias(const at::Tensor& g) const;

  // UpdateSubspace (Alg. 2): fresh projectors (same s, d; positions and values from opt.seed)
  // whose values minimise ||P P^T G Q Q^T - G||_F^2 / ||G||_F^2 + gamma (||P||_F^2 + ||Q||_F^2)
  // at fixed positions, by Adam. The loss is taken relative to ||G||^2 so that the learning rate
  // does not depend on the gradient's scale.
  ProjectorPair Learn(const at::Tensor& g, const LearnOptions& opt, LearnReport* report) const;

  // Adam's moments of the old subspace carried into this one (Alg. 2):
  //   M <- (P^T P_old) M (Q_old^T Q)        V <- (P^T P_old)^2 V (Q_old^T Q)^2  (squares elementwise)
  // The seed writes the products as P^T P_old M Q_old Q^T; with P [m, s] and Q [n, s] the
  // shape-consistent reading is the one above, which maps an old compressed gradient
  // P_old^T G Q_old to the new compression of its old reconstruction.
  void Reproject(const ProjectorPair& old, at::Tensor* exp_avg, at::Tensor* exp_avg_sq) const;

 private:
  static ProjectorPair Draw(int64_t m, int64_t sm, int64_t dm, int64_t n, int64_t sn, int64_t dn,
                            uint64_t seed, at::Device device);

  SparseProjector p_, q_;
};

}  // namespace offloadd::lsp
