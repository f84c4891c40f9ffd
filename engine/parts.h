#pragma once
// Engine-internal: the parts a decoder block is assembled from, as llama.cpp builds every
// architecture from build_norm / build_attn / build_ffn. A part registers its parameters with the
// block (ParamList, checkpoint names from ModelConfig::names), runs its forward appending what its
// backward needs to the block's saved list, and runs the analytic backward, emitting parameter
// gradients as they are computed. What is saved follows one rule: tensors that cost a matmul
// (projection outputs, attention output and statistics) are stored; elementwise results
// (normalised inputs, activations, rotated q/k after a q/k norm) are recomputed in backward.
// Numerics follow transformers' modeling code of each family, casts included.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"
#include "engine/ops.h"
#include "engine/tiles.h"

namespace offloadd::engine::parts {

inline constexpr size_t kAbsent = SIZE_MAX;
using Spec = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// A block's parameter specs in load order; Add returns the parameter's index in the block.
class ParamList {
 public:
  size_t Add(std::string name, std::vector<int64_t> shape) {
    specs_.emplace_back(std::move(name), std::move(shape));
    return specs_.size() - 1;
  }
  const Spec& specs() const { return specs_; }

 private:
  Spec specs_;
};

// The block's parameters as the parts read them.
class Weights {
 public:
  explicit Weights(const std::vector<Param>& params) : params_(params) {}
  const at::Tensor& operator[](size_t i) const { return params_[i].value; }
  at::Tensor Opt(size_t i) const { return i == kAbsent ? at::Tensor() : params_[i].value; }

 private:
  const std::vector<Param>& params_;
};

// Delivers d loss / d params[index].
using Emit = std::function<void(size_t index, const at::Tensor& grad)>;

// Reads a block's saved tensors in the order forward appended them.
class SavedReader {
 public:
  explicit SavedReader(const std::vector<at::Tensor>& s) : s_(s) {}
  const at::Tensor& Next() { return s_.at(pos_++); }
  // What is left (the attention kernel's statistics, appended last).
  const at::Tensor* Rest() const { return s_.data() + pos_; }

 private:
  const std::vector<at::Tensor>& s_;
  size_t pos_ = 0;
};

// ---- norms (build_norm) -------------------------------------------------------------------------

// RMSNorm (each family's rounding, ops::RmsScale) or LayerNorm over the last dimension. Saved:
// rstd (RMS) or mean and rstd (LayerNorm), fp32 [.., 1]; the normalised output is re-applied
// from them in backward.
class NormPart {
 public:
  NormPart() = default;
  // The config's norm kind and rounding (ops::RmsScaleFor); `weight` / `bias` are full tensor
  // names, an empty weight name meaning no norm here.
  NormPart(const ModelConfig& c, const std::string& weight, const std::string& bias, int64_t dim,
           ParamList* pl);
  bool present() const { return w_ != kAbsent; }
  NormKind kind() const { return kind_; }
  int num_stats() const { return kind_ == NormKind::kLayer ? 2 : 1; }

  at::Tensor Forward(const Weights& W, const at::Tensor& x, std::vector<at::Tensor>* saved) const;
  // The forward output again, from the stats Forward saved (`stats` points at them).
  at::Tensor Reapply(const Weights& W, const at::Tensor& x, const at::Tensor* stats) const;
  // d loss / d x, plus `residual` when defined (the residual branch's gradient).
  at::Tensor Backward(const Weights& W, const at::Tensor& dy, const at::Tensor& x,
                      const at::Tensor* stats, const Emit& emit,
                      const at::Tensor& residual = at::Tensor()) const;
  int64_t SavedBytes(double rows) const { return static_cast<int64_t>(rows * 4 * num_stats()); }
  // "fused" or "aten (why)" for the plan log.
  std::string Describe(c10::Device device, c10::ScalarType dtype) const;

