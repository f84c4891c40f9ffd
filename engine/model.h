#pragma once
// Layer-granular causal language model for offloaded training.
//
// A Model is a list of Blocks: [embedding, decoder layer 0..N-1, head (final norm + LM head +
// loss)]. A scheduler drives them one by one:
//
//   MicroBatch mb = *model.PrepareBatch(ids, targets, total_trained_tokens);
//   at::Tensor x;                       std::vector<SavedState> saved(model.num_blocks());
//   for (i = 0 .. n-1)  x = *model.block(i).Forward(mb, x, mode[i], &saved[i], &offload);
//   at::Tensor g;                       // head ignores grad_out (d loss / d loss = 1)
//   for (i = n-1 .. 0)  g = *model.block(i).Backward(mb, g, &saved[i], on_grad, &offload);
//
// Per block the caller chooses what is kept for backward (SaveMode): everything on the device
// (kKeep), only the block input, recomputing the rest at backward time (kRecompute), or everything
// handed to OffloadCallbacks::offload and fetched back before backward (kOffload). All three run
// the same explicit backward math, so they give bit-identical gradients. Parameter gradients are
// delivered to the GradCallback during that block's Backward, before it returns, so an optimizer
// can consume them while the GPU moves on to the previous block (LoHan's active gradient
// offloading, OFFMATE's "optimize as soon as the last gradient is produced").
//
// Each block owns its parameters (Block::params(), Hugging Face names); a scheduler may replace a
// Param's tensor (same shape) to stream it in or out, e.g. a bf16 GPU copy for the step and an
// undefined tensor otherwise. Compute uses whatever tensors are installed; they must all be on the
// input's device in the compute dtype (checked, FAILED_PRECONDITION otherwise). Tied weights: the
// head *uses* the embedding's Param (Block::shared_params()); its gradient is delivered twice per
// micro-batch (head backward, then embedding backward) under the same name and must be summed.
//
// Numerics follow transformers' modeling code (casts included): bf16 (or fp16/fp32) compute, norms
// and softmax statistics in fp32, loss in fp32 = sum of token cross-entropies over targets that are
// not kIgnoreIndex, divided by MicroBatch::num_trained_tokens (the trained-token count of the
// whole optimizer step, so gradient accumulation over micro-batches needs no rescaling).
// Attention uses ATen's fused flash / memory-efficient SDPA kernels (CPU flash kernel on CPU).
// Dropout is not applied (fine-tuning runs with it off).
//
// Thread-compatibility: a Model and its Blocks are not thread-safe; callbacks run on the calling
// thread. This header pulls in ATen's Tensor only; include it from torch-linked code.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/doc_attention.h"
#include "engine/model_config.h"

