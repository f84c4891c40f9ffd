#pragma once
// offloadctl convert's converter (config_convert.h), shared by its source files: the state over
// all inputs and the helpers that read their values. Internal to offloadd_client; not thread-safe.

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "client/cpp/config_convert.h"
#include "client/cpp/config_convert_tables.h"
#include "client/cpp/job_file.h"
#include "jobspec/training_rules.h"

namespace offloadd::client::convert {

// TrainingArguments / SFTConfig names that the job spec's `training:` takes as they are
// (docs/hf-names.md): offloadd's own and the HF aliases job validation maps.
inline constexpr std::array<const char*, 27> kTrainingNames = {
    "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "num_train_epochs",
    "max_steps", "warmup_ratio", "warmup_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "weight_decay",
    "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "seed", "logging_steps", "save_steps",
    "save_total_limit", "bf16", "fp16", "gradient_checkpointing", "optim", "max_length",
    "completion_only_loss", "assistant_only_loss", "eval_steps", "auto_find_batch_size"};

// The `optim` values that mean AdamW as offloadd implements it (the daemon's AdamWOptimNames,
// docs/hf-names.md): any other optimizer is refused by the daemon, so the conversion names it.
inline constexpr const char* kAdamWNames[] = {"adamw_torch",     "adamw_torch_fused", "adamw_hf",
                                              "adamw_apex_fused", "adamw_torch_xla",  "adamw_torch_npu_fused"};
// 8-bit AdamW (bitsandbytes): the daemon maps these onto optimizer.state_dtype int8.
inline constexpr const char* kAdamW8bitNames[] = {"adamw_8bit", "adamw_bnb_8bit"};

inline std::string Render(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

inline bool IsOff(const YAML::Node& v) {
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

inline bool IsAuto(const YAML::Node& v) { return v.IsScalar() && v.Scalar() == "auto"; }

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
      case ConfigKind::kLlamaFactory: return LlamaFactory(root);
      default: return HuggingFace(root);
    }
  }

  StatusOr<ConvertedJob> Finish() {
    RETURN_IF_ERROR(PlaceModelAndOutput());
    RETURN_IF_ERROR(PlaceDatasets());
    RETURN_IF_ERROR(PlaceTemplate());
    source_ = "the command line";
    for (const char* required : {"model.path", "dataset.paths", "output_dir"}) {
      const bool mixed = std::string(required) == "dataset.paths" && set_.count("dataset.datasets");
      if (!set_.count(required) && !mixed) out_.missing.push_back(required);
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
    for (const auto& [field, by] : set_) out_.set_by[field] = by.first;
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
    const size_t n = problems.size() + refused_.size();
    if (n == 0) return OkStatus();
    std::string message = std::to_string(n) + (n == 1 ? " value" : " values") +
                          " the converted job could not be validated with:";
    for (const auto& r : refused_) message += "\n  " + r.who + " (" + r.field + "): " + r.why;
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
    // LLaMA-Factory: its own names, and `dataset` / `template` as names of its registries.
    for (const char* k : {"cutoff_len", "finetuning_type", "stage"}) {
      if (root[k]) return ConfigKind::kLlamaFactory;
    }
    if (root["dataset"] && root["dataset"].IsScalar() && root["template"] && root["template"].IsScalar())
      return ConfigKind::kLlamaFactory;
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

  // With no `why`, the reasons table gives it and its group.
  void Drop(const std::string& key, const YAML::Node& value, const std::string& why = "",
            Group group = Group::kTrains) {
    if (IsOff(value)) {
      ++out_.unset_keys;
      return;
    }
    const convert::Reason& r = ReasonFor(key);
    const Group g = why.empty() ? r.group : group;
    auto& list = g == Group::kTrains ? out_.dropped : g == Group::kOperational ? out_.operational : out_.internals;
    list.push_back({source_, key, Render(value), why.empty() ? r.why : why});
  }

  // A value the converted job could not be validated with: the conversion fails naming it.
  void Refuse(const std::string& key, const std::string& field, const std::string& why) {
    refused_.push_back({source_ + " `" + key + "`", field, why});
  }

  void Note(const std::string& n) { out_.notes.push_back(source_ + ": " + n); }

  Status HuggingFace(const YAML::Node& root);
  Status Axolotl(const YAML::Node& root);
  Status AxolotlDatasets(const YAML::Node& list, bool eval);
  Status DeepSpeed(const YAML::Node& root);
  Status DeepSpeedOptimizer(const YAML::Node& opt);
  Status DeepSpeedScheduler(const YAML::Node& sched);
  Status DeepSpeedZero(const YAML::Node& zero);

  // A value some input gave, with who gave it ("args.json `model_name_or_path`").
  struct Given {
    std::string source, key, value;
    bool registry_name = false;  // a LLaMA-Factory dataset name, not a path
    std::string who() const { return source + " `" + key + "`"; }
  };
  struct Refused {
    std::string who, field, why;
  };

  Status PlaceModelAndOutput();
  Status PlaceDatasets();
  void PlaceMixture(const std::function<bool(const Given&)>& local);
  Status PlaceTemplate();
  void SetModel(const YAML::Node& v, const std::string& key);
  void SetOutputDir(const YAML::Node& v, const std::string& key);
  void AddDataset(const std::string& path, const std::string& key, bool eval, bool registry_name = false);
  Status SetTemplate(const YAML::Node& v, const std::string& key);
  Status SetOptim(const YAML::Node& v, const std::string& key);
  Status SetResume(const YAML::Node& v, const std::string& key);
  Status HuggingFaceKey(const std::string& key, const YAML::Node& v);
  Status DatasetMixture(const YAML::Node& v);
  Status LlamaFactory(const YAML::Node& root);
  Status AxolotlChatFields(const YAML::Node& d, const std::string& where, const std::string& type);

  const ConvertOverrides overrides_;
  ConvertedJob out_;
  YAML::Node job_{YAML::NodeType::Map};
  std::map<std::string, std::pair<std::string, std::string>> set_;  // path -> (who, value)
  std::vector<std::string> sources_;
  std::string source_;
  std::vector<Given> models_, outputs_, datasets_, eval_datasets_;
  // The alignment-handbook's dataset_mixture weights, by the key of the dataset they weigh.
  std::map<std::string, std::string> mixture_weights_;
  std::optional<Given> template_;  // text (inline or resolved) in value; key says where from
  std::string template_note_;
  std::vector<Refused> refused_;
};


}  // namespace offloadd::client::convert
