// offloadctl convert: HF / TRL / Axolotl / LLaMA-Factory / DeepSpeed configurations to a job file
// (see the header).
#include "client/cpp/config_convert.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "client/cpp/config_convert_internal.h"

namespace offloadd::client::convert {

Status Converter::HuggingFace(const YAML::Node& root) {
  for (const auto& kv : root) RETURN_IF_ERROR(HuggingFaceKey(kv.first.Scalar(), kv.second));
  return OkStatus();
}

// One key of a TrainingArguments / TRL SFTConfig (also the HF names LLaMA-Factory and the
// alignment-handbook recipes use).
Status Converter::HuggingFaceKey(const std::string& key, const YAML::Node& v) {
  static const std::set<std::string> training(kTrainingNames.begin(), kTrainingNames.end());
  if (training.count(key)) {
    // transformers' "unset" values: max_steps -1, the optional ints null, kwargs {}.
    if (v.IsNull() || (key == "max_steps" && v.Scalar() == "-1") || (v.IsMap() && v.size() == 0)) {
      ++out_.unset_keys;
      return OkStatus();
    }
    if (key == "optim") return SetOptim(v, key);
    return Set("training." + key, v, key);
  }
  if (key == "output_dir") {
    SetOutputDir(v, key);
  } else if (key == "resume_from_checkpoint") {
    return SetResume(v, key);
  } else if (key == "overwrite_output_dir") {
    if (IsOff(v)) {
      ++out_.unset_keys;
      return OkStatus();
    }
    return Set("overwrite_output_dir", v, key);
  } else if (key == "max_seq_length") {  // TRL before 0.20; `max_length` since
    if (IsOff(v)) {
      ++out_.unset_keys;
      return OkStatus();
    }
    return Set("dataset.max_seq_length", v, key);
  } else if (key == "packing") {
    return Set("dataset.packing", v, key);
  } else if (key == "model_name_or_path") {
    SetModel(v, key);
  } else if (key == "chat_template" || key == "chat_template_path") {
    return SetTemplate(v, key);
  } else if (key == "dataset_name") {
    if (IsOff(v)) {
      ++out_.unset_keys;
    } else {
      AddDataset(v.Scalar(), key, false);
    }
  } else if (key == "dataset_mixture") {
    return DatasetMixture(v);
  } else if (key == "dataset_config" || key == "dataset_train_split" || key == "dataset_test_split") {
    Drop(key, v, "part of the Hub dataset's name: offloadd reads the records from local files (--dataset)",
         Group::kOperational);
  } else if (key == "train_sampling_strategy" && v.IsScalar() && v.Scalar() == "random") {
    ++out_.unset_keys;  // transformers' default: a random order per epoch, as offloadd's shuffle
  } else if (key == "average_tokens_across_devices" && !IsOff(v)) {
    ++out_.unset_keys;  // offloadd's loss is the global batch's mean per trained token, as this says
  } else if (key == "dataset_kwargs" && v.IsMap() && v["add_special_tokens"] && IsOff(v["add_special_tokens"])) {
    // Chat records are rendered and tokenized without extra special tokens, as this asks.
    for (const auto& o : v) {
      if (o.first.Scalar() != "add_special_tokens") Drop("dataset_kwargs." + o.first.Scalar(), o.second);
    }
  } else {
    Drop(key, v);
  }
  return OkStatus();
}

// The alignment-handbook's dataset_mixture: Hub datasets with the columns they keep.
Status Converter::DatasetMixture(const YAML::Node& v) {
  if (!v.IsMap() || !v["datasets"] || !v["datasets"].IsSequence()) {
    Drop("dataset_mixture", v);
    return OkStatus();
  }
  for (size_t i = 0; i < v["datasets"].size(); ++i) {
    const YAML::Node d = v["datasets"][i];
    const std::string where = "dataset_mixture.datasets[" + std::to_string(i) + "]";
    if (!d.IsMap() || !d["id"]) return InvalidArgumentError(source_ + ": `" + where + "` has no id");
    // The handbook concatenates every entry's split for training (test_split_size carves the
    // eval set from the whole), so each is a training source.
    AddDataset(d["id"].Scalar(), where + ".id", false);
    if (d["weight"] && d["weight"].IsScalar())
      mixture_weights_[where + ".id"] = d["weight"].Scalar();
    if (d["columns"] && d["columns"].IsSequence() && d["columns"].size() == 1 &&
        d["columns"][0].Scalar() == "messages") {
      RETURN_IF_ERROR(Set("dataset.format", Str("messages"), where + ".columns"));
    }
    for (const auto& kv : d) {
      const std::string k = kv.first.Scalar();
      if (k == "config" || k == "split") {
        Drop(where + "." + k, kv.second, "part of the Hub dataset's name: offloadd reads local files (--dataset)",
             Group::kOperational);
      }
    }
  }
  for (const auto& kv : v) {
    const std::string k = kv.first.Scalar();
    if (k == "test_split_size") {
      Drop("dataset_mixture.test_split_size", kv.second,
           "records held out for evaluation: not converted (set dataset.eval_split to the "
           "fraction, or "
           "give dataset.eval_paths)");
    } else if (k == "seed") {
      Drop("dataset_mixture.seed", kv.second, "the seed of the held-out split", Group::kOperational);
    } else if (k != "datasets") {
      Drop("dataset_mixture." + k, kv.second);
    }
  }
  return OkStatus();
}

void Converter::SetModel(const YAML::Node& v, const std::string& key) {
  if (IsOff(v)) {
    ++out_.unset_keys;
    return;
  }
  models_.push_back({source_, key, v.Scalar()});
}

void Converter::SetOutputDir(const YAML::Node& v, const std::string& key) {
  if (IsOff(v)) {
    ++out_.unset_keys;
    return;
  }
  outputs_.push_back({source_, key, v.Scalar()});
}

void Converter::AddDataset(const std::string& path, const std::string& key, bool eval, bool registry_name) {
  (eval ? eval_datasets_ : datasets_).push_back({source_, key, path, registry_name});
}

// transformers' resume_from_checkpoint: a path, or true for the newest checkpoint in output_dir
// (offloadd's `latest`).
Status Converter::SetResume(const YAML::Node& v, const std::string& key) {
  if (IsOff(v)) {
    ++out_.unset_keys;
    return OkStatus();
  }
  std::string s = v.Scalar();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "true" || s == "yes" || s == "latest") return Set("resume_from_checkpoint", Str("latest"), key);
  return Set("resume_from_checkpoint", v, key);
}