namespace offloadd::engine {

inline constexpr int64_t kIgnoreIndex = -100;

enum class SaveMode {
  kKeep,       // saved tensors stay where forward produced them
  kRecompute,  // only the block input is saved; backward re-runs the forward first
  kOffload,    // saved tensors go to OffloadCallbacks::offload; backward fetches them back
  kNone,       // inference: nothing saved, Backward refuses
};
std::string_view SaveModeName(SaveMode mode);

// Mixture-of-experts router statistics of one micro-batch for transformers' load-balancing loss
// (load_balancing_loss_func without an attention mask: every row of every sparse layer). Each
// sparse layer's forward sets its entry (a recompute sets the same values again); the head adds
// aux_coef * AuxLoss() to the loss, and each sparse layer's backward adds the loss's gradient.
struct MoeRouterStats {
  int64_t num_experts = 0;
  double aux_coef = 0;
  // Per layer (undefined for dense layers; data parallel: one more, the other ranks' rows): top-k
  // assignments per expert and the routing probabilities summed over the rows, fp32 [E]; rows.
  std::vector<at::Tensor> counts, prob_sums;
  std::vector<int64_t> rows;
  // E * sum_e (counts_e / R) * (prob_sums_e / R), R = all layers' rows; fp32 scalar (0 when no
  // layer has run).
  at::Tensor AuxLoss() const;
  // d AuxLoss / d (one row's probability of expert e) = E * counts_e / R^2, fp32 [E].
  at::Tensor AuxProbGrad() const;
};

// Inputs shared by all blocks for one micro-batch; build it with Model::PrepareBatch.
struct MicroBatch {
  at::Tensor input_ids;           // [B, T] int64
  at::Tensor position_ids;        // [B, T] int64 (rotary / learned positions)
  at::Tensor targets;             // [B, T] int64 next-token targets (already shifted), or undefined
  double num_trained_tokens = 0;  // loss normaliser, see above
  // fp16 dynamic loss scaling: the head's gradients (and so every block's) are of
  // loss * loss_scale; the loss the head returns is not scaled. Set it before the head's Forward.
  double loss_scale = 1.0;
  at::Tensor segment_ids;         // [B, T] int64 packed-document ids, or undefined (one document)
  at::Tensor rope_cos, rope_sin;  // [B, T, rotary_dim] in the compute dtype (rotary families)
  at::Tensor rope_cos_local, rope_sin_local;  // sliding layers' own tables (has_local_rope)
  // The documents attention stays within (engine/doc_attention.h; no [T, T] mask is built): the
  // runs of segment_ids when packed, else one per row when some layer needs the document path
  // (soft-capping, or a sliding window shorter than T that the fused kernels cannot take).
  ops::Documents docs;
  // Set when the model adds the MoE load-balancing loss (MoeConfig::output_router_logits).
  std::shared_ptr<MoeRouterStats> moe;
};

struct Param {
  std::string name;  // Hugging Face tensor name, e.g. "model.layers.3.mlp.up_proj.weight"
  at::Tensor value;
};

// Called once per parameter (per contributing block) with d loss / d param, in the compute dtype
// on the compute device. The tensor is freshly allocated; the callee may keep it.
using GradCallback = std::function<void(const std::string& name, const at::Tensor& grad)>;

// Activation offloading hooks (SaveMode::kOffload). `offload` takes ownership of a block's saved
// tensors (copy them to pinned host memory or NVMe, then drop them) and returns a ticket; `fetch`
// returns the same tensors (same order, shapes and dtypes) on the compute device. Both run on the
// calling thread inside Forward/Backward; a scheduler that prefetches block i-1 while block i
// runs its backward starts the copies itself and has `fetch` wait for them (making the compute
// stream wait on its copy stream's event).
struct OffloadCallbacks {
  std::function<StatusOr<uint64_t>(int block, std::vector<at::Tensor> saved)> offload;
  std::function<StatusOr<std::vector<at::Tensor>>(int block, uint64_t ticket)> fetch;
};

// What one block's Forward left for its Backward. Move-only, reusable across steps.
class SavedState {
 public:
  SaveMode mode() const { return mode_; }
  bool ready() const { return ready_; }
  // Tensors held right now (kKeep: all saved tensors; kRecompute: {input}; kOffload: none).
  // A scheduler may move them elsewhere as long as they are back, unchanged, before Backward.
  std::vector<at::Tensor>& tensors() { return tensors_; }
  int64_t held_bytes() const;
  void Clear();

 private:
  friend class Block;
  SaveMode mode_ = SaveMode::kNone;
  bool ready_ = false;
  std::vector<at::Tensor> tensors_;
  uint64_t ticket_ = 0;
  size_t count_ = 0;
};

// Sizes a scheduler plans with (LoHan's profiler inputs, OFFMATE's per-block options).
struct BlockCost {
  int64_t param_bytes = 0;            // parameters this block owns, in their current dtype
  int64_t saved_bytes_keep = 0;       // held (kKeep) or offloaded (kOffload) between fwd and bwd
  int64_t saved_bytes_recompute = 0;  // held with kRecompute (the block input)
  double forward_flops = 0;           // matmul FLOPs of one training forward = recompute cost
};

class Block {
 public:
  enum class Kind { kEmbedding, kDecoderLayer, kHead };
  virtual ~Block() = default;
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  Kind kind() const { return kind_; }
  int index() const { return index_; }
  const std::string& name() const { return name_; }  // "model.layers.3", "embedding", "head"
  // Parameters this block owns. Stable addresses (never resized after construction).
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  // Parameters used here but owned by another block (the tied LM head's embedding weight).
  const std::vector<Param*>& shared_params() const { return shared_; }
  // Converts the owned parameters in place (e.g. to CUDA bf16).
  Status To(c10::Device device, c10::ScalarType dtype);

