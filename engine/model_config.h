#pragma once
// Hugging Face config.json -> ModelConfig. A ModelConfig describes a causal LM as the parts its
// decoder block is assembled from (norms and their placement, attention options, positions, MLP,
// embedding and head options) plus the checkpoint's tensor names; the family table
// (engine/families.cc) maps each supported model_type's config.json to those parts, as data.
// Anything the engine would compute differently from transformers is refused with its key and
// value named. No LibTorch here. Plain value type.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace offloadd::engine {

// kLlama: every rotary family (llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, olmo2);
// kGpt2: learned positions, Conv1D projections.
enum class Architecture { kLlama, kGpt2 };

// ---- parts --------------------------------------------------------------------------------------

// RMSNorm w * x / rms(x); RMSNorm with (1 + w) (Gemma; the checkpoint stores w, init 0);
// LayerNorm with weight and bias (GPT-2).
enum class NormKind { kRms, kRmsOneOffset, kLayer };

// Where a decoder layer's norms sit around each sublayer f (attention, then MLP):
//   kPre:      x + f(norm(x))                      Llama, Mistral, Qwen, Phi-3, GPT-2
//   kSandwich: x + post_norm(f(pre_norm(x)))       Gemma 2 / 3 (four norms per layer)
//   kPost:     x + post_norm(f(x))                 OLMo 2 (no input norm)
enum class NormPlacement { kPre, kSandwich, kPost };

// q/k normalisation before RoPE:
//   kPerHead: RMSNorm over head_dim, one weight [head_dim] shared by all heads (Qwen3, Gemma 3)
//   kWhole:   RMSNorm over the whole projection, weights [q_dim] and [kv_dim] (OLMo 2)
enum class QkNorm { kNone, kPerHead, kWhole };

// kSwiGlu: down(silu(gate(x)) * up(x)); kGeGluTanh: down(gelu_tanh(gate(x)) * up(x)) (Gemma);
// kGeluMlp: c_proj(gelu_new(c_fc(x))) (GPT-2).
enum class MlpKind { kSwiGlu, kGeGluTanh, kGeluMlp };

struct RopeConfig {
  // "default", "linear", "dynamic", "llama3", "yarn" or "longrope".
  std::string type = "default";
  double theta = 10000.0;
  double factor = 1.0;                              // linear, dynamic, llama3, yarn, longrope
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn, longrope, dynamic
  double beta_fast = 32.0, beta_slow = 1.0;         // yarn
  double mscale = 0.0, mscale_all_dim = 0.0;        // yarn (0 = unset)
  double attention_factor = 0.0;                    // yarn / longrope (0 = derived)
  bool truncate = true;                             // yarn
  std::vector<double> short_factor, long_factor;    // longrope, rotary_dim / 2 each
  // Rotated dimensions per head: head_dim * partial_rotary_factor (even); the rest pass through.
  int64_t rotary_dim = 0;
};

// The checkpoint's tensor names, as the family's modeling code writes them. A decoder layer's
// names are layer_prefix + "<i>." + the per-layer name; an empty name means the part is absent.
struct TensorNames {
  std::string embed = "model.embed_tokens.weight";
  std::string position_embed;  // GPT-2: "wpe.weight" (with the checkpoint's prefix)
  std::string final_norm = "model.norm.weight";
  std::string final_norm_bias;  // GPT-2 "ln_f.bias"
  std::string lm_head = "lm_head.weight";
  std::string layer_prefix = "model.layers.";
  // Per layer (".weight" / ".bias" appended by the block builder).
  std::string input_norm = "input_layernorm";              // kPre / kSandwich; empty for kPost
  std::string post_attn_norm = "post_attention_layernorm";  // kPre: the MLP's pre-norm
  std::string pre_mlp_norm;                                 // kSandwich: pre_feedforward_layernorm
  std::string post_mlp_norm;                                // kSandwich / kPost
  std::string q = "self_attn.q_proj", k = "self_attn.k_proj", v = "self_attn.v_proj";
  std::string qkv;  // fused projection (Phi-3 "self_attn.qkv_proj", GPT-2 "attn.c_attn")
  std::string o = "self_attn.o_proj";
  std::string q_norm, k_norm;  // "self_attn.q_norm" / "self_attn.k_norm" when qk_norm != kNone
  std::string gate = "mlp.gate_proj", up = "mlp.up_proj", down = "mlp.down_proj";
  std::string gate_up;  // fused (Phi-3 "mlp.gate_up_proj": gate rows first, then up)
  // Mixture-of-experts layers (MoeConfig): the router and the experts, per-expert
  // (<experts>.<e>.<expert_gate>.weight ...) or packed 3-D (<experts>.gate_up_proj, [E, 2I, H],
  // gate rows first, and <experts>.down_proj, [E, H, I]), as MoeConfig::packed says.
  std::string router = "mlp.gate";      // ".weight" [E, H] (gpt-oss: "mlp.router", with ".bias")
  std::string experts = "mlp.experts";  // Mixtral's hub files: "block_sparse_moe.experts"
  std::string expert_gate = "gate_proj", expert_up = "up_proj", expert_down = "down_proj";
  std::string sinks;  // gpt-oss: "self_attn.sinks", one learned logit per query head
  // Tensors of the checkpoint that are not the language model's (Gemma 3's vision tower and
  // projector): names starting with these prefixes are kept aside and written back on export.
  std::vector<std::string> passthrough_prefixes;
};