 private:
  NormKind kind_ = NormKind::kRms;
  ops::RmsScale scale_ = ops::RmsScale::kCastThenScale;
  double eps_ = 1e-6;
  int64_t dim_ = 0;
  size_t w_ = kAbsent, b_ = kAbsent;
};

// ---- attention (build_attn) ---------------------------------------------------------------------

// Projections (separate q/k/v or fused qkv rows [q; k; v], nn.Linear or GPT-2's Conv1D, biases
// per config), q/k norm per head or over the projection, RoPE (global or local tables), then
// causal attention: ATen's fused kernels for unpacked rows, attention within documents
// (engine/doc_attention.h: packing, logit soft-capping, sliding windows the flash kernel cannot
// take) without a [T, T] mask. Returns o_proj's output.
class AttentionPart {
 public:
  AttentionPart(const ModelConfig& c, int layer, const std::string& prefix, ParamList* pl);
  // Saved, in order: [q_lin, k_lin, q stats, k stats] with a q/k norm, else [q, k] (rotated);
  // then v, attention output; the kernel's statistics go to `aux` (appended last by the layer).
  at::Tensor Forward(const Weights& W, const MicroBatch& mb, const at::Tensor& x,
                     std::vector<at::Tensor>* saved, std::vector<at::Tensor>* aux) const;
  // Reads Forward's tensors from `r` (aux: the kernel statistics). `x` gives the input again.
  struct Saved {
    at::Tensor q_lin, k_lin, q, k, v, out;
    const at::Tensor *q_stats = nullptr, *k_stats = nullptr;
  };
  Saved Read(SavedReader* r) const;
  // d loss / d x accumulated into a fresh tensor; `dout` is d loss / d (o_proj output).
  at::Tensor Backward(const Weights& W, const MicroBatch& mb, const at::Tensor& dout,
                      const std::function<at::Tensor()>& input, const Saved& s,
                      const at::Tensor* aux, const Emit& emit) const;
  // Bytes Forward saves for `tokens` = batch * seq (aux included, unpacked batch).
  int64_t SavedBytes(int64_t batch, int64_t seq, double e) const;
  double Flops(int64_t batch, int64_t seq) const;  // projections + attention, forward
  std::string Describe(c10::Device device, c10::ScalarType dtype, int64_t seq) const;

 private:
  // The sliding window applied at sequence length `seq` (0: the window covers it, plain causal).
  int64_t Window(int64_t seq) const;
  // Whether ops::Attention's fused kernels run (unpacked, no soft-capping, a window they take).
  bool Plain(const MicroBatch& mb, const at::Tensor& q) const;
  void Rope(const MicroBatch& mb, const at::Tensor** cos, const at::Tensor** sin) const;
  // q, k after the q/k norm and RoPE, [B, H, T, D].
  at::Tensor Heads(const Weights& W, const MicroBatch& mb, const at::Tensor& lin,
                   const NormPart& norm, int64_t heads, const at::Tensor* stats,
                   std::vector<at::Tensor>* saved) const;
  at::Tensor HeadsBackward(const Weights& W, const MicroBatch& mb, const at::Tensor& dheads,
                           const at::Tensor& lin, const NormPart& norm, int64_t heads,
                           const at::Tensor* stats, const Emit& emit) const;

  int64_t heads_, kv_heads_, head_dim_, hidden_;
  bool conv1d_, rope_, slides_, local_rope_;
  QkNorm qk_;
  NormPart q_norm_, k_norm_;
  double scale_, softcap_;
  int64_t window_;
  size_t q_ = kAbsent, k_ = kAbsent, v_ = kAbsent, qkv_ = kAbsent, o_ = kAbsent;
  size_t qb_ = kAbsent, kb_ = kAbsent, vb_ = kAbsent, qkvb_ = kAbsent, ob_ = kAbsent;
  size_t sinks_ = kAbsent;  // gpt-oss: [heads] sink logits (the tiled document path)
};

// ---- MLP (build_ffn) ----------------------------------------------------------------------------

// SwiGLU / GeGLU-tanh with separate or fused gate_up (gate rows first), optional biases, or
// GPT-2's c_proj(gelu_new(c_fc(x))) with Conv1D. Saved: gate and up (or fused gate_up, or c_fc's
// output); the activation product is rebuilt in backward.
//
// Sequence tiling (ALST's tiled MLP): a gated MLP over more tokens than TileRows() runs in tiles of
// that many rows, saves nothing (backward gets its input again) and recomputes each tile's gate
// and up in backward, so no [tokens, ffn] tensor larger than a tile exists at long sequence
// lengths. Weight gradients are summed over tiles in fp32 and rounded once.
// One tile's gate and up together stay within kMlpTileBytes (engine/tiles.h, MlpTileRows).
// Overrides kMlpTileBytes for this process (tests; <= 0 restores it).
void SetMlpTileBytes(int64_t bytes);

class MlpPart {
 public:
  MlpPart(const ModelConfig& c, const std::string& prefix, ParamList* pl);
  at::Tensor Forward(const Weights& W, const at::Tensor& x, std::vector<at::Tensor>* saved) const;
  struct Saved {
    at::Tensor a, b;  // gate, up | gate_up, - | c_fc output, - | nothing (tiled)
  };
  // `x`: the MLP's input, or any tensor of its shape and dtype (whether Forward tiled).
  Saved Read(SavedReader* r, const at::Tensor& x) const;
  // Rows per tile for elements of `e` bytes; Tiled: whether `tokens` rows run in tiles.
  int64_t TileRows(double e) const;
  bool Tiled(double tokens, double e) const;
  at::Tensor Backward(const Weights& W, const at::Tensor& dy,
                      const std::function<at::Tensor()>& input, const Saved& s,
                      const Emit& emit) const;
  int64_t SavedBytes(double tokens, double e) const;
  double Flops(double tokens) const;
  std::string Describe(c10::Device device, c10::ScalarType dtype) const;

