// offloadctl convert's tables: reasons for dropped keys and the named chat templates.
#include "client/cpp/config_convert_tables.h"

#include <sys/stat.h>

#include <cctype>
#include <map>

namespace offloadd::client::convert {
namespace {

constexpr Group kT = Group::kTrains, kOp = Group::kOperational, kIn = Group::kInternal;

constexpr const char* kReport = "offloadd reports through job events and Prometheus metrics (Grafana dashboard)";
constexpr const char* kHub = "no model hub: the model is exported to output_dir";
constexpr const char* kDist =
    "offloadd's data parallelism (resources.gpus) forms its own process group; torch.distributed "
    "and Accelerate settings do not apply";
constexpr const char* kKernels = "offloadd's kernels and attention are its own (cuDNN fused attention on the GPU)";
constexpr const char* kEval = "evaluation runs every eval_steps when dataset.eval_paths are given";
constexpr const char* kSave = "checkpoints are written every save_steps steps, in offloadd's own layout";
constexpr const char* kLora = "offloadd fine-tunes every weight; LoRA/QLoRA adapters do not apply";

// First match wins: longer prefixes before the shorter ones they start with.
constexpr Reason kReasons[] = {
    // Library internals and reporting: counted, not listed.
    {"_n_gpu", "transformers' device count; the daemon places the job", kIn},
    {"__cached__", "transformers' cached device state", kIn},
    {"distributed_state", "transformers' process state at dump time", kIn},
    {"deepspeed_plugin", "Accelerate's DeepSpeed object", kIn},
    {"ray_scope", "Ray Tune hyperparameter search", kIn},
    {"torchdynamo", kKernels, kIn},
    {"torch_compile", kKernels, kIn},
    {"torch_empty_cache_steps", "offloadd's GPU memory is one arena, planned before the job starts",
     kIn},
    {"mp_parameters", "SageMaker model parallelism", kIn},
    {"use_ipex", "Intel extension for PyTorch", kIn},
    {"use_mps_device", "offloadd trains on CUDA GPUs or the CPU", kIn},
    {"use_liger_kernel", kKernels, kIn},
    {"liger_", kKernels, kIn},
    {"plugins", "Axolotl plugins (Liger, cut cross-entropy): offloadd's kernels are its own", kIn},
    {"attn_implementation", kKernels, kIn},
    {"flash_attention", kKernels, kIn},
    {"sdp_attention", kKernels, kIn},
    {"xformers_attention", kKernels, kIn},
    {"tf32", "offloadd's GEMMs run in the compute dtype (bf16, fp16 or fp32)", kIn},
    {"fp16_backend", "offloadd's fp16 runs with its own dynamic loss scale", kIn},
    {"fp16_opt_level", "offloadd's fp16 runs with its own dynamic loss scale", kIn},
    {"half_precision_backend", "offloadd's fp16 runs with its own dynamic loss scale", kIn},
    {"torch_dtype",
     "the compute dtype is model.compute_dtype (bf16/fp16); master weights stay fp32", kIn},
    {"trust_remote_code",
     "offloadd runs no Python from the model directory; its family is read from config.json", kIn},
    {"model_revision", kHub, kIn},
    {"gradient_checkpointing_kwargs", "offloadd's recomputation is its own, per decoder layer",
     kIn},
    {"plot_loss", kReport, kIn},
    {"report_to", kReport, kIn},
    {"logging_", kReport, kIn},
    {"log_", kReport, kIn},
    {"run_name", "the job's display_name and id name it", kIn},
    {"wandb_", kReport, kIn},
    {"project", kReport, kIn},
    {"trackio", kReport, kIn},
    {"disable_tqdm", "offloadctl watch shows progress", kIn},
    {"push_to_hub", kHub, kIn},
    {"hub_", kHub, kIn},
    {"push_hub_strategy", kHub, kIn},
    {"hf_use_auth_token", kHub, kIn},
    {"ddp_", kDist, kIn},
    {"local_rank", kDist, kIn},
    {"accelerator_config", kDist, kIn},
    {"dispatch_batches", kDist, kIn},
    {"split_batches", kDist, kIn},
    {"tp_size", kDist, kIn},
    {"tpu_", "offloadd trains on CUDA GPUs or the CPU", kIn},
    {"skip_memory_metrics", "the job's metrics report GPU and host memory", kIn},
    {"include_", "offloadd reports tokens and FLOP/s in its metrics", kIn},
    {"steps_per_print", kReport, kIn},
    {"wall_clock_breakdown", "the job's trace and metrics break each step down", kIn},
    {"debug", "offloadd's trace and logs cover a step", kIn},
    {"use_legacy_prediction_loop", "evaluation reports the loss", kIn},
    {"eval_use_gather_object", kDist, kIn},
    {"zero_allow_untested_optimizer",
     "DeepSpeed's check of the optimizers it wraps; offloadd's AdamW is its own", kIn},
    {"zero_force_ds_cpu_optimizer",
     "DeepSpeed's check of the optimizers it wraps; offloadd's AdamW is its own", kIn},
    // How their run is driven: one line of names.
    {"fsdp", "offloadd offloads states itself (offload.*); FSDP does not apply", kOp},
    {"deepspeed",
     "give the DeepSpeed config as another input: offloadctl convert THIS ds_config.json", kOp},
    {"dataloader_", "offloadd's loader tokenizes and shuffles in the daemon", kOp},
    {"dataset_num_proc", "the daemon tokenizes the records itself", kOp},
    {"preprocessing_num_workers", "the daemon tokenizes the records itself", kOp},
    {"overwrite_cache", "the daemon tokenizes the records itself; there is no cache", kOp},
    {"dataset_prepared_path", "the daemon tokenizes the records itself", kOp},
    {"eval_strategy", kEval, kOp},
    {"evaluation_strategy", kEval, kOp},
    {"per_device_eval_batch_size", "evaluation uses the training micro-batch", kOp},
    {"eval_", kEval, kOp},
    {"evals_per_epoch", kEval, kOp},
    {"do_", "a job trains (and evaluates when dataset.eval_paths are given)", kOp},
    {"prediction_loss_only", "evaluation reports the loss", kOp},
    {"batch_eval_metrics", "evaluation reports the loss", kOp},
    {"jit_mode_eval", "evaluation reports the loss", kOp},
    {"save_strategy", kSave, kOp},
    {"saves_per_epoch", kSave, kOp},
    {"save_", kSave, kOp},
    {"remove_unused_columns", "offloadd reads the fields its dataset format names", kOp},
    {"length_column_name", "offloadd reads the fields its dataset format names", kOp},
    {"label_names", "offloadd's datasets give the targets", kOp},
    {"past_index", "no models with past state here", kOp},
    {"use_cpu", "the daemon places the job (GPU when the node has one)", kOp},
    {"no_cuda", "the daemon places the job (GPU when the node has one)", kOp},
    {"full_determinism", "offloadd's runs are deterministic for a seed on one machine", kOp},
    {"ignore_data_skip", "resume restores the data cursor exactly", kOp},
    {"restore_callback_states_from_checkpoint", "no callbacks", kOp},
    // What would make the run differ: listed one by one.
    {"load_best_model_at_end", "no best-model selection: the last step's model is exported"},
    {"metric_for_best_model", "no best-model selection: the last step's model is exported"},
    {"greater_is_better", "no best-model selection: the last step's model is exported"},
    {"data_seed", "one seed (training.seed) drives the data order and initialisation"},
    {"dataset_text_field", "text records are read from their `text` field (dataset.format: text)"},
    {"adapter", kLora},
    {"lora_", kLora},
    {"peft", kLora},
    {"load_in_",
     "offloadd trains in bf16, fp16 or fp32 with fp32 master weights; no quantised base"},
    {"val_set_size",
     "a share of the records held out for evaluation: not converted (set "
     "dataset.eval_split to the fraction, or give dataset.eval_paths)"},
    {"val_size",
     "a share of the records held out for evaluation: not converted (set "
     "dataset.eval_split to the fraction, or give dataset.eval_paths)"},
    {"special_tokens",
     "the tokenizer is used as it is; adding or replacing tokens is not supported"},
    {"tokens", "the tokenizer is used as it is; adding tokens is not supported"},
    {"group_by_length",
     "offloadd shuffles records per epoch (dataset.shuffle); length grouping changes the "
     "batches"},
    {"train_sampling_strategy", "offloadd shuffles records per epoch (dataset.shuffle)"},
    {"pure_bf16",
     "offloadd keeps fp32 master weights and Adam states; pure bf16 training is not built"},
    {"fp8", "offloadd computes in bf16, fp16 or fp32; fp8 is not built"},
    {"stage", "offloadd trains supervised fine-tuning and causal language modelling only"},
    {"finetuning_type", "offloadd fine-tunes every weight (finetuning_type: full)"},
};

// Axolotl's template names (client/templates/<name>.jinja, Axolotl's own copies of the models'
// templates) and the names LLaMA-Factory gives the same families.
const std::map<std::string, std::string>& TemplateAliases() {
  static const std::map<std::string, std::string> kAliases = {
      {"qwen", "qwen_25"},  {"qwen2", "qwen_25"},   {"qwen2_5", "qwen_25"},  {"qwen3_nothink", "qwen3"},
      {"phi", "phi_3"},     {"phi3", "phi_3"},      {"phi4", "phi_4"},       {"mistral", "mistral_v2v3"},
      {"llama3_1", "llama3"}};
  return kAliases;
}

struct EmbeddedTemplate {
  const char* name;
  const char* text;
};
constexpr EmbeddedTemplate kTemplates[] = {
#include "client/templates/chat_templates.inc"
};

}  // namespace

const Reason& ReasonFor(const std::string& key) {
  static const Reason kNone{"", "offloadd has no such setting: the run would differ from theirs", kT};
  for (const Reason& r : kReasons) {
    if (key.rfind(r.prefix, 0) == 0) return r;
  }
  return kNone;
}

std::string KnownTemplateNames() {
  std::string out;
  for (const auto& t : kTemplates) out += (out.empty() ? "" : ", ") + std::string(t.name);
  for (const auto& [alias, name] : TemplateAliases()) out += ", " + alias;
  return out;
}

StatusOr<std::string> NamedChatTemplate(const std::string& name, std::string* note) {
  std::string want = name;
  if (auto a = TemplateAliases().find(name); a != TemplateAliases().end()) {
    want = a->second;
    *note = "chat template '" + name + "' is written as '" + want + "'";
  }
  for (const auto& t : kTemplates) {
    if (want == t.name) return std::string(t.text);
  }
  return NotFoundError("no chat template named '" + name + "' (known: " + KnownTemplateNames() + ")");
}

bool LooksLikeHubId(const std::string& value) {
  const size_t slash = value.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == value.size() ||
      value.find('/', slash + 1) != std::string::npos || value[0] == '.' || value[0] == '~')
    return false;
  for (char c : value) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/'))
      return false;
  }
  struct stat st {};
  return ::stat(value.c_str(), &st) != 0;
}

}  // namespace offloadd::client::convert
