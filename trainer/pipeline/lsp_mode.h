#pragma once
// LspMode: the trainer's LSP-Offload mode (lsp/README.md, ../shared/seeds/lsp-offload.txt
// Alg. 2). Every 2-D weight of a decoder layer is trained as W = W_base + P A Q^T:
//   - the block layout's slot for such a weight holds its subspace coordinates A ([s_m, s_n], a
//     shadow Param "<weight>.lsp_a"), so the host optimizer's shard, the CPU workers' AdamW,
//     clipping and checkpoints all work on A (Adam on A with P^T G Q is Adam on the
//     reparameterised model);
//   - the backward's gradient G of the weight is compressed to P^T G Q into that slot;
//   - after each update of a block, its weights are rebuilt as W_base + P A Q^T (OnUpdated);
//   - every `check_every` steps (and at the first), the projectors are checked on a probe
//     gradient and re-learned where their bias reaches the threshold; A is then folded into
//     W_base and Adam's moments re-projected (lsp::SwitchSubspace).
// Embeddings, norms, biases and the head stay exact.
//
// On the CPU device (fp32) each weight's effective value W_base + P A Q^T is kept and rebuilt after
// each update. On CUDA (bf16) that would hold every weight twice, which a 7B model in 24 GiB
// cannot: W_base stays resident in bf16 (the model's own weights), A reaches the device in bf16
// with the block's other weights (norms; WeightResidency, like any streamed block), and a block's
// effective weights exist only while it computes (Materialize when its weights are ensured, Release
// after; W_base + (P A) Q^T as dense bf16 GEMMs with fp32 accumulation, rounded once). Compression
// is P^T G Q by the same GEMMs. lsp/README.md states the precision consequences.
//
// Thread-safety: OnUpdated runs on the host optimizer's thread for a block the step loop is not
// using (the next forward waits for the block's update); everything else is for the step loop.

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model.h"
#include "job/train_config.h"
#include "job/working_set.h"
#include "lsp/projector.h"
#include "trainer/pipeline/block_layout.h"

namespace offloadd::trainer {

class LspMode {
 public:
  // Rewrites `layout` (offsets re-laid) so that each compressed weight's slot holds its coordinates.
  static StatusOr<std::unique_ptr<LspMode>> Create(const LspConfig& config, uint64_t seed,
                                                   engine::Model* model, std::vector<BlockLayout>* layout,
                                                   c10::Device device, c10::ScalarType dtype);

  // The initial fp32 values of a slot's flat master: zeros for coordinates.
  bool IsCoordinates(const ParamSlot& slot) const { return slot.compressed != nullptr; }
  // W_base from the model's initial weights; binds each compressed weight to its effective tensor.
  Status Initialize(const engine::Model& model);
  // P^T G Q for the slot's weight, in the gradient's dtype.
  at::Tensor Compress(const ParamSlot& slot, const at::Tensor& grad) const;
  // Block b's coordinates (its flat fp32 masters) were updated: rebuild its weights (CPU) or
  // mark its effective weights stale (CUDA).
  Status OnUpdated(int b, const float* block_master);
  // CUDA: block b's effective weights, W_base + P A Q^T, on the current stream (a no-op when they
  // already are for the current A); Release frees them (the weights point at W_base meanwhile).
  void Materialize(int b);
  bool Stale(int b) const;  // CUDA: Materialize(b) has work to do
  void Release(int b);
  bool on_device() const { return device_.is_cuda(); }
  // Its GPU working set (CUDA; zero on the CPU device), priced from the matrices' shapes
  // (callable before Initialize): W_base and the projectors, a block's effective weights, and
  // the largest of materialising, compressing and the projector check (job/working_set.h).
  LspWorkingSet WorkingSet() const;

  // Reads/writes a block's fp32 states (master, exp_avg, exp_avg_sq; elements(b) floats each).
  struct StateAccess {
    std::function<Status(int b, std::vector<float>* master, std::vector<float>* m, std::vector<float>* v)> read;
    std::function<Status(int b, const std::vector<float>& master, const std::vector<float>& m,
                         const std::vector<float>& v)> restore;
  };
  struct CheckSummary {
    int checked = 0, switched = 0;
    double mean_bias = 0, mean_bias_after = 0;  // over the checked / the switched matrices
    double seconds = 0;
    // Of it: the bias checks and learning (CheckAndUpdate), and the switches (fold, moment
    // re-projection, state read/restore); host time, each synchronised by its scalar reads.
    double learn_seconds = 0, switch_seconds = 0;
  };
  bool CheckDue(int64_t step) const;  // step k (1-based) checks its projectors first
  // The projector check of Alg. 2 on `grads` (weight name -> dL/dW of a probe batch), between
  // steps: every update of the previous step must be done.
  StatusOr<CheckSummary> Check(int64_t step, const std::map<std::string, at::Tensor>& grads,
                               const StateAccess& states);

  // Projectors, W_base and the check state, as one safetensors file's bytes / from one.
  StatusOr<std::string> Serialize() const;
  Status Restore(const std::string& path);
  // "LSP s=512 d=16 on 154 matrices (...)".
  std::string Describe() const;
  int64_t coordinate_count() const;

 private:
  struct Matrix {
    int block = 0;
    size_t slot = 0;
    engine::Param* weight = nullptr;
    std::unique_ptr<engine::Param> coords;
    lsp::ProjectorPair pq;
    at::Tensor base;       // CPU: fp32 [m, n]; CUDA: compute dtype [m, n], resident
    at::Tensor effective;  // compute dtype [m, n], bound to `weight` (CUDA: while materialized)
    int64_t a_version = 0, materialized = -1;  // CUDA: effective is for A version `materialized`
  };
  // CUDA: W_base + P A Q^T and P^T G Q as dense GEMMs (P, Q densified per call: m x s and n x s).
  at::Tensor EffectiveDense(const Matrix& mx) const;
  at::Tensor CompressDense(const Matrix& mx, const at::Tensor& grad) const;
  LspMode(const LspConfig& config, uint64_t seed, std::vector<BlockLayout>* layout, c10::Device device,
          c10::ScalarType dtype)
      : cfg_(config), seed_(seed), layout_(*layout), device_(device), dtype_(dtype) {}
  at::Tensor Coordinates(const Matrix& mx, const float* block_master) const;
  void Rebuild(Matrix& mx, const float* block_master);

  const LspConfig cfg_;
  const uint64_t seed_;
  std::vector<BlockLayout>& layout_;
  const c10::Device device_;
  const c10::ScalarType dtype_;
  std::vector<Matrix> matrices_;
  std::map<std::string, size_t> by_weight_;  // weight name -> matrices_ index
  int64_t switches_ = 0;                     // subspace switches so far (a seed for the next draw)
};

// "lsp:rank=512,nonzeros=16,check_every=1000,threshold=0.5,learn_steps=50,learn_lr=0.01,gamma=1e-4"
// (any subset, in any order; "lsp" alone takes the defaults; "none" disables). Errors name the key.
Status ParseLspSpec(const std::string& spec, LspConfig* out);

}  // namespace offloadd::trainer