  // x: block input ([B, T, hidden]; ignored by the embedding, which reads mb.input_ids).
  // Returns the output hidden states; the head returns the fp32 scalar loss. `saved` receives
  // what Backward needs (unused with kNone); `offload` is required for kOffload.
  StatusOr<at::Tensor> Forward(const MicroBatch& mb, const at::Tensor& x, SaveMode mode,
                               SavedState* saved, const OffloadCallbacks* offload = nullptr);
  // mb must be the MicroBatch given to the matching Forward (kRecompute re-runs it).
  // grad_out: d loss / d output (the head takes an optional scalar loss scale, undefined = 1).
  // Returns d loss / d x (undefined for the embedding); calls on_grad for every parameter used
  // before returning; clears `saved`.
  StatusOr<at::Tensor> Backward(const MicroBatch& mb, const at::Tensor& grad_out, SavedState* saved,
                                const GradCallback& on_grad,
                                const OffloadCallbacks* offload = nullptr);
  // Head only: logits [B, T, vocab] in the compute dtype, no loss, nothing saved.
  StatusOr<at::Tensor> Logits(const MicroBatch& mb, const at::Tensor& x);

  // Estimated sizes for a micro-batch of [batch, seq] tokens computed in `dtype` without packing
  // (packed batches save the same: attention keeps no [seq, seq] tensor).
  // saved_bytes_keep equals SavedState::held_bytes() after a kKeep forward on CPU; on CUDA the
  // attention kernels' logsumexp may be padded by a few percent.
  virtual BlockCost EstimateCost(int64_t batch, int64_t seq, c10::ScalarType dtype) const;
  // Measured: the bytes of the tensors the last training Forward saved (kKeep, kOffload) or the
  // last recompute in Backward re-created (kRecompute), i.e. what keeping this block's
  // activations holds for the last micro-batch shape; 0 before any (the planner's profile).
  int64_t last_saved_bytes() const { return last_saved_bytes_; }

 protected:
  Block(Kind kind, int index, std::string name)
      : kind_(kind), index_(index), name_(std::move(name)) {}
  // The math. Fills `saved` (when non-null) with what Backprop needs.
  virtual at::Tensor Run(const MicroBatch& mb, const at::Tensor& x,
                         std::vector<at::Tensor>* saved) = 0;
  virtual at::Tensor Backprop(const MicroBatch& mb, const at::Tensor& grad_out,
                              std::vector<at::Tensor>& saved, const GradCallback& on_grad) = 0;
  virtual at::Tensor RunLogits(const MicroBatch& mb, const at::Tensor& x);
  const at::Tensor& P(size_t i) const { return params_[i].value; }
  int64_t OwnedParamBytes() const;

  Kind kind_;
  int index_;
  std::string name_;
  std::vector<Param> params_;
  std::vector<Param*> shared_;

 private:
  Status CheckPlacement(const at::Tensor& like) const;
  int64_t last_saved_bytes_ = 0;
};

struct LoadOptions {
  c10::ScalarType dtype = c10::kFloat;  // parameter dtype after loading
  c10::Device device = c10::Device(c10::kCPU);
  // kEager: every parameter is read now. kLazy: parameters are placeholders on the meta device
  // (shape and dtype only) and a scheduler materializes them one at a time with
  // Model::ReadInitialValue, so a model larger than host memory can be streamed into the offload
  // arena. kRandom: like kLazy but without a checkpoint (config.json only); ReadInitialValue
  // draws transformers' initialisation (normal(0, initializer_range) for matrices and
  // embeddings, ones for norm weights, zeros for biases) from a per-parameter seeded generator.
  enum class Materialize { kEager, kLazy, kRandom };
  Materialize materialize = Materialize::kEager;
  uint64_t random_seed = 0;
};

class Model {
 public:
  // Reads dir/config.json and the safetensors checkpoint (single file or sharded). Shapes, dtypes
  // (F32/F16/BF16) and names are checked; GPT-2's attention mask buffers are ignored.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                               const LoadOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  Block& block(int i) { return *blocks_[i]; }
  const Block& block(int i) const { return *blocks_[i]; }
  c10::Device device() const { return device_; }
  c10::ScalarType dtype() const { return dtype_; }
  Status To(c10::Device device, c10::ScalarType dtype);
  // Records where a scheduler places the parameters itself (it installs every Param's tensor on
  // `device` in `dtype` before compute): batches are then prepared on that device.
  void AssumePlacement(c10::Device device, c10::ScalarType dtype);