Status Converter::SetOptim(const YAML::Node& v, const std::string& key) {
  const std::string name = v.Scalar();
  for (const char* ok : kAdamWNames) {
    if (name == ok) return Set("training.optim", v, key);
  }
  for (const char* ok : kAdamW8bitNames) {
    if (name == ok) return Set("training.optim", v, key);  // optimizer.state_dtype int8
  }
  std::string list;
  for (const char* ok : kAdamWNames) list += (list.empty() ? "" : ", ") + std::string(ok);
  if (name == "adamw_torch_4bit") {
    Refuse(key, "training.optim",
           "'adamw_torch_4bit' is not available: 4-bit optimizer states are not offered; the "
           "smallest are "
           "8-bit (adamw_8bit, adamw_bnb_8bit: optimizer.state_dtype int8)");
    return OkStatus();
  }
  Refuse(key, "training.optim",
         "'" + name + "' is not available: offloadd trains with AdamW (fp32 states: " + list +
             "; 8-bit states: adamw_8bit, adamw_bnb_8bit); set one of those");
  return OkStatus();
}

// A chat template: Jinja text (it holds "{%" or "{{"), a file (TRL's chat_template_path), a name
// Axolotl or LLaMA-Factory knows, or "tokenizer_default" (the tokenizer's own: nothing to set).
Status Converter::SetTemplate(const YAML::Node& v, const std::string& key) {
  if (IsOff(v)) {
    ++out_.unset_keys;
    return OkStatus();
  }
  if (!v.IsScalar()) return InvalidArgumentError(source_ + ": `" + key + "` must be a string");
  const std::string text = v.Scalar();
  if (text == "tokenizer_default" || text == "default_chat_template") return OkStatus();
  Given g{source_, key, text};
  if (key == "chat_template_path") {
    return Set("dataset.template", v, key);
  } else if (text.find("{%") == std::string::npos && text.find("{{") == std::string::npos) {
    std::string note;
    StatusOr<std::string> named = convert::NamedChatTemplate(text, &note);
    if (!named.ok()) {
      Refuse(key, "dataset.template", std::string(named.status().message()));
      return OkStatus();
    }
    if (!note.empty()) Note(note);
    g.value = *named;
  }
  if (template_ && template_->value != g.value) {
    return InvalidArgumentError("dataset.template: " + template_->who() + " and " + g.who() +
                                " give different chat templates; keep one");
  }
  template_ = g;
  return OkStatus();
}

