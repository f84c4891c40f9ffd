// Model: loading a Hugging Face checkpoint into blocks, batch preparation, whole-model helpers and
// export back to a directory transformers can load.
#include "engine/model.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <c10/core/GradMode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "common/file.h"
#include "common/logging.h"
#include "common/safe_path.h"
#include "engine/blocks.h"
#include "engine/mxfp4.h"
#include "engine/ops.h"
#include "engine/safetensors.h"
#include "engine/tensor_io.h"
#include "engine/torch_boundary.h"

namespace offloadd::engine {

// What Export needs to reproduce the input checkpoint's layout.
struct Model::Source {
  std::unique_ptr<Checkpoint> checkpoint;
  std::map<std::string, DType> dtypes;  // every tensor in the checkpoint
  std::set<std::string> passthrough;    // non-parameter tensors copied verbatim on export
  std::string tied_alias;               // "lm_head.weight" stored although tied, or ""
  std::string tied_target;              // the embedding parameter it aliases
  // Parameters stored as MXFP4 (gpt-oss's experts): name -> its shape; the checkpoint holds
  // <name>_blocks and <name>_scales, the export writes <name> in bf16.
  std::map<std::string, std::vector<int64_t>> mxfp4;
};

Model::~Model() = default;

namespace {

bool IsMaskBuffer(const ModelConfig& c, const std::string& name) {
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (c.arch == Architecture::kGpt2)
    return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
  return ends_with(".rotary_emb.inv_freq");
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// The checkpoint's layout where config.json alone does not tell it: GPT-2 saved by
// save_pretrained has "transformer." before every name but lm_head (the hub's files have none);
// a Gemma 3 multimodal checkpoint has its language model under "language_model.model." (what
// transformers 5's save_pretrained writes, and the hub's files) or under "model.language_model."
// (the module layout of transformers 5, as some conversions store it).
void AdaptNamesToCheckpoint(const Checkpoint& ckpt, ModelConfig* c) {
  TensorNames& n = c->names;
  if (c->arch == Architecture::kGpt2 && !ckpt.Contains(n.embed) &&
      ckpt.Contains("transformer." + n.embed)) {
    for (std::string* name : {&n.embed, &n.position_embed, &n.final_norm, &n.final_norm_bias,
                              &n.layer_prefix}) {
      if (!name->empty()) *name = "transformer." + *name;
    }
  }
  const std::string legacy = "language_model.model.";
  const std::string modular = "model.language_model.";
  if (StartsWith(n.embed, legacy) && !ckpt.Contains(n.embed) &&
      ckpt.Contains(modular + n.embed.substr(legacy.size()))) {
    for (std::string* name : {&n.embed, &n.final_norm, &n.layer_prefix}) {
      *name = modular + name->substr(legacy.size());
    }
    n.lm_head = "lm_head.weight";
    for (std::string& prefix : n.passthrough_prefixes) prefix = "model." + prefix;
  }
  // Mixture of experts: per-expert tensors (the hub's files, transformers 5's save_pretrained)
  // or packed 3-D ones (transformers 5's module layout: <layer>.mlp.experts.gate_up_proj).
  for (int64_t i = 0; i < c->num_layers && !c->moe.transposed; ++i) {  // gpt-oss: always packed
    if (!c->layer_sparse(i)) continue;
    const std::string layer = n.layer_prefix + std::to_string(i) + ".";
    if (ckpt.Contains(layer + "mlp.experts.gate_up_proj")) {
      c->moe.packed = true;
      n.router = "mlp.gate";  // Mixtral's module name in transformers 5
      n.experts = "mlp.experts";
    }
    break;
  }
}

// A parameter stored as MXFP4 (Source::mxfp4): `blocks` and `scales` checked against the
// parameter's shape, then the values dequantised into fp32.
StatusOr<at::Tensor> ReadMxfp4(const Checkpoint& ckpt, const std::string& name,
                               const std::vector<int64_t>& shape, int64_t begin = 0,
                               int64_t count = -1) {
  ASSIGN_OR_RETURN(Mxfp4Shapes want, Mxfp4ShapesFor(name, shape));
  ASSIGN_OR_RETURN(auto blocks, ckpt.Get(Mxfp4BlocksName(name)));
  ASSIGN_OR_RETURN(auto scales, ckpt.Get(Mxfp4ScalesName(name)));
  auto str = [](const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  };
  for (const auto& [entry, expect, what] :
       {std::tuple{blocks, want.blocks, Mxfp4BlocksName(name)},
        std::tuple{scales, want.scales, Mxfp4ScalesName(name)}}) {
    if (entry.info->dtype != DType::kU8 || entry.info->shape != expect) {
      return InvalidArgumentError(entry.file->path() + ": MXFP4 tensor \"" + what + "\" is " +
                                  std::string(DTypeName(entry.info->dtype)) + " " +
                                  str(entry.info->shape) + ", config.json implies U8 " +
                                  str(expect));
    }
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (count < 0) count = numel;
  at::Tensor out = at::empty({count}, at::kFloat);
  RETURN_IF_ERROR(DequantizeMxfp4(name, shape, blocks.file->data(*blocks.info).data(),
                                  scales.file->data(*scales.info).data(), begin, count,
                                  out.data_ptr<float>()));
  return count == numel ? out.view(shape) : out;
}

bool IsPassthrough(const ModelConfig& c, const std::string& name) {
  for (const std::string& prefix : c.names.passthrough_prefixes) {
    if (StartsWith(name, prefix)) return true;
  }
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir, const LoadOptions& options) {
  if (options.dtype != c10::kFloat && options.dtype != c10::kBFloat16 &&
      options.dtype != c10::kHalf) {
    return InvalidArgumentError("model dtype must be float32, bfloat16 or float16");
  }
  std::unique_ptr<Model> m(new Model());
  m->dir_ = dir;
  ASSIGN_OR_RETURN(m->config_, LoadModelConfig(dir));
  using Materialize = LoadOptions::Materialize;
  if (options.materialize == Materialize::kRandom) return CreateRandom(std::move(m), options);
  m->source_ = std::make_unique<Source>();
  Source& src = *m->source_;
  ASSIGN_OR_RETURN(src.checkpoint, Checkpoint::Open(dir));
  AdaptNamesToCheckpoint(*src.checkpoint, &m->config_);
  for (const auto& name : src.checkpoint->Names()) {
    ASSIGN_OR_RETURN(auto e, src.checkpoint->Get(name));
    src.dtypes[name] = e.info->dtype;
  }

  std::set<std::string> used;
  ParamLoader load = [&](const std::string& name,
                         const std::vector<int64_t>& shape) -> StatusOr<at::Tensor> {
    if (m->config_.moe.mxfp4 && !src.checkpoint->Contains(name) &&
        src.checkpoint->Contains(Mxfp4BlocksName(name))) {
      // gpt-oss's MXFP4 experts: dequantised to the training dtype (full fine-tuning trains them
      // in F32 / BF16; the export writes BF16).
      used.insert(Mxfp4BlocksName(name));
      used.insert(Mxfp4ScalesName(name));
      src.mxfp4[name] = shape;
      if (options.materialize == Materialize::kLazy) {
        RETURN_IF_ERROR(Mxfp4ShapesFor(name, shape).status());
        return at::empty(shape, at::TensorOptions().dtype(options.dtype).device(c10::kMeta));
      }
      ASSIGN_OR_RETURN(at::Tensor t, ReadMxfp4(*src.checkpoint, name, shape));
      return t.to(options.dtype);
    }
    auto entry = src.checkpoint->Get(name);
    if (!entry.ok()) return entry.status();
    const TensorInfo& info = *entry->info;
    if (info.dtype != DType::kF32 && info.dtype != DType::kF16 && info.dtype != DType::kBF16) {
      return InvalidArgumentError(entry->file->path() + ": tensor \"" + name + "\" has dtype " +
                                  std::string(DTypeName(info.dtype)) +
                                  "; parameters must be F32, F16 or BF16");
    }
    if (info.shape != shape) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      return InvalidArgumentError(entry->file->path() + ": tensor \"" + name + "\" has shape " +
                                  str(info.shape) + ", config.json implies " + str(shape));
    }
    used.insert(name);
    if (options.materialize == Materialize::kLazy) {
      return at::empty(shape, at::TensorOptions().dtype(options.dtype).device(c10::kMeta));
    }
    ASSIGN_OR_RETURN(at::Tensor t, ReadTensor(*entry->file, info));
    return t.to(options.dtype);
  };

  try {
    ASSIGN_OR_RETURN(m->blocks_, BuildBlocks(m->config_, load));
  } catch (const std::exception& e) {  // LibTorch's c10::Error, out of memory included
    return TorchErrorStatus(dir + ": loading parameters", e);
  }

  const std::string tied_target = m->blocks_[0]->params()[0].name;
  for (const auto& name : src.checkpoint->Names()) {
    if (used.count(name)) continue;
    if (m->config_.tie_word_embeddings && name == m->config_.names.lm_head) {
      src.tied_alias = name;  // stored although tied: transformers ignores it; we re-export it
      src.tied_target = tied_target;
    } else if (IsPassthrough(m->config_, name)) {
      // Not the language model's (Gemma 3's vision tower and projector): written back unchanged.
      src.passthrough.insert(name);
    } else if (IsMaskBuffer(m->config_, name)) {
      src.passthrough.insert(name);
    } else {
      return InvalidArgumentError(dir + ": checkpoint tensor \"" + name +
                                  "\" is not a parameter of a " + m->config_.model_type + " model");
    }
  }
  if (!src.mxfp4.empty()) {
    OFFLOADD_LOG(kInfo, "engine") << dir << ": " << src.mxfp4.size()
                                  << " MXFP4 expert tensors dequantised to "
                                  << c10::toString(options.dtype)
                                  << " for full fine-tuning; the export writes them as BF16";
  }
  m->dtype_ = options.dtype;
  if (options.device != c10::Device(c10::kCPU) && options.materialize == Materialize::kEager)
    RETURN_IF_ERROR(m->To(options.device, options.dtype));
  return m;
}

StatusOr<std::unique_ptr<Model>> Model::CreateRandom(std::unique_ptr<Model> m,
                                                     const LoadOptions& options) {
  m->random_seed_ = options.random_seed;
  m->init_std_ = m->config_.initializer_range > 0 ? m->config_.initializer_range : 0.02;
  ParamLoader placeholder = [&](const std::string&,
                                const std::vector<int64_t>& shape) -> StatusOr<at::Tensor> {
    return at::empty(shape, at::TensorOptions().dtype(options.dtype).device(c10::kMeta));
  };
  try {
    ASSIGN_OR_RETURN(m->blocks_, BuildBlocks(m->config_, placeholder));
  } catch (const std::exception& e) {
    return TorchErrorStatus(m->dir_ + ": building a random model", e);
  }
  m->dtype_ = options.dtype;
  return m;
}

bool Model::has_checkpoint() const { return source_ != nullptr; }

StatusOr<at::Tensor> Model::ReadInitialValue(const std::string& name) const {
  const Param* param = nullptr;
  for (const auto& b : blocks_) {
    for (const auto& p : b->params()) {
      if (p.name == name) param = &p;
    }
  }
  if (param == nullptr) return NotFoundError("model has no parameter \"" + name + "\"");
  try {
    c10::NoGradGuard no_grad;
    if (source_ != nullptr && source_->mxfp4.count(name)) {
      return ReadMxfp4(*source_->checkpoint, name, source_->mxfp4.at(name));
    }
    if (source_ != nullptr) {
      ASSIGN_OR_RETURN(auto entry, source_->checkpoint->Get(name));
      ASSIGN_OR_RETURN(at::Tensor t, ReadTensor(*entry.file, *entry.info));
      return t.to(at::kFloat).contiguous();
    }
    const auto shape = param->value.sizes();
    auto ends_with = [&](std::string_view suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".bias")) return at::zeros(shape, at::kFloat);
    if (shape.size() == 1) {  // norm weights: 1, or 0 where the norm scales by (1 + w) (Gemma)
      return config_.norm == NormKind::kRmsOneOffset ? at::zeros(shape, at::kFloat)
                                                     : at::ones(shape, at::kFloat);
    }
    // One generator per parameter, seeded from (seed, name): the value does not depend on the
    // order parameters are materialized in.
    uint64_t h = 1469598103934665603ull ^ random_seed_;
    for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    at::Generator gen = at::detail::createCPUGenerator(h);
    at::Tensor t = at::empty(shape, at::kFloat);
    t.normal_(0.0, init_std_, gen);
    return t;
  } catch (const std::exception& e) {
    return TorchErrorStatus("reading the initial value of " + name, e);
  }
}

Status Model::ReadInitialValueInto(const std::string& name, int64_t begin, int64_t count,
                                   float* dst) const {
  if (source_ == nullptr) {  // a random value is drawn whole, from its own generator
    ASSIGN_OR_RETURN(at::Tensor t, ReadInitialValue(name));
    if (begin != 0 || count != t.numel()) {
      return InvalidArgumentError("the random initial value of " + name + " is drawn whole (" +
                                  std::to_string(t.numel()) + " elements)");
    }
    std::memcpy(dst, t.data_ptr<float>(), static_cast<size_t>(count) * sizeof(float));
    return OkStatus();
  }
  if (auto it = source_->mxfp4.find(name); it != source_->mxfp4.end()) {
    ASSIGN_OR_RETURN(Mxfp4Shapes shapes, Mxfp4ShapesFor(name, it->second));
    ASSIGN_OR_RETURN(auto blocks, source_->checkpoint->Get(Mxfp4BlocksName(name)));
    ASSIGN_OR_RETURN(auto scales, source_->checkpoint->Get(Mxfp4ScalesName(name)));
    (void)shapes;  // checked when the model was loaded
    return DequantizeMxfp4(name, it->second, blocks.file->data(*blocks.info).data(),
                           scales.file->data(*scales.info).data(), begin, count, dst);
  }
  ASSIGN_OR_RETURN(auto entry, source_->checkpoint->Get(name));
  const TensorInfo& info = *entry.info;
  int64_t numel = 1;
  for (int64_t d : info.shape) numel *= d;
  if (begin < 0 || count < 0 || begin + count > numel) {
    return InvalidArgumentError(entry.file->path() + ": elements [" + std::to_string(begin) + ", " +
                                std::to_string(begin + count) + ") of \"" + name +
                                "\" are outside its " + std::to_string(numel));
  }
  // The mapping is not necessarily aligned for the element type: read it bytewise.
  const std::byte* src = entry.file->data(info).data();
  switch (info.dtype) {
    case DType::kF32:
      std::memcpy(dst, src + begin * 4, static_cast<size_t>(count) * 4);
      return OkStatus();
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + (begin + i) * 2, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return OkStatus();
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + (begin + i) * 2, 2);
        dst[i] = static_cast<float>(c10::Half(h, c10::Half::from_bits()));
      }
      return OkStatus();
    default:
      return InvalidArgumentError(entry.file->path() + ": tensor \"" + name + "\" has dtype " +
                                  std::string(DTypeName(info.dtype)) +
                                  "; parameters must be F32, F16 or BF16");
  }
}

