// offloadctl convert: HF / TRL / Axolotl / DeepSpeed configurations to a job file (see the header).
#include "client/cpp/config_convert.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "client/cpp/job_file.h"
#include "jobspec/training_rules.h"

namespace offloadd::client {
namespace {

// TrainingArguments / SFTConfig names that the job spec's `training:` takes as they are
// (docs/hf-names.md): offloadd's own and the HF aliases job validation maps.
constexpr std::array<const char*, 27> kTrainingNames = {
    "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs",
    "max_steps", "warmup_ratio", "warmup_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "weight_decay",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "seed", "logging_steps", "save_steps",
    "save_total_limit", "bf16", "fp16", "gradient_checkpointing", "optim", "max_length",
    "completion_only_loss", "assistant_only_loss", "eval_steps", "auto_find_batch_size"};

// Why a key offloadd has no setting for is dropped, by name or prefix; the first match wins.
struct Reason {
  const char* prefix;
  const char* why;
  bool operational = false;  // how the run is driven or reported, not what it trains
};
constexpr Reason kReasons[] = {
    {"report_to", "offloadd reports through job events and Prometheus metrics (Grafana dashboard)", true},
    {"logging_", "offloadd reports through job events and Prometheus metrics (Grafana dashboard)", true},
    {"log_", "offloadd reports through job events and Prometheus metrics (Grafana dashboard)", true},
    {"run_name", "the job's display_name and id name it", true},
    {"wandb_", "offloadd reports through job events and Prometheus metrics (Grafana dashboard)", true},
    {"disable_tqdm", "offloadctl watch shows progress", true},
    {"push_to_hub", "no model hub: the model is exported to output_dir", true},
    {"hub_", "no model hub: the model is exported to output_dir", true},
    {"hf_use_auth_token", "no model hub: the model is exported to output_dir", true},
    {"ddp_", "one offloadd process drives the GPU; there is no torch.distributed group to tune", true},
    {"fsdp", "offloadd offloads states itself (offload.*); FSDP does not apply"},
    {"local_rank", "one offloadd process drives the GPU; there is no torch.distributed group to tune", true},
    {"deepspeed", "give the DeepSpeed config as another input: offloadctl convert THIS ds_config.json"},
    {"tpu_", "offloadd trains on CUDA GPUs or the CPU", true},
    {"accelerator_config", "one offloadd process drives the GPU", true},
    {"dataloader_", "offloadd's loader tokenizes and shuffles in the daemon", true},
    {"torch_compile", "offloadd's kernels are its own; nothing is compiled by torch", true},
    {"tf32", "offloadd's GEMMs run in the compute dtype (bf16, fp16 or fp32)", true},
    {"eval_strategy", "evaluation runs every eval_steps when dataset.eval_paths are given", true},
    {"evaluation_strategy", "evaluation runs every eval_steps when dataset.eval_paths are given", true},
    {"per_device_eval_batch_size", "evaluation uses the training micro-batch", true},
    {"eval_", "evaluation runs every eval_steps when dataset.eval_paths are given", true},
    {"save_strategy", "checkpoints are written every save_steps steps", true},
    {"save_", "checkpoints are written every save_steps steps, in offloadd's own layout", true},
    {"load_best_model_at_end", "no best-model selection: the last step's model is exported"},
    {"metric_for_best_model", "no best-model selection: the last step's model is exported"},
    {"greater_is_better", "no best-model selection: the last step's model is exported"},
    {"data_seed", "one seed (training.seed) drives the data order and initialisation"},
    {"dataset_text_field", "text records are read from their `text` field (dataset.format: text)"},
    {"adapter", "offloadd fine-tunes every weight; LoRA/QLoRA adapters do not apply"},
    {"lora_", "offloadd fine-tunes every weight; LoRA/QLoRA adapters do not apply"},
    {"peft", "offloadd fine-tunes every weight; LoRA/QLoRA adapters do not apply"},
    {"load_in_", "offloadd trains in bf16, fp16 or fp32 with fp32 master weights; no quantised base"},
    {"flash_attention", "offloadd picks its attention kernel (cuDNN's fused attention on the GPU)", true},
    {"sdp_attention", "offloadd picks its attention kernel (cuDNN's fused attention on the GPU)", true},
    {"xformers_attention", "offloadd picks its attention kernel (cuDNN's fused attention on the GPU)", true},
    {"evals_per_epoch", "evaluation runs every eval_steps when dataset.eval_paths are given", true},
    {"saves_per_epoch", "checkpoints are written every save_steps steps", true},
    {"dataset_prepared_path", "the daemon tokenizes the records itself", true},
    {"val_set_size", "offloadd evaluates a separate held-out set: dataset.eval_paths"},
    {"special_tokens", "the tokenizer is used as it is; adding tokens is not supported"},
    {"tokens", "the tokenizer is used as it is; adding tokens is not supported"},
    {"chat_template", "set dataset.template to a Jinja template, or leave it for the tokenizer's own"},
    {"steps_per_print", "offloadd reports through job events and Prometheus metrics", true},
    {"wall_clock_breakdown", "the job's trace and metrics break each step down", true},
    {"gradient_checkpointing_kwargs", "offloadd's recomputation is per decoder layer"},
    {"project", "offloadd reports through job events and Prometheus metrics (Grafana dashboard)", true},
    {"skip_memory_metrics", "the job's metrics report GPU and host memory", true},
    {"include_", "offloadd reports tokens and FLOP/s in its metrics", true},
    {"average_tokens_across_devices", "one GPU per job: the loss is the mean over the step's trained tokens", true},
    {"remove_unused_columns", "offloadd reads the fields its dataset format names", true},
    {"length_column_name", "offloadd reads the fields its dataset format names", true},
    {"train_sampling_strategy", "offloadd shuffles records per epoch (dataset.shuffle)", true},
    {"group_by_length", "offloadd shuffles records per epoch (dataset.shuffle)", true},
    {"use_cpu", "the daemon places the job (GPU when the node has one)", true},
    {"no_cuda", "the daemon places the job (GPU when the node has one)", true},
    {"do_", "a job trains (and evaluates when dataset.eval_paths are given)", true},
    {"overwrite_output_dir", "output_dir must not hold another job's model; checkpoints resume", true},
    {"prediction_loss_only", "evaluation reports the loss", true},
    {"label_names", "offloadd's datasets give the targets", true},
    {"past_index", "no models with past state here", true},
    {"full_determinism", "offloadd's runs are deterministic for a seed on one machine", true},
    {"ignore_data_skip", "resume restores the data cursor exactly", true},
    {"restore_callback_states_from_checkpoint", "no callbacks", true},
    {"batch_eval_metrics", "evaluation reports the loss", true},
    {"jit_mode_eval", "offloadd's kernels are its own", true},
    {"debug", "offloadd's trace and logs cover a step", true},
    {"trackio", "offloadd reports through job events and Prometheus metrics (Grafana dashboard)", true},
};

const Reason& ReasonFor(const std::string& key) {
  static const Reason kNone{"", "offloadd has no such setting: the run would differ from theirs", false};
  for (const Reason& r : kReasons) {
    if (key.rfind(r.prefix, 0) == 0) return r;
  }
  return kNone;
}

std::string Render(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

bool IsOff(const YAML::Node& v) {
  if (!v.IsDefined() || v.IsNull()) return true;
  if (v.IsSequence() || v.IsMap()) return v.size() == 0;
  std::string s = v.Scalar();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s.empty() || s == "false" || s == "no" || s == "none") return true;
  try {  // a zero turns a numeric feature off (label_smoothing_factor: 0.0)
    size_t used = 0;
    return std::stod(s, &used) == 0 && used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool IsAuto(const YAML::Node& v) { return v.IsScalar() && v.Scalar() == "auto"; }

// The converter's state over all inputs.
class Converter {
 public:
  explicit Converter(const ConvertOverrides& o) : overrides_(o) {}

  Status Convert(const ConfigInput& in, ConfigKind kind) {
    YAML::Node root;
    try {
      root = YAML::Load(in.text);
    } catch (const YAML::Exception& e) {
      return InvalidArgumentError(in.source + ": not JSON or YAML: " + e.msg);
    }
    if (!root.IsMap()) return InvalidArgumentError(in.source + ": not a mapping of settings");
    source_ = in.source;
    if (kind == ConfigKind::kAuto) kind = Guess(root);
    out_.kinds.push_back(ConfigKindName(kind));
    switch (kind) {
      case ConfigKind::kDeepSpeed: return DeepSpeed(root);
      case ConfigKind::kAxolotl: return Axolotl(root);
      default: return HuggingFace(root);
    }
  }

  StatusOr<ConvertedJob> Finish() {
    // The command line's values win over the inputs'.
    source_ = "the command line";
    if (!overrides_.model_path.empty()) {
      set_.erase("model.path");
      RETURN_IF_ERROR(Set("model.path", Str(overrides_.model_path), "--model"));
    }
    if (!overrides_.output_dir.empty()) {
      set_.erase("output_dir");
      RETURN_IF_ERROR(Set("output_dir", Str(overrides_.output_dir), "--output-dir"));
    }
    for (const std::string& p : overrides_.dataset_paths) {
      if (!paths_.count(p)) job_["dataset"]["paths"].push_back(p);
      paths_.insert(p);
    }
    for (const char* required : {"model.path", "dataset.paths", "output_dir"}) {
      if (!set_.count(required) && !(std::string(required) == "dataset.paths" && !paths_.empty()))
        out_.missing.push_back(required);
    }
    std::ostringstream y;
    y << "# offloadd job file converted by `offloadctl convert` from:";
    for (size_t i = 0; i < sources_.size(); ++i) y << " " << sources_[i] << " (" << out_.kinds[i] << ")";
    y << "\n# Dropped keys and why: run the conversion again, or see docs/convert.md.\n";
    if (!out_.missing.empty()) {
      y << "# Still needed before submitting:";
      for (const auto& m : out_.missing) y << " " << m;
      y << "\n";
    }
    YAML::Emitter e;
    e << job_;
    y << e.c_str() << "\n";
    out_.job_yaml = y.str();
    RETURN_IF_ERROR(CheckValues());
    return out_;
  }

  void AddSource(const std::string& s) { sources_.push_back(s); }

 private:
  static YAML::Node Str(const std::string& s) { return YAML::Node(s); }

  // "args.json `learning_rate`": the input and key that set the job field `path`, or a field above
  // it.
  std::string SetBy(const std::string& path) const {
    for (std::string p = path;;) {
      if (auto it = set_.find(p); it != set_.end()) return it->second.first;
      const size_t dot = p.find_last_of(".[");
      if (dot == std::string::npos) return "";
      p.resize(dot);
    }
  }

  // The converted values, read back as the job file they are and checked with the job validator's
  // value rules (jobspec/training_rules.h): a value the daemon would refuse (learning_rate:
  // fast, NaN, max_steps: -5) fails the conversion, naming the input and key, instead of being
  // copied into the file. Fields no input set are not checked (their defaults apply).
  Status CheckValues() const {
    ASSIGN_OR_RETURN(JobFileContents read, ReadJobSpec(out_.job_yaml, "the converted job file"));
    std::vector<FieldViolation> problems = read.violations;
    offloadd::v1::JobSpec spec = read.spec;
    daemon::ApplyJobDefaults(&spec);
    std::vector<daemon::FieldViolation> ranges;
    daemon::CheckTrainingValues(spec.training(), &ranges);
    for (const auto& v : ranges) {
      bool reported = false;
      for (const auto& p : problems) reported |= p.field == v.field;
      if (!reported && set_.count(v.field)) problems.push_back({v.field, v.description});
    }
    if (problems.empty()) return OkStatus();
    std::string message = std::to_string(problems.size()) +
                          (problems.size() == 1 ? " value" : " values") +
                          " the daemon would refuse:";
    for (const auto& p : problems) {
      const std::string by = SetBy(p.field);
      message += "\n  " + (by.empty() ? p.field : by + " (" + p.field + ")") + ": " + p.description;
    }
    return InvalidArgumentError(message);
  }

  static ConfigKind Guess(const YAML::Node& root) {
    for (const char* k : {"zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
                          "gradient_clipping"}) {
      if (root[k]) return ConfigKind::kDeepSpeed;
    }
    for (const char* k : {"optimizer", "scheduler", "bf16", "fp16"}) {  // DeepSpeed writes these as sections
      if (root[k] && root[k].IsMap()) return ConfigKind::kDeepSpeed;
    }
    for (const char* k : {"base_model", "datasets", "sequence_len", "micro_batch_size", "num_epochs"}) {
      if (root[k]) return ConfigKind::kAxolotl;
    }
    return ConfigKind::kHuggingFace;
  }

  // Sets the job field at `path` ("training.learning_rate"); two inputs giving it different
  // values is an error naming both.
  Status Set(const std::string& path, const YAML::Node& value, const std::string& key) {
    const std::string text = Render(value);
    auto it = set_.find(path);
    if (it != set_.end()) {
      if (it->second.second == text) return OkStatus();
      return InvalidArgumentError(path + ": " + it->second.first + " sets " + it->second.second + ", " + source_ +
                                  " `" + key + "` sets " + text + "; keep one");
    }
    set_[path] = {source_ + " `" + key + "`", text};
    YAML::Node node = job_;
    std::stringstream parts(path);
    std::string part;
    std::vector<std::string> names;
    while (std::getline(parts, part, '.')) names.push_back(part);
    for (size_t i = 0; i + 1 < names.size(); ++i) node.reset(node[names[i]]);
    node[names.back()] = YAML::Clone(value);
    return OkStatus();
  }

  // With no `why`, the reasons table gives it and whether the key is operational (how the run is
  // driven or reported) rather than about what is trained.
  void Drop(const std::string& key, const YAML::Node& value, const std::string& why = "",
            bool operational_key = false) {
    if (IsOff(value)) {
      ++out_.unset_keys;
      return;
    }
    const Reason& r = ReasonFor(key);
    const bool operational = why.empty() ? r.operational : operational_key;
    (operational ? out_.operational : out_.dropped)
        .push_back({source_, key, Render(value), why.empty() ? r.why : why});
  }

  void Note(const std::string& n) { out_.notes.push_back(source_ + ": " + n); }

  void AddDataset(const std::string& path) {
    if (paths_.insert(path).second) job_["dataset"]["paths"].push_back(path);
    set_.emplace("dataset.paths", std::make_pair(source_, std::string("[...]")));
  }

  Status HuggingFace(const YAML::Node& root);
  Status Axolotl(const YAML::Node& root);
  Status AxolotlDatasets(const YAML::Node& list, bool eval);
  Status DeepSpeed(const YAML::Node& root);
  Status DeepSpeedOptimizer(const YAML::Node& opt);
  Status DeepSpeedScheduler(const YAML::Node& sched);
  Status DeepSpeedZero(const YAML::Node& zero);

  const ConvertOverrides overrides_;
  ConvertedJob out_;
  YAML::Node job_{YAML::NodeType::Map};
  std::map<std::string, std::pair<std::string, std::string>> set_;  // path -> (who, value)
  std::set<std::string> paths_;
  std::vector<std::string> sources_;
  std::string source_;
};

Status Converter::HuggingFace(const YAML::Node& root) {
  const std::set<std::string> training(kTrainingNames.begin(), kTrainingNames.end());
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (training.count(key)) {
      // transformers' "unset" values: max_steps -1, the optional ints null, kwargs {}.
      if (v.IsNull() || (key == "max_steps" && v.Scalar() == "-1") || (v.IsMap() && v.size() == 0)) {
        ++out_.unset_keys;
        continue;
      }
      RETURN_IF_ERROR(Set("training." + key, v, key));
    } else if (key == "output_dir" || key == "resume_from_checkpoint") {
      if (IsOff(v)) {
        ++out_.unset_keys;
        continue;
      }
      RETURN_IF_ERROR(Set(key, v, key));
    } else if (key == "packing") {
      RETURN_IF_ERROR(Set("dataset.packing", v, key));
    } else if (key == "model_name_or_path") {
      RETURN_IF_ERROR(Set("model.path", v, key));
    } else {
      Drop(key, v);
    }
  }
  return OkStatus();
}


Status Converter::AxolotlDatasets(const YAML::Node& list, bool eval) {
  const char* key = eval ? "test_datasets" : "datasets";
  if (!list.IsSequence()) return InvalidArgumentError(source_ + ": `" + std::string(key) + "` must be a list");
  // Axolotl's prompt strategies that offloadd reads natively (dataset.format).
  static const std::map<std::string, std::string> kFormats = {
      {"alpaca", "alpaca"}, {"sharegpt", "sharegpt"}, {"chat_template", "messages"},
      {"completion", "text"}, {"input_output", "prompt_completion"}};
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node d = list[i];
    const std::string where = std::string(key) + "[" + std::to_string(i) + "]";
    if (!d.IsMap() || !d["path"]) return InvalidArgumentError(source_ + ": `" + where + "` has no path");
    const std::string type = d["type"] ? d["type"].Scalar() : "alpaca";
    auto f = kFormats.find(type);
    if (f == kFormats.end()) {
      Drop(where, d, "prompt strategy '" + type + "' has no offloadd reader (alpaca, sharegpt, chat_template, "
                     "completion, input_output do)");
      continue;
    }
    const std::string path = d["path"].Scalar();
    if (eval) {
      job_["dataset"]["eval_paths"].push_back(path);
    } else {
      AddDataset(path);
    }
    RETURN_IF_ERROR(Set("dataset.format", Str(f->second), where + ".type"));
    for (const auto& kv : d) {
      const std::string k = kv.first.Scalar();
      if (k != "path" && k != "type") Drop(where + "." + k, kv.second);
    }
  }
  return OkStatus();
}

Status Converter::Axolotl(const YAML::Node& root) {
  // Axolotl's name -> the job field it is, where the meaning is the same.
  static const std::map<std::string, std::string> kSame = {
      {"base_model", "model.path"}, {"tokenizer_config", "tokenizer.path"},
      {"sequence_len", "dataset.max_seq_length"}, {"sample_packing", "dataset.packing"},
      {"micro_batch_size", "training.per_device_train_batch_size"},
      {"gradient_accumulation_steps", "training.gradient_accumulation_steps"},
      {"num_epochs", "training.num_train_epochs"}, {"max_steps", "training.max_steps"},
      {"learning_rate", "training.learning_rate"}, {"lr_scheduler", "training.lr_scheduler_type"},
      {"warmup_steps", "training.warmup_steps"}, {"warmup_ratio", "training.warmup_ratio"},
      {"weight_decay", "training.weight_decay"}, {"max_grad_norm", "training.max_grad_norm"},
      {"optimizer", "training.optim"}, {"adam_beta1", "training.adam_beta1"},
      {"adam_beta2", "training.adam_beta2"}, {"adam_epsilon", "training.adam_epsilon"},
      {"gradient_checkpointing", "training.gradient_checkpointing"}, {"logging_steps", "training.logging_steps"},
      {"save_steps", "training.save_steps"}, {"eval_steps", "training.eval_steps"},
      {"save_total_limit", "training.save_total_limit"}, {"seed", "training.seed"},
      {"output_dir", "output_dir"}, {"resume_from_checkpoint", "resume_from_checkpoint"}};
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    auto same = kSame.find(key);
    if (same != kSame.end()) {
      if (IsOff(v) && key != "gradient_checkpointing" && key != "sample_packing") {
        ++out_.unset_keys;
        continue;
      }
      // lr_scheduler: cosine with cosine_min_lr_ratio is transformers' cosine_with_min_lr.
      const bool min_lr = key == "lr_scheduler" && v.Scalar() == "cosine" && !IsOff(root["cosine_min_lr_ratio"]);
      RETURN_IF_ERROR(Set(same->second, min_lr ? Str("cosine_with_min_lr") : v, key));
    } else if (key == "datasets" || key == "test_datasets") {
      RETURN_IF_ERROR(AxolotlDatasets(v, key == "test_datasets"));
    } else if (key == "bf16" || key == "fp16") {
      if (IsAuto(v)) {
        Note("`" + key + ": auto`: the daemon picks the compute dtype (bf16 on a GPU, fp32 on the CPU)");
      } else if (!IsOff(v)) {
        RETURN_IF_ERROR(Set("training." + key, v, key));
      } else {
        ++out_.unset_keys;
      }
    } else if (key == "train_on_inputs") {  // Axolotl's default false masks the prompt
      RETURN_IF_ERROR(Set("dataset.mask_prompt", YAML::Node(IsOff(v)), key));
    } else if (key == "cosine_min_lr_ratio" && !IsOff(v)) {
      if (!root["lr_scheduler"] || root["lr_scheduler"].Scalar() != "cosine") {
        Drop(key, v, "only meaningful with lr_scheduler: cosine");
        continue;
      }
      RETURN_IF_ERROR(Set("training.lr_scheduler_kwargs.min_lr_rate", v, key));
    } else if (key == "base_model_config" || key == "model_type" || key == "tokenizer_type") {
      Drop(key, v, "read from the model directory's config.json and tokenizer files", true);
    } else {
      Drop(key, v);
    }
  }
  return OkStatus();
}

Status Converter::DeepSpeedOptimizer(const YAML::Node& opt) {
  const std::string type = opt["type"] ? opt["type"].Scalar() : "";
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool adamw = lower == "adamw" || (lower == "adam" && !(opt["params"] && opt["params"]["adam_w_mode"] &&
                                                                IsOff(opt["params"]["adam_w_mode"])));
  if (!adamw) {
    Drop("optimizer", opt, "offloadd implements AdamW only (DeepSpeed Adam with adam_w_mode, or AdamW); '" + type +
                               "' is not converted");
    return OkStatus();
  }
  if (lower == "adam") Note("optimizer Adam with adam_w_mode (its default) is AdamW");
  const YAML::Node params = opt["params"];
  if (!params) return OkStatus();
  for (const auto& kv : params) {
    const std::string k = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (IsAuto(v)) {
      Note("optimizer.params." + k + ": auto (filled from the training arguments): left to them");
    } else if (k == "lr") {
      RETURN_IF_ERROR(Set("training.learning_rate", v, "optimizer.params.lr"));
    } else if (k == "eps") {
      RETURN_IF_ERROR(Set("training.adam_epsilon", v, "optimizer.params.eps"));
    } else if (k == "weight_decay") {
      RETURN_IF_ERROR(Set("training.weight_decay", v, "optimizer.params.weight_decay"));
    } else if (k == "betas" && v.IsSequence() && v.size() == 2) {
      RETURN_IF_ERROR(Set("training.adam_beta1", v[0], "optimizer.params.betas"));
      RETURN_IF_ERROR(Set("training.adam_beta2", v[1], "optimizer.params.betas"));
    } else if (k != "adam_w_mode" && k != "torch_adam") {
      Drop("optimizer.params." + k, v);
    }
  }
  return OkStatus();
}

Status Converter::DeepSpeedScheduler(const YAML::Node& sched) {
  const std::string type = sched["type"] ? sched["type"].Scalar() : "";
  static const std::map<std::string, std::string> kTypes = {
      {"WarmupLR", "constant_with_warmup"}, {"WarmupDecayLR", "linear"}, {"WarmupCosineLR", "cosine_with_min_lr"}};
  auto t = kTypes.find(type);
  if (t == kTypes.end()) {
    Drop("scheduler", sched, "schedule '" + type + "' has no offloadd equivalent (WarmupLR, WarmupDecayLR and "
                             "WarmupCosineLR convert)");
    return OkStatus();
  }
  RETURN_IF_ERROR(Set("training.lr_scheduler_type", Str(t->second), "scheduler.type"));
  const YAML::Node p = sched["params"];
  if (!p) return OkStatus();
  for (const auto& kv : p) {
    const std::string k = kv.first.Scalar(), key = "scheduler.params." + k;
    const YAML::Node& v = kv.second;
    if (IsAuto(v)) {
      Note(key + ": auto (filled from the training arguments): left to them");
    } else if (k == "warmup_num_steps") {
      RETURN_IF_ERROR(Set("training.warmup_steps", v, key));
    } else if (k == "total_num_steps") {
      RETURN_IF_ERROR(Set("training.max_steps", v, key));
    } else if (k == "warmup_max_lr") {
      RETURN_IF_ERROR(Set("training.learning_rate", v, key));
    } else if (k == "cos_min_ratio") {
      RETURN_IF_ERROR(Set("training.lr_scheduler_kwargs.min_lr_rate", v, key));
    } else if ((k == "warmup_min_lr" || k == "warmup_min_ratio") && v.IsScalar() && v.as<double>() == 0) {
      ++out_.unset_keys;  // offloadd's warmup starts from 0, as these say
    } else if (k == "warmup_type" && v.Scalar() == "linear") {
      ++out_.unset_keys;  // offloadd's warmup is linear
    } else {
      Drop(key, v, "offloadd's warmup is linear from 0 to learning_rate");
    }
  }
  if (type == "WarmupCosineLR" && !set_.count("training.lr_scheduler_kwargs.min_lr_rate")) {
    RETURN_IF_ERROR(Set("training.lr_scheduler_kwargs.min_lr_rate", YAML::Node(0.0001), "scheduler.params"));
    Note("WarmupCosineLR's cos_min_ratio defaults to 0.0001: written as min_lr_rate");
  }
  return OkStatus();
}

Status Converter::DeepSpeedZero(const YAML::Node& zero) {
  for (const auto& kv : zero) {
    const std::string k = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (k == "offload_optimizer" || k == "offload_param") {
      if (!v.IsMap()) return InvalidArgumentError(source_ + ": zero_optimization." + k + " must be a mapping");
      for (const auto& o : v) {
        const std::string ok = o.first.Scalar(), key = "zero_optimization." + k + "." + ok;
        if (ok == "device" || ok == "nvme_path" || ok == "pin_memory" || ok == "ratio") {
          RETURN_IF_ERROR(Set("offload." + k + "." + ok, o.second, key));
        } else {
          Drop(key, o.second, "offloadd sizes its own buffers (buffer_count, buffer_size, max_in_cpu)", true);
        }
      }
    } else if (k == "stage") {
      Note("zero_optimization.stage " + v.Scalar() + ": offloadd keeps one GPU's states where offload_* say; "
           "there are no ranks to partition across");
    } else {
      Drop("zero_optimization." + k, v,
           "communication and bucketing of multi-GPU ZeRO; offloadd schedules its own transfers", true);
    }
  }
  return OkStatus();
}

Status Converter::DeepSpeed(const YAML::Node& root) {
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (IsAuto(v)) {
      Note("`" + key + ": auto` (filled from the training arguments): left to them");
    } else if (key == "train_batch_size") {
      RETURN_IF_ERROR(Set("training.train_batch_size", v, key));
    } else if (key == "train_micro_batch_size_per_gpu") {
      RETURN_IF_ERROR(Set("training.per_device_train_batch_size", v, key));
    } else if (key == "gradient_accumulation_steps") {
      RETURN_IF_ERROR(Set("training.gradient_accumulation_steps", v, key));
    } else if (key == "gradient_clipping") {
      RETURN_IF_ERROR(Set("training.max_grad_norm", v, key));
    } else if (key == "optimizer") {
      RETURN_IF_ERROR(DeepSpeedOptimizer(v));
    } else if (key == "scheduler") {
      RETURN_IF_ERROR(DeepSpeedScheduler(v));
    } else if (key == "bf16" || key == "fp16") {
      if (v["enabled"] && !IsAuto(v["enabled"])) RETURN_IF_ERROR(Set("training." + key, v["enabled"], key + ".enabled"));
      for (const auto& o : v) {
        if (o.first.Scalar() != "enabled") {
          Drop(key + "." + o.first.Scalar(), o.second,
               "offloadd's dynamic loss scale starts at 2^16 and halves on overflow, doubling after 2000 clean steps");
        }
      }
    } else if (key == "zero_optimization") {
      RETURN_IF_ERROR(DeepSpeedZero(v));
    } else if (key == "aio") {
      for (const auto& o : v) {
        const std::string ok = o.first.Scalar();
        if (ok == "block_size" || ok == "queue_depth") {
          RETURN_IF_ERROR(Set("offload.aio." + ok, o.second, "aio." + ok));
        } else {
          Drop("aio." + ok, o.second, "offloadd's store runs liburing with its own submission threads", true);
        }
      }
    } else if (key == "activation_checkpointing") {
      if (v["cpu_checkpointing"] && !IsOff(v["cpu_checkpointing"])) {
        RETURN_IF_ERROR(Set("offload.activations.mode", Str("recompute_offload_cpu"),
                            "activation_checkpointing.cpu_checkpointing"));
      }
      for (const auto& o : v) {
        if (o.first.Scalar() != "cpu_checkpointing") Drop("activation_checkpointing." + o.first.Scalar(), o.second);
      }
    } else {
      Drop(key, v);
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<ConfigKind> ParseConfigKind(const std::string& name) {
  if (name == "auto") return ConfigKind::kAuto;
  if (name == "hf" || name == "trl") return ConfigKind::kHuggingFace;
  if (name == "axolotl") return ConfigKind::kAxolotl;
  if (name == "deepspeed") return ConfigKind::kDeepSpeed;
  return InvalidArgumentError("unknown configuration kind '" + name + "' (auto, hf, trl, axolotl, deepspeed)");
}

const char* ConfigKindName(ConfigKind kind) {
  switch (kind) {
    case ConfigKind::kHuggingFace: return "hf";
    case ConfigKind::kAxolotl: return "axolotl";
    case ConfigKind::kDeepSpeed: return "deepspeed";
    default: return "auto";
  }
}


StatusOr<ConvertedJob> ConvertConfigs(const std::vector<ConfigInput>& inputs, ConfigKind kind,
                                      const ConvertOverrides& overrides) {
  if (inputs.empty()) return InvalidArgumentError("no configuration to convert");
  Converter c(overrides);
  for (const ConfigInput& in : inputs) {
    c.AddSource(in.source);
    try {
      RETURN_IF_ERROR(c.Convert(in, kind));
    } catch (const YAML::Exception& e) {  // a value of the wrong type under a mapped key
      return InvalidArgumentError(in.source + ": " + e.msg);
    }
  }
  return c.Finish();
}

}  // namespace offloadd::client