// --model and --output-dir replace what the inputs say. A model given as a Hub id cannot be
// validated: offloadd reads a local directory.
Status Converter::PlaceModelAndOutput() {
  source_ = "the command line";
  if (!overrides_.model_path.empty()) {
    RETURN_IF_ERROR(Set("model.path", Str(overrides_.model_path), "--model"));
  } else {
    for (const Given& m : models_) {
      if (convert::LooksLikeHubId(m.value)) {
        refused_.push_back({m.who(), "model.path", "'" + m.value + "' is a Hugging Face Hub id; offloadd trains a "
                                                 "local model directory: download it and give --model DIR"});
      } else {
        source_ = m.source;
        RETURN_IF_ERROR(Set("model.path", Str(m.value), m.key));
      }
    }
  }
  if (!overrides_.output_dir.empty()) {
    source_ = "the command line";
    return Set("output_dir", Str(overrides_.output_dir), "--output-dir");
  }
  for (const Given& o : outputs_) {
    if (!o.value.empty() && o.value[0] != '/') {
      refused_.push_back({o.who(), "output_dir", "'" + o.value + "' is relative to where their trainer ran; give "
                                               "an absolute directory with --output-dir"});
      continue;
    }
    source_ = o.source;
    RETURN_IF_ERROR(Set("output_dir", Str(o.value), o.key));
  }
  return OkStatus();
}

// --dataset replaces every training dataset the inputs name (their format and fields still apply
// to it); otherwise each must be a local file.
Status Converter::PlaceDatasets() {
  auto local = [&](const Given& d) -> bool {
    if (d.registry_name) {
      refused_.push_back({d.who(), "dataset.paths", "'" + d.value + "' is a name in LLaMA-Factory's "
                                                  "data/dataset_info.json; give its records as a JSON or "
                                                  "JSON Lines file with --dataset"});
      return false;
    }
    if (convert::LooksLikeHubId(d.value)) {
      refused_.push_back({d.who(), "dataset.paths", "'" + d.value + "' is a Hugging Face Hub dataset; offloadd "
                                                  "reads local JSON or JSON Lines files: give them with --dataset"});
      return false;
    }
    return true;
  };
  std::set<std::string> seen;
  if (!overrides_.dataset_paths.empty()) {
    for (const std::string& p : overrides_.dataset_paths) {
      if (seen.insert(p).second) job_["dataset"]["paths"].push_back(p);
    }
    set_.emplace("dataset.paths", std::make_pair(std::string("the command line `--dataset`"), "[...]"));
    if (!datasets_.empty()) Note("--dataset replaces the configuration's " + datasets_.front().who());
  } else if (std::any_of(mixture_weights_.begin(), mixture_weights_.end(),
                         [](const auto& w) { return w.second != "1" && w.second != "1.0"; })) {
    PlaceMixture(local);
  } else {
    for (const Given& d : datasets_) {
      if (!local(d) || !seen.insert(d.value).second) continue;
      job_["dataset"]["paths"].push_back(d.value);
      set_.emplace("dataset.paths", std::make_pair(d.who(), std::string("[...]")));
    }
  }
  for (const Given& d : eval_datasets_) {
    if (d.registry_name || convert::LooksLikeHubId(d.value)) {
      source_ = d.source;
      Drop(d.key, Str(d.value), "a Hub dataset or registry name: offloadd evaluates local files "
                                "(dataset.eval_paths)", Group::kOperational);
      continue;
    }
    job_["dataset"]["eval_paths"].push_back(d.value);
    set_.emplace("dataset.eval_paths", std::make_pair(d.who(), std::string("[...]")));
  }
  // eval_steps without held-out records would be refused; theirs evaluated a split offloadd
  // does not make (val_set_size, test_split_size), reported above.
  const YAML::Node job = job_;  // const: reading must not add the keys it looks for
  if (job["training"] && job["training"]["eval_steps"] && !(job["dataset"] && job["dataset"]["eval_paths"])) {
    const auto by = set_.at("training.eval_steps");
    out_.operational.push_back({by.first.substr(0, by.first.find(" `")), "eval_steps", by.second,
                                "no held-out records to evaluate (dataset.eval_paths) in the converted job"});
    job_["training"].remove("eval_steps");
    set_.erase("training.eval_steps");
  }
  return OkStatus();
}