Status Model::To(c10::Device device, c10::ScalarType dtype) {
  for (auto& b : blocks_) RETURN_IF_ERROR(b->To(device, dtype));
  // "cuda" means the current device: record which one ("cuda:0"), as tensors report it.
  device_ = device.has_index() || device.is_cpu()
                ? device
                : at::empty({0}, at::TensorOptions().device(device)).device();
  dtype_ = dtype;
  return OkStatus();
}

void Model::AssumePlacement(c10::Device device, c10::ScalarType dtype) {
  device_ = device;
  dtype_ = dtype;
}

StatusOr<MicroBatch> Model::PrepareBatch(const at::Tensor& input_ids, const at::Tensor& targets,
                                         double num_trained_tokens, const at::Tensor& position_ids,
                                         const at::Tensor& segment_ids) const {
  auto bad = [](const std::string& m) { return InvalidArgumentError("micro-batch: " + m); };
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong) {
    return bad("input_ids must be an int64 [batch, seq] tensor");
  }
  const int64_t b = input_ids.size(0), t = input_ids.size(1);
  if (b == 0 || t == 0) return bad("empty batch");
  try {
    c10::NoGradGuard no_grad;
    MicroBatch mb;
    auto range_ok = [](const at::Tensor& x, int64_t lo, int64_t hi) {
      return x.numel() == 0 || (x.min().item<int64_t>() >= lo && x.max().item<int64_t>() < hi);
    };
    if (!range_ok(input_ids, 0, config_.vocab_size)) {
      return bad("token id outside [0, " + std::to_string(config_.vocab_size) + ")");
    }
    mb.input_ids = input_ids.to(device_);
    if (position_ids.defined()) {
      if (position_ids.sizes() != input_ids.sizes() || position_ids.scalar_type() != at::kLong) {
        return bad("position_ids must be int64 with the shape of input_ids");
      }
      mb.position_ids = position_ids.to(device_);
    } else {
      mb.position_ids = at::arange(t, at::TensorOptions().dtype(at::kLong).device(device_))
                            .unsqueeze(0)
                            .expand({b, t})
                            .contiguous();
    }
    const int64_t max_pos = mb.position_ids.max().item<int64_t>();
    if (mb.position_ids.min().item<int64_t>() < 0) return bad("negative position id");
    if (config_.arch == Architecture::kGpt2 && max_pos >= config_.max_position_embeddings) {
      return bad("position " + std::to_string(max_pos) + " exceeds n_positions " +
                 std::to_string(config_.max_position_embeddings));
    }
    if (targets.defined()) {
      if (targets.sizes() != input_ids.sizes() || targets.scalar_type() != at::kLong) {
        return bad("targets must be int64 with the shape of input_ids");
      }
      at::Tensor valid =
          targets.eq(kIgnoreIndex) | (targets.ge(0) & targets.lt(config_.vocab_size));
      if (!valid.all().item<bool>()) {
        return bad("target outside [0, vocab) and not the ignore index -100");
      }
      if (!(num_trained_tokens > 0)) {
        return bad("num_trained_tokens must be > 0 (trained tokens in the whole optimizer step)");
      }
      mb.targets = targets.to(device_);
      mb.num_trained_tokens = num_trained_tokens;
    }
    if (segment_ids.defined()) {
      if (segment_ids.sizes() != input_ids.sizes() || segment_ids.scalar_type() != at::kLong) {
        return bad("segment_ids must be int64 with the shape of input_ids");
      }
      mb.segment_ids = segment_ids.to(device_);
      mb.docs = ops::DocumentsOf(segment_ids, device_);
    }
    PrepareLayerInputs(config_, dtype_, &mb);
    return mb;
  } catch (const std::exception& e) {
    return TorchErrorStatus("micro-batch", e);
  }
}