// kSoftmaxTopK: softmax over all experts' logits, then the top-k probabilities (Qwen3-MoE, OLMoE,
// Mixtral); kTopKSoftmax: the top-k logits (router with a bias), softmax over those k (gpt-oss).
enum class MoeRouting { kSoftmaxTopK, kTopKSoftmax };
// kSwiGlu: down(silu(gate) * up); kClampedSwiGlu (gpt-oss): gate clamped to <= limit, up to
// [-limit, limit], down((up + 1) * gate * sigmoid(alpha * gate)).
enum class ExpertActivation { kSwiGlu, kClampedSwiGlu };

// The sparse feed-forward of mixture-of-experts families (Qwen3-MoE, OLMoE, Mixtral, gpt-oss): a
// router linear, the top-k routing weights, and SwiGLU experts weighted by them.
// num_experts == 0: a dense model.
struct MoeConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;              // num_experts_per_tok
  int64_t intermediate_size = 0;  // of one expert (Qwen3-MoE's moe_intermediate_size)
  bool norm_topk_prob = false;    // Mixtral: always
  // transformers adds router_aux_loss_coef * load-balancing loss to the loss when the config's
  // output_router_logits is true (the Switch Transformer loss over every sparse layer's router).
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.0;
  std::vector<bool> sparse;  // per layer: the MoE feed-forward (else the dense MLP)
  // The checkpoint stores the experts packed (transformers 5's module layout) rather than per
  // expert (the hub's files and transformers 5's save_pretrained). Set by Model::Load.
  bool packed = false;
  // gpt-oss: router bias, top-k then softmax, the clamped SwiGLU with expert biases, and its packed
  // layout: gate_up_proj [E, H, 2I] with gate and up interleaved by column (gate at even columns),
  // down_proj [E, I, H], gate_up_proj_bias [E, 2I], down_proj_bias [E, H].
  MoeRouting routing = MoeRouting::kSoftmaxTopK;
  ExpertActivation activation = ExpertActivation::kSwiGlu;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
  bool router_bias = false, expert_bias = false;
  bool transposed = false;  // the gpt-oss packed layout above (always packed)
  // config.json's quantization_config says MXFP4 (gpt-oss): the expert weights may be stored as
  // <name>_blocks / <name>_scales (engine/mxfp4.h) and are dequantised on load.
  bool mxfp4 = false;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string model_type;    // as in config.json (for Gemma 3 multimodal: "gemma3", text half)
  std::string architecture;  // the config's architectures[0], e.g. "Qwen3ForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // independent of hidden_size / num_heads when config.json says so
  int64_t max_position_embeddings = 0;
  double norm_eps = 1e-6;           // rms_norm_eps or layer_norm_epsilon
  double initializer_range = 0.02;  // std of the normal init (random-init models)
  bool tie_word_embeddings = false;

  // Parts.
  NormKind norm = NormKind::kRms;
  NormPlacement norm_placement = NormPlacement::kPre;
  QkNorm qk_norm = QkNorm::kNone;
  MlpKind mlp = MlpKind::kSwiGlu;
  bool qkv_bias = false;  // Qwen2 always; Llama with attention_bias; GPT-2
  bool o_bias = false;    // Llama with attention_bias; GPT-2
  bool mlp_bias = false;  // Llama mlp_bias; GPT-2
  // Softmax scale of the attention logits: 1/sqrt(head_dim), or Gemma's
  // query_pre_attn_scalar^-0.5.
  double attn_scale = 0.0;
  double attn_logit_softcap = 0.0;   // Gemma 2: logits = cap * tanh(logits / cap); 0 = none
  double final_logit_softcap = 0.0;  // Gemma 2
  bool scale_embeddings = false;     // Gemma: h = embed * sqrt(hidden_size), rounded to dtype
  // gpt-oss: a learned logit per query head joins each query's softmax denominator (its
  // probability is dropped: it attends to nothing). TensorNames::sinks names it.
  bool attention_sinks = false;

  // Attention per layer type: sliding[i] is true when layer i attends to its last
  // `sliding_window` tokens only (a token sees itself and the sliding_window - 1 before it, as
  // transformers' sliding masks do). Empty = no sliding layer.
  std::vector<bool> sliding;
  int64_t sliding_window = 0;
  RopeConfig rope;        // global (full-attention) layers
  RopeConfig rope_local;  // sliding layers when the family gives them their own (Gemma 3)
  bool has_local_rope = false;

  std::string hidden_act;  // "silu", "gelu_pytorch_tanh" or "gelu_new"
  TensorNames names;
  MoeConfig moe;
  std::vector<int64_t> eos_token_ids;
  // The nonzero dropout probabilities Hugging Face's modeling code applies in training for this
  // architecture (GPT-2: embd_pdrop, attn_pdrop, resid_pdrop; the rotary families:
  // attention_dropout), in config.json order. The engine applies no dropout, so a job on such a
  // model is refused unless it says `dropout: disable` (DropoutProblem).
  std::vector<std::pair<std::string, double>> dropout;
  int64_t bos_token_id = -1;
  // nn.Embedding's padding_idx in the rotary families' modeling code (config.pad_token_id): the
  // embedding lookup gives that row no gradient. -1: none (GPT-2, or no pad token in the vocab).
  int64_t pad_token_id = -1;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  bool layer_sparse(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(moe.sparse.size()) && moe.sparse[layer];
  }
  bool layer_slides(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(sliding.size()) && sliding[layer];
  }
};