namespace {

// The records of a JSON Lines file (its non-blank lines); an error for anything else.
StatusOr<uint64_t> CountJsonLines(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return InvalidArgumentError("'" + path + "' is not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError("cannot read '" + path + "'");
  uint64_t n = 0;
  std::string line;
  while (std::getline(in, line)) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    if (n == 0 && line[first] != '{') {
      return InvalidArgumentError("'" + path +
                                  "' is not JSON Lines (its records cannot be counted)");
    }
    ++n;
  }
  if (n == 0) return InvalidArgumentError("'" + path + "' holds no records");
  return n;
}

}  // namespace

// The handbook keeps the fraction `weight` of each dataset (a seeded subset) and concatenates
// them: dataset i gives weight_i x n_i of the epoch's records. offloadd's mixture draws dataset i
// with probability weight_i / sum(weights), so the job's weight is the handbook's x n_i (n_i: the
// records of its JSON Lines file), which gives each dataset the same expected share; with the
// default first_exhausted an epoch then draws about sum(weight_i x n_i) / max(weight) records.
void Converter::PlaceMixture(const std::function<bool(const Given&)>& local) {
  for (const Given& d : datasets_) {
    if (!local(d)) continue;
    const auto given = mixture_weights_.find(d.key);
    const std::string weight = given == mixture_weights_.end() ? "" : given->second;
    char* end = nullptr;
    const double fraction = weight.empty() ? 1.0 : std::strtod(weight.c_str(), &end);
    if (!weight.empty() &&
        (end != weight.c_str() + weight.size() || !(fraction > 0 && fraction <= 1))) {
      refused_.push_back(
          {d.who(), "dataset.datasets",
           "weight '" + weight + "': the handbook's weight is a fraction in (0, 1]"});
      continue;
    }
    auto records = CountJsonLines(d.value);
    if (!records.ok()) {
      refused_.push_back(
          {d.who(), "dataset.datasets",
           std::string(records.status().message()) +
               ": a dataset_mixture weight below 1 becomes weight x records, counted "
               "in a JSON Lines file; write dataset.datasets yourself"});
      continue;
    }
    YAML::Node entry;
    entry["paths"].push_back(d.value);
    char w[32];
    std::snprintf(w, sizeof w, "%.12g", fraction * static_cast<double>(*records));
    entry["weight"] = std::string(w);
    job_["dataset"]["datasets"].push_back(entry);
    set_.emplace("dataset.datasets", std::make_pair(d.who(), std::string("[...]")));
  }
  Note(
      "dataset_mixture's weights: each dataset is drawn with weight = the handbook's fraction x "
      "its records, the share the handbook's subset gives it (docs/datasets.md)");
}

// The chat template goes into a file beside the job file, which dataset.template names.
Status Converter::PlaceTemplate() {
  if (!template_) return OkStatus();
  if (overrides_.job_file.empty() || overrides_.job_file == "-") {
    refused_.push_back({template_->who(), "dataset.template",
                        "the chat template is written to a file beside the job file: give --out FILE"});
    return OkStatus();
  }
  std::string base = overrides_.job_file;
  if (base[0] != '/') {
    std::error_code ec;
    base = (std::filesystem::current_path(ec) / base).lexically_normal().string();
  }
  if (const size_t dot = base.rfind('.'); dot != std::string::npos && dot > base.rfind('/')) base.resize(dot);
  const std::string path = base + ".chat_template.jinja";
  out_.files.push_back({path, template_->value});
  source_ = template_->source;
  return Set("dataset.template", Str(path), template_->key);
}

// LLaMA-Factory's train YAML: HF TrainingArguments names plus its own data and method keys.
Status Converter::LlamaFactory(const YAML::Node& root) {
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (key == "stage" && v.Scalar() == "sft") continue;             // what offloadd trains
    if (key == "finetuning_type" && v.Scalar() == "full") continue;  // every weight
    if (key == "dataset" || key == "eval_dataset") {
      std::stringstream names(v.Scalar());
      for (std::string n; std::getline(names, n, ',');) {
        n.erase(0, n.find_first_not_of(' '));
        n.erase(n.find_last_not_of(' ') + 1);
        if (!n.empty()) AddDataset(n, key, key == "eval_dataset", true);
      }
    } else if (key == "template") {
      RETURN_IF_ERROR(SetTemplate(v, key));
    } else if (key == "cutoff_len") {
      RETURN_IF_ERROR(Set("dataset.max_seq_length", v, key));
    } else if (key == "max_samples") {
      RETURN_IF_ERROR(Set("dataset.max_samples", v, key));
    } else if (key == "train_on_prompt") {  // LLaMA-Factory's default false masks the prompt
      RETURN_IF_ERROR(Set("dataset.mask_prompt", YAML::Node(IsOff(v)), key));
    } else if (key == "dataset_dir" || key == "media_dir") {
      Drop(key, v, "where LLaMA-Factory's dataset registry lives: offloadd reads the files given", Group::kOperational);
    } else {
      RETURN_IF_ERROR(HuggingFaceKey(key, v));
    }
  }
  return OkStatus();
}