std::vector<std::string> Model::DescribeKernels(c10::Device device, c10::ScalarType dtype,
                                              int64_t seq) const {
  std::vector<std::string> out;
  for (const auto& b : blocks_) {
    for (std::string& line : DescribeLayerParts(*b, device, dtype, seq)) {
      if (std::find(out.begin(), out.end(), line) == out.end()) out.push_back(std::move(line));
    }
  }
  return out;
}

StatusOr<at::Tensor> Model::Logits(const MicroBatch& mb) {
  at::Tensor x;
  for (int i = 0; i + 1 < num_blocks(); ++i) {
    ASSIGN_OR_RETURN(x, blocks_[i]->Forward(mb, x, SaveMode::kNone, nullptr));
  }
  return blocks_.back()->Logits(mb, x);
}

StatusOr<at::Tensor> Model::ForwardBackward(const MicroBatch& mb,
                                            const std::vector<SaveMode>& modes,
                                            const GradCallback& on_grad,
                                            const OffloadCallbacks* offload) {
  if (!modes.empty() && static_cast<int>(modes.size()) != num_blocks()) {
    return InvalidArgumentError("ForwardBackward: " + std::to_string(modes.size()) +
                                " save modes for " + std::to_string(num_blocks()) + " blocks");
  }
  std::vector<SavedState> saved(blocks_.size());
  at::Tensor x;
  for (int i = 0; i < num_blocks(); ++i) {
    const SaveMode mode = modes.empty() ? SaveMode::kKeep : modes[i];
    ASSIGN_OR_RETURN(x, blocks_[i]->Forward(mb, x, mode, &saved[i], offload));
  }
  const at::Tensor loss = x;
  at::Tensor g;
  for (int i = num_blocks() - 1; i >= 0; --i) {
    ASSIGN_OR_RETURN(g, blocks_[i]->Backward(mb, g, &saved[i], on_grad, offload));
  }
  return loss;
}