// The model families the engine runs, for `offloadctl node` and `--validate-only`:
// {model_type, architectures[0] it accepts, a short description}.
struct FamilyInfo {
  std::string model_type;
  std::vector<std::string> architectures;
  std::string description;
};
const std::vector<FamilyInfo>& SupportedFamilies();
// "llama, mistral, qwen2, ..." for messages.
std::string SupportedModelTypes();

// Parses config.json text; `origin` (a path) prefixes error messages.
StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view origin);
// Reads and parses `dir/config.json`.
StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// The longest sequence a config can train (INVALID_ARGUMENT naming the field otherwise); the
// validator calls it with the job's max_seq_length, so nothing is refused after a step.
Status SequenceLengthProblem(const ModelConfig& c, int64_t max_seq_length);

// Parameters counted from the parts (norm weights and biases, q/k norms, projection and MLP
// biases; fused tensors count as their parts). For a config ParseModelConfig accepted.
struct ParamCounts {
  int64_t embedding = 0;   // token embeddings (+ GPT-2's learned positions)
  int64_t layer = 0;       // one decoder layer (MoE models: the largest, a sparse one)
  int64_t final_norm = 0;  // the final norm (+ its bias)
  int64_t lm_head = 0;     // 0 when tied
  int64_t total = 0;
  // Per decoder layer, exact (MoE models mix sparse and dense layers: mlp_only_layers,
  // decoder_sparse_step), and the two kinds: dense_layer with the MLP, sparse_layer (0 for a dense
  // model) with the router and every expert.
  std::vector<int64_t> layers;
  int64_t dense_layer = 0, sparse_layer = 0;
  int64_t sparse_layers = 0;  // how many decoder layers are sparse
  int64_t expert = 0;         // one expert: gate, up, down (+ gpt-oss's biases)
  int64_t router = 0;         // one sparse layer's router (+ its bias)
  // What one token computes with: total less the (num_experts - top_k) experts of every sparse
  // layer it is not routed to (= total for a dense model).
  int64_t active = 0;
};
ParamCounts CountParams(const ModelConfig& c);

// One line naming the family and its parts, for `--validate-only` and logs, e.g.
// "qwen3: RMSNorm pre-norm, GQA 32/8 head_dim 128, per-head q/k norm, SwiGLU, RoPE default
// θ=1e6, untied head".
std::string DescribeParts(const ModelConfig& c);

// "resid_pdrop=0.1, attn_pdrop=0.1" for the model's dropout; empty when it has none.
std::string DescribeDropout(const ModelConfig& c);
// FAILED_PRECONDITION naming every dropout setting when the model trains with dropout in Hugging
// Face and the job has not said `dropout: disable`; OK otherwise.
Status DropoutProblem(const ModelConfig& c, bool dropout_disabled);

}  // namespace offloadd::engine