 private:
  at::Tensor TiledForward(const Weights& W, const at::Tensor& x) const;
  at::Tensor TiledBackward(const Weights& W, const at::Tensor& dy, const at::Tensor& x,
                           const Emit& emit) const;
  // gate and up of rows x (views of the fused projection when gate_up is fused).
  void GateUp(const Weights& W, const at::Tensor& x, at::Tensor* gate, at::Tensor* up,
              at::Tensor* fused) const;

  MlpKind kind_;
  bool conv1d_;
  int64_t hidden_, ff_;
  size_t gate_ = kAbsent, up_ = kAbsent, down_ = kAbsent, gate_up_ = kAbsent;
  size_t gb_ = kAbsent, ub_ = kAbsent, db_ = kAbsent, gub_ = kAbsent;
};

// ---- mixture of experts (build_moe_ffn) -------------------------------------------------------

// The sparse feed-forward of Qwen3-MoE, OLMoE, Mixtral and gpt-oss (engine/parts/moe.cc).
// Routing (MoeConfig::routing): router logits x W_r^T in fp32, softmax over all experts, the
// top-k probabilities (divided by their sum with norm_topk_prob); or gpt-oss's x W_r^T + b_r in
// the compute dtype, its top-k logits and a softmax over those k. The routing weights weigh the
// experts' outputs: SwiGLU, or gpt-oss's clamped SwiGLU with biases. Tokens are permuted so that
// each expert's rows are contiguous (sorted by expert, stable) and each non-empty expert runs one
// GEMM per projection over its rows; the per-expert loop is the place a grouped GEMM replaces on
// CUDA. Experts are held as the checkpoint stores them: per expert (gate, up, down), packed
// ([E, 2I, H] gate_up, [E, H, I] down) or gpt-oss's packed transposed layout ([E, H, 2I] gate_up
// with gate/up interleaved by column, [E, I, H] down, and their biases). transformers 5 holds
// every family's experts packed, so an expert that gets no token in a micro-batch still gets a
// gradient (zeros) and AdamW decays it: offloadd emits zeros for it in every layout. Saved: the
// router's probabilities (fp32 [N, E]; gpt-oss: its logits), the top-k expert ids, and the
// permuted gate/up and (unweighted) expert outputs; the activation is rebuilt in backward.
//
// Expert GEMMs: one GEMM per non-empty expert ("loop"), or every
// expert's rows in one grouped GEMM per projection (at::_grouped_mm over the permuted rows, the
// expert offsets from the routing; forward, d x and the weight gradients; "grouped"). The default
// ("auto") is grouped on CUDA in bf16 on compute capability 9.0+ with rows of 16-byte multiples,
// the loop elsewhere (the CPU keeps its path). OFFLOADD_EXPERT_GEMM=auto|grouped|loop forces one;
// grouped forced where it cannot run is an error (on the CPU it runs ATen's reference grouped
// GEMM, which the CPU tests use). Per-expert tensors are viewed as [E, 2I, H] / [E, H, I] when the
// block's flat buffer holds them back to back (the trainer's), else stacked (a copy per pass).
class MoePart {
 public:
  MoePart(const ModelConfig& c, int layer, const std::string& prefix, ParamList* pl);
  at::Tensor Forward(const Weights& W, const MicroBatch& mb, const at::Tensor& x,
                     std::vector<at::Tensor>* saved) const;
  struct Saved {
    at::Tensor probs, top, gate_up, out;  // probs: the logits with kTopKSoftmax
  };
  Saved Read(SavedReader* r) const;
  at::Tensor Backward(const Weights& W, const MicroBatch& mb, const at::Tensor& dy,
                      const std::function<at::Tensor()>& input, const Saved& s,
                      const Emit& emit) const;
  int64_t SavedBytes(double tokens, double e) const;
  double Flops(double tokens) const;  // router + top_k experts per token, forward
  std::string Describe(c10::Device device, c10::ScalarType dtype) const;