StatusOr<std::vector<int64_t>> Model::GenerateGreedy(const std::vector<int64_t>& prompt,
                                                     int64_t max_new_tokens,
                                                     const std::vector<int64_t>& stop_ids) {
  if (prompt.empty()) return InvalidArgumentError("GenerateGreedy: empty prompt");
  std::vector<int64_t> ids = prompt;
  try {
    for (int64_t step = 0; step < max_new_tokens; ++step) {
      if (static_cast<int64_t>(ids.size()) >= config_.max_position_embeddings) break;
      at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
      ASSIGN_OR_RETURN(MicroBatch mb, PrepareBatch(input, at::Tensor(), 0));
      ASSIGN_OR_RETURN(at::Tensor logits, Logits(mb));
      const int64_t next = logits[0][-1].to(at::kFloat).argmax().item<int64_t>();
      if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) break;
      ids.push_back(next);
    }
  } catch (const std::exception& e) {
    return InternalError(std::string("generate: ") + e.what());
  }
  return ids;
}

at::Tensor Model::ShiftLabels(const at::Tensor& labels) {
  at::Tensor t = at::full_like(labels, kIgnoreIndex);
  const int64_t n = labels.size(-1);
  if (n > 1) t.narrow(-1, 0, n - 1).copy_(labels.narrow(-1, 1, n - 1));
  return t;
}