  // Validates ids/targets (shape, range, sequence length) and moves them to the model's device.
  // position_ids defaults to 0..T-1 per row. targets may be undefined (inference).
  // segment_ids (packing): tokens attend only within their own segment; pair it with
  // position_ids restarting at 0 per segment. A segment is a run of equal ids within a row;
  // packed batches attend within each run (variable-length flash on CUDA, a tiled exact path
  // elsewhere), with O(T) memory per head: no [T, T] mask is built.
  StatusOr<MicroBatch> PrepareBatch(const at::Tensor& input_ids, const at::Tensor& targets,
                                    double num_trained_tokens,
                                    const at::Tensor& position_ids = at::Tensor(),
                                    const at::Tensor& segment_ids = at::Tensor()) const;

  // The checkpoint value of parameter `name` (kLazy) or its random initial value (kRandom), as an
  // fp32 CPU tensor; also valid after kEager loading (re-reads the checkpoint).
  StatusOr<at::Tensor> ReadInitialValue(const std::string& name) const;
  // Elements [begin, begin + count) of that value, converted to fp32 straight from the
  // checkpoint's mapping into dst (no intermediate tensors), so that disjoint pieces of one
  // parameter can be read on several threads at once. Thread-safe. Without a checkpoint (kRandom)
  // a value is drawn whole: only begin 0 with count = numel.
  Status ReadInitialValueInto(const std::string& name, int64_t begin, int64_t count,
                              float* dst) const;
  bool has_checkpoint() const;

  // Whole-model helpers over the block API.
  StatusOr<at::Tensor> Logits(const MicroBatch& mb);
  // Forward + backward of every block with modes[i] (size num_blocks(), or empty = all kKeep).
  // Returns the loss.
  StatusOr<at::Tensor> ForwardBackward(const MicroBatch& mb, const std::vector<SaveMode>& modes,
                                       const GradCallback& on_grad,
                                       const OffloadCallbacks* offload = nullptr);
  // Greedy decoding without a KV cache (re-runs the prefix each step): for demos and checks.
  StatusOr<std::vector<int64_t>> GenerateGreedy(const std::vector<int64_t>& prompt,
                                                int64_t max_new_tokens,
                                                const std::vector<int64_t>& stop_ids);

  // Writes the current parameters to out_dir with the input checkpoint's tensor names, shard
  // layout and per-tensor dtypes (tied weights written once, as in the input; ignored buffers
  // copied verbatim) plus config.json, generation config and tokenizer files, so
  // transformers.AutoModelForCausalLM.from_pretrained(out_dir) loads it. out_dir must not be the
  // source directory.
  Status Export(const std::string& out_dir) const;

  // How each part of the decoder layers runs on `device` in `dtype` at sequence length `seq`:
  // "attention: fused", "norm: aten (why)", ... one entry per distinct line (the plan log says
  // which part fell back from a fused kernel to LibTorch ops).
  std::vector<std::string> DescribeKernels(c10::Device device, c10::ScalarType dtype,
                                         int64_t seq) const;

  // Helper: HF labels [B, T] (aligned with input_ids) -> next-token targets (shift left by one,
  // last position kIgnoreIndex), as transformers' ForCausalLMLoss does.
  static at::Tensor ShiftLabels(const at::Tensor& labels);
  static int64_t CountTrainedTokens(const at::Tensor& targets);

 private:
  struct Source;
  Model() = default;
  static StatusOr<std::unique_ptr<Model>> CreateRandom(std::unique_ptr<Model> m,
                                                       const LoadOptions& options);
  ModelConfig config_;
  std::string dir_;
  c10::Device device_ = c10::Device(c10::kCPU);
  c10::ScalarType dtype_ = c10::kFloat;
  std::vector<std::unique_ptr<Block>> blocks_;
  std::unique_ptr<Source> source_;
  uint64_t random_seed_ = 0;
  double init_std_ = 0.02;
};

}  // namespace offloadd::engine