 private:
  struct Routing;
  Routing Route(const at::Tensor& probs, const at::Tensor& top, c10::ScalarType dtype) const;
  // The expert GEMMs of the permuted rows xp (sorted by expert): the unweighted outputs, and
  // *gate_up the projections before the activation (saved for backward).
  at::Tensor LoopExperts(const Weights& W, const Routing& r, const at::Tensor& xp,
                         at::Tensor* gate_up) const;
  at::Tensor GroupedExperts(const Weights& W, const Routing& r, const at::Tensor& xp,
                            at::Tensor* gate_up) const;
  // Their backward from d out (the weighted upstream gradient of each permuted row): emits the
  // expert parameters' gradients (zeros for an expert without a row) and returns d xp.
  at::Tensor LoopExpertsBackward(const Weights& W, const Routing& r, const at::Tensor& xp,
                                 const at::Tensor& dout, const at::Tensor& gate_up,
                                 const Emit& emit) const;
  at::Tensor GroupedExpertsBackward(const Weights& W, const Routing& r, const at::Tensor& xp,
                                    const at::Tensor& dout, const at::Tensor& gate_up,
                                    const Emit& emit) const;
  // Whether the grouped GEMMs run for activations like x (OFFLOADD_EXPERT_GEMM and GroupedMisfit).
  bool UseGrouped(const at::Tensor& x) const;
  // Why the grouped GEMM cannot take these experts on `device` in `dtype`; empty when it can.
  std::string GroupedMisfit(c10::Device device, c10::ScalarType dtype) const;
  // The experts as [E, H, 2I] (x @ gate_up[e]) and [E, I, H] (act @ down[e]) views or stacks.
  void GroupedWeights(const Weights& W, at::Tensor* gate_up, at::Tensor* down) const;
  // Per-expert tensors back to back in one buffer: the same as strided views; false otherwise.
  bool StridedExperts(const Weights& W, at::Tensor* gate_up, at::Tensor* down) const;
  // One expert's gate/up projection of its rows ([rows, 2I]: gate columns first, or gpt-oss's
  // interleaved) and its activation; the down projection of the activation.
  at::Tensor ProjectGateUp(const Weights& W, int64_t e, const at::Tensor& x) const;
  at::Tensor Activate(const at::Tensor& gate_up) const;
  at::Tensor ProjectDown(const Weights& W, int64_t e, const at::Tensor& act) const;
  // d gate_up from d act (the layout ProjectGateUp produced); `act` receives the activation.
  at::Tensor ActivateBackward(const at::Tensor& dact, const at::Tensor& gate_up,
                              at::Tensor* act) const;
  at::Tensor GateUp(const Weights& W, int64_t e) const;  // [2I, H] gate rows first | [H, 2I]
  at::Tensor Down(const Weights& W, int64_t e) const;    // [H, I] | [I, H]

  int layer_;
  int64_t hidden_, ff_, experts_, top_k_;
  bool norm_topk_, packed_;
  MoeRouting routing_;
  ExpertActivation act_;
  double alpha_, limit_;
  bool transposed_;
  size_t router_ = kAbsent, router_b_ = kAbsent;
  size_t gate_up_ = kAbsent, down_ = kAbsent, gate_up_b_ = kAbsent, down_b_ = kAbsent;  // packed
  std::vector<size_t> gate_, up_, downs_;  // per expert
};

// nn.Linear (weights [out, in]) or GPT-2's Conv1D ([in, out]), with an optional bias.
at::Tensor Project(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, bool conv1d);
// Returns d x (added into *accumulate when given: nn.Linear only); writes dW and db (with a bias).
at::Tensor ProjectBackward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w,
                           bool has_bias, bool conv1d, at::Tensor* dw, at::Tensor* db,
                           at::Tensor* accumulate = nullptr);

}  // namespace offloadd::engine::parts