int64_t Model::CountTrainedTokens(const at::Tensor& targets) {
  return targets.ne(kIgnoreIndex).sum().item<int64_t>();
}

Status Model::Export(const std::string& out_dir) const {
  if (source_ == nullptr) {
    return FailedPreconditionError("export: a randomly initialised model has no checkpoint layout "
                                   "to export to");
  }
  // Created inside the allowed roots and never through a symlink (common/safe_path.h); every file
  // below is written atomically and fsync'd, then the directory.
  RETURN_IF_ERROR(MakeDirsConfined(out_dir).status().WithContext("export"));
  if (SameFile(out_dir, dir_)) {
    return InvalidArgumentError("export: " + out_dir + " is the source checkpoint directory");
  }
  const Source& src = *source_;
  // Current parameter values by name.
  std::map<std::string, at::Tensor> values;
  for (const auto& b : blocks_) {
    for (const auto& p : b->params()) {
      if (!p.value.defined()) {
        return FailedPreconditionError("export: parameter " + p.name + " is not resident");
      }
      values[p.name] = p.value;
    }
  }
  if (!src.tied_alias.empty()) values[src.tied_alias] = values.at(src.tied_target);

  std::map<std::string, std::vector<std::pair<std::string, at::Tensor>>> shards;
  try {
    c10::NoGradGuard no_grad;
    std::map<std::string, std::string> mxfp4_blocks;  // <name>_blocks -> name
    for (const auto& [name, shape] : src.mxfp4) mxfp4_blocks[Mxfp4BlocksName(name)] = name;
    for (const auto& [name, dtype] : src.dtypes) {
      ASSIGN_OR_RETURN(std::string shard, src.checkpoint->ShardOf(name));
      if (auto it = mxfp4_blocks.find(name); it != mxfp4_blocks.end()) {
        // The trained weights are not requantised: BF16 in the blocks' shard (its scales skipped).
        shards[shard].push_back({it->second, values.at(it->second).to(at::kCPU, at::kBFloat16)});
        continue;
      }
      if (name.size() > 7 && name.compare(name.size() - 7, 7, "_scales") == 0 &&
          src.mxfp4.count(name.substr(0, name.size() - 7))) {
        continue;
      }
      if (src.passthrough.count(name)) {
        ASSIGN_OR_RETURN(auto e, src.checkpoint->Get(name));
        ASSIGN_OR_RETURN(at::Tensor t, ReadTensor(*e.file, *e.info));
        shards[shard].push_back({name, t});
        continue;
      }
      ASSIGN_OR_RETURN(c10::ScalarType type, ToScalarType(dtype));
      shards[shard].push_back({name, values.at(name).to(at::kCPU, type)});
    }
  } catch (const std::exception& e) {
    return TorchErrorStatus("export", e);
  }
  int64_t total = 0;
  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& [shard, tensors] : shards) {
    RETURN_IF_ERROR(SaveTensorFile(JoinPath(out_dir, shard), tensors));
    for (const auto& [name, t] : tensors) {
      weight_map[name] = shard;
      total += static_cast<int64_t>(t.nbytes());
    }
  }
  if (src.checkpoint->sharded()) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    RETURN_IF_ERROR(WriteFileAtomically(JoinPath(out_dir, "model.safetensors.index.json"),
                                        index.dump(2) + "\n")
                        .WithContext("export"));
  }
  static const char* kCopied[] = {"config.json",
                                  "generation_config.json",
                                  "tokenizer.json",
                                  "tokenizer_config.json",
                                  "special_tokens_map.json",
                                  "tokenizer.model",
                                  "vocab.json",
                                  "merges.txt",
                                  "added_tokens.json",
                                  "chat_template.jinja",
                                  "chat_template.json"};
  for (const char* f : kCopied) {
    const std::string from = JoinPath(dir_, f);
    if (!src.mxfp4.empty() && std::string_view(f) == "config.json") {
      // The experts are BF16 now: transformers must not look for MXFP4 blocks.
      ASSIGN_OR_RETURN(std::string text, ReadFileConfined(from));
      nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (config.is_discarded()) return InvalidArgumentError(from + ": not JSON");
      config.erase("quantization_config");
      RETURN_IF_ERROR(
          WriteFileAtomically(JoinPath(out_dir, f), config.dump(2) + "\n").WithContext("export"));
      OFFLOADD_LOG(kInfo, "engine") << "export: " << src.mxfp4.size()
                                    << " MXFP4 expert tensors written as BF16 to " << out_dir;
      continue;
    }
    struct stat st {};
    if (::lstat(from.c_str(), &st) != 0) continue;  // a symlink is checked when it is opened
    // Read confined: a symlink in the model directory that leads out of the allowed roots is
    // refused, not copied into the output.
    RETURN_IF_ERROR(CopyFileConfined(from, JoinPath(out_dir, f)).WithContext("export"));
  }
  return OkStatus();
}

}  // namespace offloadd::engine