Status Converter::AxolotlDatasets(const YAML::Node& list, bool eval) {
  const char* key = eval ? "test_datasets" : "datasets";
  if (!list.IsSequence()) return InvalidArgumentError(source_ + ": `" + std::string(key) + "` must be a list");
  // Axolotl's prompt strategies that offloadd reads natively (dataset.format); chat_template and
  // sharegpt read by their field mapping (AxolotlChatFields).
  static const std::map<std::string, std::string> kFormats = {
      {"alpaca", "alpaca"}, {"completion", "text"}, {"input_output", "prompt_completion"}};
  static const std::set<std::string> kChatKeys = {"field_messages", "message_property_mappings",
                                                  "message_field_role", "message_field_content",
                                                  "chat_template", "conversation"};
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node d = list[i];
    const std::string where = std::string(key) + "[" + std::to_string(i) + "]";
    if (!d.IsMap() || !d["path"]) return InvalidArgumentError(source_ + ": `" + where + "` has no path");
    const std::string type = d["type"] ? d["type"].Scalar() : "alpaca";
    const bool chat = type == "chat_template" || type == "sharegpt";
    auto f = kFormats.find(type);
    if (!chat && f == kFormats.end()) {
      Drop(where, d, "prompt strategy '" + type + "' has no offloadd reader (alpaca, sharegpt, chat_template, "
                     "completion, input_output do)");
      continue;
    }
    AddDataset(d["path"].Scalar(), where + ".path", eval);
    if (chat) {
      RETURN_IF_ERROR(AxolotlChatFields(d, where, type));
    } else {
      RETURN_IF_ERROR(Set("dataset.format", Str(f->second), where + ".type"));
    }
    for (const auto& kv : d) {
      const std::string k = kv.first.Scalar();
      if (k == "path" || k == "type" || (chat && kChatKeys.count(k))) continue;
      if (k == "split") {
        Drop(where + ".split", kv.second, "offloadd reads whole files: cut the split into the file given to "
                                          "--dataset");
      } else {
        Drop(where + "." + k, kv.second);
      }
    }
  }
  return OkStatus();
}

// Axolotl's chat datasets name the list of turns and the keys of a turn (field_messages,
// message_property_mappings or the older message_field_role/_content). offloadd reads two
// layouts: messages/role/content (format messages) and conversations/from/value (format
// sharegpt, whose from values human/gpt/system/tool map as Axolotl's default roles do).
Status Converter::AxolotlChatFields(const YAML::Node& d, const std::string& where, const std::string& type) {
  const bool sharegpt = type == "sharegpt";
  auto text = [&](const YAML::Node& n, const char* fallback) { return n && n.IsScalar() ? n.Scalar() : fallback; };
  const std::string messages = text(d["field_messages"], sharegpt ? "conversations" : "messages");
  const YAML::Node map = d["message_property_mappings"];
  const std::string role = text(map && map.IsMap() ? map["role"] : d["message_field_role"], sharegpt ? "from" : "role");
  const std::string content =
      text(map && map.IsMap() ? map["content"] : d["message_field_content"], sharegpt ? "value" : "content");
  std::string format;
  if (messages == "messages" && role == "role" && content == "content") format = "messages";
  if (messages == "conversations" && role == "from" && content == "value") format = "sharegpt";
  if (format.empty()) {
    Refuse(where + ".field_messages", "dataset.format",
           "turns in '" + messages + "' with keys '" + role + "'/'" + content +
               "': offloadd reads messages/role/content (format messages) or conversations/from/value (format "
               "sharegpt); rename the fields in the file");
    return OkStatus();
  }
  if (map && map.IsMap()) {
    for (const auto& kv : map) {
      if (kv.first.Scalar() != "role" && kv.first.Scalar() != "content")
        Drop(where + ".message_property_mappings." + kv.first.Scalar(), kv.second);
    }
  }
  RETURN_IF_ERROR(Set("dataset.format", Str(format), where + ".field_messages"));
  if (d["chat_template"]) RETURN_IF_ERROR(SetTemplate(d["chat_template"], where + ".chat_template"));
  if (d["conversation"]) RETURN_IF_ERROR(SetTemplate(d["conversation"], where + ".conversation"));
  return OkStatus();
}

Status Converter::Axolotl(const YAML::Node& root) {
  // Axolotl's name -> the job field it is, where the meaning is the same.
  static const std::map<std::string, std::string> kSame = {
      {"tokenizer_config", "tokenizer.path"},
      {"sequence_len", "dataset.max_seq_length"}, {"sample_packing", "dataset.packing"},
      {"micro_batch_size", "training.per_device_train_batch_size"},
      {"gradient_accumulation_steps", "training.gradient_accumulation_steps"},
      {"num_epochs", "training.num_train_epochs"}, {"max_steps", "training.max_steps"},
      {"learning_rate", "training.learning_rate"}, {"lr_scheduler", "training.lr_scheduler_type"},
      {"warmup_steps", "training.warmup_steps"}, {"warmup_ratio", "training.warmup_ratio"},
      {"weight_decay", "training.weight_decay"}, {"max_grad_norm", "training.max_grad_norm"},
      {"adam_beta1", "training.adam_beta1"},
      {"adam_beta2", "training.adam_beta2"}, {"adam_epsilon", "training.adam_epsilon"},
      {"gradient_checkpointing", "training.gradient_checkpointing"}, {"logging_steps", "training.logging_steps"},
      {"save_steps", "training.save_steps"}, {"eval_steps", "training.eval_steps"},
      {"save_total_limit", "training.save_total_limit"}, {"seed", "training.seed"}};
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
    } else if (key == "base_model") {
      SetModel(v, key);
    } else if (key == "output_dir") {
      SetOutputDir(v, key);
    } else if (key == "resume_from_checkpoint") {
      RETURN_IF_ERROR(SetResume(v, key));
    } else if (key == "optimizer" && !IsOff(v)) {
      RETURN_IF_ERROR(SetOptim(v, key));
    } else if (key == "chat_template") {
      // `jinja` takes the template from chat_template_jinja (text or a file).
      if (v.Scalar() != "jinja") RETURN_IF_ERROR(SetTemplate(v, key));
    } else if (key == "chat_template_jinja") {
      if (std::ifstream f(v.Scalar()); !IsOff(v) && v.Scalar().find("{") == std::string::npos && f) {
        std::stringstream text;
        text << f.rdbuf();
        RETURN_IF_ERROR(SetTemplate(YAML::Node(text.str()), key));
      } else {
        RETURN_IF_ERROR(SetTemplate(v, key));
      }
    } else if (key == "special_tokens" && v.IsMap() && v.size() == 1 && v["pad_token"]) {
      Drop(key, v, "padding is masked out of the loss and attention: the pad token is never trained",
           Group::kInternal);
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
      Drop(key, v, "read from the model directory's config.json and tokenizer files", Group::kInternal);
    } else {
      Drop(key, v);
    }
  }
  return OkStatus();
}

}  // namespace offloadd::client::convert

namespace offloadd::client {

StatusOr<ConfigKind> ParseConfigKind(const std::string& name) {
  if (name == "auto") return ConfigKind::kAuto;
  if (name == "hf" || name == "trl") return ConfigKind::kHuggingFace;
  if (name == "axolotl") return ConfigKind::kAxolotl;
  if (name == "deepspeed") return ConfigKind::kDeepSpeed;
  if (name == "llamafactory" || name == "llama-factory") return ConfigKind::kLlamaFactory;
  return InvalidArgumentError("unknown configuration kind '" + name +
                              "' (auto, hf, trl, axolotl, llamafactory, deepspeed)");
}

const char* ConfigKindName(ConfigKind kind) {
  switch (kind) {
    case ConfigKind::kHuggingFace: return "hf";
    case ConfigKind::kAxolotl: return "axolotl";
    case ConfigKind::kDeepSpeed: return "deepspeed";
    case ConfigKind::kLlamaFactory: return "llamafactory";
    default: return "auto";
  }
}


StatusOr<ConvertedJob> ConvertConfigs(const std::vector<ConfigInput>& inputs, ConfigKind kind,
                                      const ConvertOverrides& overrides) {
  if (inputs.empty()) return InvalidArgumentError("no configuration to convert");
  convert::Converter c(overrides);
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
