#include "client/cpp/config_convert.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/cpp/job_file.h"

namespace offloadd::client {
namespace {

// The converted text must read as a job file with no problem at all.
offloadd::v1::JobSpec Read(const ConvertedJob& job) {
  auto contents = ReadJobSpec(job.job_yaml, "converted.yaml");
  EXPECT_TRUE(contents.ok()) << contents.status().ToString();
  if (!contents.ok()) return {};
  EXPECT_TRUE(contents->violations.empty()) << DescribeViolations("converted.yaml", contents->violations) << "\n"
                                            << job.job_yaml;
  return contents->spec;
}

const DroppedKey* Find(const std::vector<DroppedKey>& list, const std::string& key) {
  auto it = std::find_if(list.begin(), list.end(), [&](const DroppedKey& d) { return d.key == key; });
  return it == list.end() ? nullptr : &*it;
}

ConvertOverrides Paths() {
  ConvertOverrides o;
  o.model_path = "/srv/m";
  o.dataset_paths = {"/srv/d.jsonl"};
  o.output_dir = "/srv/out";
  return o;
}

TEST(ConfigConvertTest, HuggingFaceTrainingArguments) {
  // As TrainingArguments.to_json_string() writes them: every field, most at their defaults.
  const std::string json = R"({"output_dir": "/tmp/run", "learning_rate": 2e-05, "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 2, "max_steps": -1, "num_train_epochs": 3.0, "warmup_steps": 0.1,
    "lr_scheduler_type": "cosine", "lr_scheduler_kwargs": {}, "bf16": true, "fp16": false,
    "gradient_checkpointing": true, "optim": "adamw_torch_fused", "save_total_limit": null,
    "label_smoothing_factor": 0.1, "neftune_noise_alpha": null, "report_to": ["wandb"],
    "dataloader_num_workers": 4, "push_to_hub": false, "local_rank": -1, "eval_strategy": "no",
    "max_length": 512, "packing": true, "completion_only_loss": true})";
  auto job = ConvertConfigs({{"training_args.json", json}}, ConfigKind::kAuto, Paths());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->kinds, std::vector<std::string>{"hf"});
  const auto spec = Read(*job);
  EXPECT_DOUBLE_EQ(spec.training().learning_rate(), 2e-5);
  EXPECT_EQ(spec.training().per_device_train_batch_size(), 4);
  EXPECT_FALSE(spec.training().has_max_steps()) << "-1 is transformers' unset";
  EXPECT_DOUBLE_EQ(spec.training().warmup_ratio(), 0.1) << "a fractional warmup_steps is v5's ratio";
  EXPECT_TRUE(spec.training().bf16());
  EXPECT_TRUE(spec.training().gradient_checkpointing());
  EXPECT_EQ(spec.training().optim(), "adamw_torch_fused");
  EXPECT_EQ(spec.training().max_length(), 512);
  EXPECT_TRUE(spec.dataset().packing());
  EXPECT_EQ(spec.output_dir(), "/srv/out") << "the command line wins";
  EXPECT_EQ(spec.model().path(), "/srv/m");
  // Dropped: label smoothing changes the loss; the rest is how their run is driven.
  const DroppedKey* ls = Find(job->dropped, "label_smoothing_factor");
  ASSERT_NE(ls, nullptr);
  EXPECT_EQ(ls->value, "0.1");
  EXPECT_NE(Find(job->operational, "dataloader_num_workers"), nullptr);
  for (const char* k : {"report_to", "local_rank"}) EXPECT_NE(Find(job->internals, k), nullptr) << k;
  EXPECT_EQ(job->dropped.size(), 1u);
  EXPECT_GE(job->unset_keys, 4) << "push_to_hub false, neftune null, eval_strategy no, kwargs {}...";
  EXPECT_TRUE(job->missing.empty());
}

TEST(ConfigConvertTest, AxolotlYaml) {
  const std::string yaml = R"(
base_model: /srv/models/llama
model_type: LlamaForCausalLM
datasets:
  - path: /srv/data/alpaca.json
    type: alpaca
  - path: /srv/data/other.json
    type: alpaca:chatml
test_datasets:
  - path: /srv/data/eval.json
    type: alpaca
sequence_len: 1024
sample_packing: true
adapter: lora
lora_r: 16
micro_batch_size: 2
gradient_accumulation_steps: 4
num_epochs: 1
optimizer: adamw_torch
lr_scheduler: cosine
cosine_min_lr_ratio: 0.1
learning_rate: 0.0002
train_on_inputs: false
bf16: auto
gradient_checkpointing: true
flash_attention: true
warmup_steps: 10
output_dir: /srv/outputs/out
)";
  auto job = ConvertConfigs({{"axolotl.yml", yaml}}, ConfigKind::kAuto, {});
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->kinds, std::vector<std::string>{"axolotl"});
  const auto spec = Read(*job);
  EXPECT_EQ(spec.model().path(), "/srv/models/llama");
  ASSERT_EQ(spec.dataset().paths_size(), 1);
  EXPECT_EQ(spec.dataset().format(), offloadd::v1::DATASET_FORMAT_ALPACA);
  ASSERT_EQ(spec.dataset().eval_paths_size(), 1);
  EXPECT_EQ(spec.dataset().max_seq_length(), 1024);
  EXPECT_TRUE(spec.dataset().packing());
  EXPECT_TRUE(spec.dataset().mask_prompt()) << "train_on_inputs: false masks the prompt";
  EXPECT_EQ(spec.training().per_device_train_batch_size(), 2);
  EXPECT_EQ(spec.training().lr_scheduler_type(), "cosine_with_min_lr");
  EXPECT_DOUBLE_EQ(spec.training().lr_scheduler_kwargs().min_lr_rate(), 0.1);
  EXPECT_FALSE(spec.training().has_bf16()) << "bf16: auto is left to the daemon";
  EXPECT_EQ(spec.output_dir(), "/srv/outputs/out");
  // LoRA and an unsupported prompt strategy change what is trained: listed with their reason.
  ASSERT_NE(Find(job->dropped, "adapter"), nullptr);
  EXPECT_NE(Find(job->dropped, "adapter")->reason.find("every weight"), std::string::npos);
  EXPECT_NE(Find(job->dropped, "lora_r"), nullptr);
  ASSERT_NE(Find(job->dropped, "datasets[1]"), nullptr);
  EXPECT_NE(Find(job->dropped, "datasets[1]")->reason.find("alpaca:chatml"), std::string::npos);
  EXPECT_NE(Find(job->internals, "flash_attention"), nullptr);
  EXPECT_NE(Find(job->internals, "model_type"), nullptr);
  EXPECT_EQ(job->notes.size(), 1u) << "bf16: auto";
}

TEST(ConfigConvertTest, DeepSpeedConfig) {
  const std::string json = R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": "auto", "gradient_clipping": 1.0,
    "optimizer": {"type": "Adam", "params": {"lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10,
                                                      "warmup_min_lr": 0}},
    "fp16": {"enabled": true, "initial_scale_power": 12},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme0",
                          "buffer_count": 4}, "offload_param": {"device": "cpu", "pin_memory": true},
                          "overlap_comm": true},
    "aio": {"block_size": 1048576, "queue_depth": 8, "single_submit": false},
    "activation_checkpointing": {"cpu_checkpointing": true, "partition_activations": true}})";
  auto job = ConvertConfigs({{"ds_config.json", json}}, ConfigKind::kAuto, Paths());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->kinds, std::vector<std::string>{"deepspeed"});
  const auto spec = Read(*job);
  EXPECT_EQ(spec.training().train_batch_size(), 16);
  EXPECT_EQ(spec.training().per_device_train_batch_size(), 4);
  EXPECT_FALSE(spec.training().has_gradient_accumulation_steps()) << "auto is left to the other settings";
  EXPECT_DOUBLE_EQ(spec.training().max_grad_norm(), 1.0);
  EXPECT_DOUBLE_EQ(spec.training().adam_beta2(), 0.95);
  EXPECT_DOUBLE_EQ(spec.training().weight_decay(), 0.1);
  EXPECT_EQ(spec.training().lr_scheduler_type(), "linear");
  EXPECT_EQ(spec.training().warmup_steps(), 10);
  EXPECT_EQ(spec.training().max_steps(), 100);
  EXPECT_TRUE(spec.training().fp16());
  EXPECT_EQ(spec.offload().offload_optimizer().device(), offloadd::v1::OFFLOAD_DEVICE_NVME);
  EXPECT_EQ(spec.offload().offload_optimizer().nvme_path(), "/nvme0");
  EXPECT_EQ(spec.offload().offload_param().device(), offloadd::v1::OFFLOAD_DEVICE_CPU);
  EXPECT_EQ(spec.offload().aio().queue_depth(), 8u);
  EXPECT_EQ(spec.offload().activations().mode(), offloadd::v1::ACTIVATION_MODE_RECOMPUTE_OFFLOAD_CPU);
  // The loss scale's start differs from offloadd's: it changes the run, so it is listed.
  EXPECT_NE(Find(job->dropped, "fp16.initial_scale_power"), nullptr);
  EXPECT_NE(Find(job->dropped, "activation_checkpointing.partition_activations"), nullptr);
  for (const char* k : {"zero_optimization.overlap_comm", "zero_optimization.offload_optimizer.buffer_count"}) {
    EXPECT_NE(Find(job->internals, k), nullptr) << k;
  }
  EXPECT_EQ(job->unset_keys, 2) << "single_submit false, warmup_min_lr 0";
}

TEST(ConfigConvertTest, AnOptimizerOtherThanAdamWIsListedAsDropped) {
  auto job = ConvertConfigs({{"ds.json", R"({"train_batch_size": 8, "optimizer": {"type": "Lamb",
                                            "params": {"lr": 1e-3}}})"}},
                            ConfigKind::kDeepSpeed, Paths());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_NE(Find(job->dropped, "optimizer"), nullptr);
  EXPECT_NE(Find(job->dropped, "optimizer")->reason.find("AdamW only"), std::string::npos);
  EXPECT_FALSE(Read(*job).training().has_learning_rate()) << "Lamb's lr is not AdamW's";
}

// DeepSpeed's bf16 master weights / optimizer states and the 8-bit AdamW names map onto the job's
// optimizer settings; 4-bit AdamW is refused by name.
TEST(ConfigConvertTest, LowPrecisionOptimizerSettingsMapOntoTheOptimizerModes) {
  auto ds = ConvertConfigs({{"ds.json", R"({"bf16": {"enabled": true, "bf16_optimizer_states": true,
                                           "bf16_master_weights_and_grads": false}})"}},
                           ConfigKind::kDeepSpeed, Paths());
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  auto spec = Read(*ds);
  EXPECT_EQ(spec.optimizer().state_dtype(), offloadd::v1::STATE_DTYPE_BF16);
  EXPECT_EQ(spec.optimizer().master_dtype(), offloadd::v1::MASTER_DTYPE_UNSPECIFIED);
  EXPECT_EQ(Find(ds->dropped, "bf16.bf16_optimizer_states"), nullptr);
  ds = ConvertConfigs(
      {{"ds.json", R"({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})"}},
      ConfigKind::kDeepSpeed, Paths());
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(Read(*ds).optimizer().master_dtype(), offloadd::v1::MASTER_DTYPE_BF16);

  auto hf = ConvertConfigs({{"args.json", R"({"optim": "adamw_bnb_8bit", "learning_rate": 1e-4})"}},
                           ConfigKind::kAuto, Paths());
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  EXPECT_EQ(Read(*hf).training().optim(), "adamw_bnb_8bit")
      << "the daemon maps it to state_dtype int8";
  auto four = ConvertConfigs({{"args.json", R"({"optim": "adamw_torch_4bit"})"}}, ConfigKind::kAuto,
                             Paths());
  ASSERT_FALSE(four.ok());
  EXPECT_NE(std::string(four.status().message())
                .find("'adamw_torch_4bit' is not available: 4-bit optimizer states"),
            std::string::npos)
      << four.status().ToString();
}

TEST(ConfigConvertTest, InputsMergeAndContradictionsNameBoth) {
  const ConfigInput hf{"args.json", R"({"learning_rate": 3e-5, "per_device_train_batch_size": 4})"};
  auto merged = ConvertConfigs({hf, {"ds.json", R"({"train_micro_batch_size_per_gpu": 4,
                                                  "gradient_clipping": 0.5})"}},
                               ConfigKind::kAuto, Paths());
  ASSERT_TRUE(merged.ok()) << merged.status().ToString();
  EXPECT_EQ(merged->kinds, (std::vector<std::string>{"hf", "deepspeed"}));
  EXPECT_DOUBLE_EQ(Read(*merged).training().max_grad_norm(), 0.5);
  auto clash = ConvertConfigs({hf, {"ds.json", R"({"train_micro_batch_size_per_gpu": 8})"}}, ConfigKind::kAuto,
                              Paths());
  ASSERT_FALSE(clash.ok());
  const std::string msg(clash.status().message());
  EXPECT_NE(msg.find("args.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ds.json `train_micro_batch_size_per_gpu` sets 8"), std::string::npos) << msg;
}

TEST(ConfigConvertTest, MissingFieldsAndBadInputsAreNamed) {
  auto job = ConvertConfigs({{"args.json", R"({"learning_rate": 1e-4})"}}, ConfigKind::kAuto, {});
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->missing, (std::vector<std::string>{"model.path", "dataset.paths", "output_dir"}));
  EXPECT_NE(job->job_yaml.find("# Still needed before submitting: model.path dataset.paths output_dir"),
            std::string::npos);
  for (const char* bad : {"[1, 2]", "{unclosed: [", "just text"}) {
    auto r = ConvertConfigs({{"x.yaml", bad}}, ConfigKind::kAuto, {});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(std::string(r.status().message()).find("x.yaml"), std::string::npos);
  }
  auto typed = ConvertConfigs({{"ax.yml", "datasets: {path: x}"}}, ConfigKind::kAxolotl, {});
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(std::string(typed.status().message()).find("`datasets` must be a list"), std::string::npos);
  EXPECT_FALSE(ParseConfigKind("ludwig").ok());
  EXPECT_EQ(*ParseConfigKind("trl"), ConfigKind::kHuggingFace);
}

// Issue #29 item 18: values the daemon would refuse fail the conversion, naming the input and key,
// with the job validator's own rules (jobspec/training_rules.h).
TEST(ConfigConvertTest, ValuesTheDaemonWouldRefuseFailNamingTheSourceKey) {
  const struct {
    ConfigKind kind;
    const char* text;
    const char* named;  // the input's key, as the message names it
    const char* field;
  } cases[] = {
      {ConfigKind::kHuggingFace, R"({"learning_rate": "fast"})", "args `learning_rate`",
       "training.learning_rate"},
      {ConfigKind::kHuggingFace, R"({"learning_rate": .nan})", "args `learning_rate`",
       "training.learning_rate"},
      {ConfigKind::kHuggingFace, R"({"max_steps": -5})", "args `max_steps`", "training.max_steps"},
      {ConfigKind::kHuggingFace, R"({"adam_beta2": 1.5, "seed": 1})", "args `adam_beta2`",
       "training.adam_beta2"},
      {ConfigKind::kDeepSpeed, R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})",
       "args `optimizer.params.lr`", "training.learning_rate"},
      {ConfigKind::kAxolotl, "base_model: /m\nmicro_batch_size: -2\nnum_epochs: 1\n",
       "args `micro_batch_size`", "training.per_device_train_batch_size"},
  };
  for (const auto& c : cases) {
    auto r = ConvertConfigs({{"args", c.text}}, c.kind, Paths());
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    const std::string m(r.status().message());
    EXPECT_NE(m.find(std::string(c.named) + " (" + c.field + "): "), std::string::npos) << m;
  }
  // In range, and a field no input set (its default applies): converted.
  auto ok = ConvertConfigs(
      {{"args", R"({"learning_rate": 3e-4, "max_steps": 5, "lr_scheduler_type": "cosine"})"}},
      ConfigKind::kHuggingFace, Paths());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(Read(*ok).training().max_steps(), 5);
}


// TRL's max_seq_length was dropped as "no such setting" (the job trained at 1024), and the
// alignment-handbook's inline chat_template was dropped too.
TEST(ConfigConvertTest, TrlMaxSeqLengthAndAnInlineTemplateAreKept) {
  const std::string yaml = R"(
model_name_or_path: mistralai/Mistral-7B-v0.1
chat_template: "{% for message in messages %}{{ message['content'] + eos_token }}{% endfor %}"
max_seq_length: 2048
learning_rate: 2.0e-05
overwrite_output_dir: true
resume_from_checkpoint: true
)";
  ConvertOverrides o = Paths();
  o.job_file = "/srv/jobs/zephyr.yaml";
  auto job = ConvertConfigs({{"config_full.yaml", yaml}}, ConfigKind::kAuto, o);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const auto spec = Read(*job);
  EXPECT_EQ(spec.dataset().max_seq_length(), 2048);
  EXPECT_EQ(spec.model().path(), "/srv/m") << "--model replaces the Hub id";
  EXPECT_TRUE(spec.overwrite_output_dir());
  EXPECT_EQ(spec.resume_from_checkpoint(), "latest") << "transformers' true: the newest checkpoint";
  ASSERT_EQ(job->files.size(), 1u);
  EXPECT_EQ(job->files[0].path, "/srv/jobs/zephyr.chat_template.jinja");
  EXPECT_EQ(job->files[0].text, "{% for message in messages %}{{ message['content'] + eos_token }}{% endfor %}");
  EXPECT_EQ(spec.dataset().template_(), job->files[0].path);
  EXPECT_EQ(Find(job->dropped, "max_seq_length"), nullptr);
  EXPECT_EQ(Find(job->dropped, "chat_template"), nullptr);
  // Without --out there is nowhere to put the template: refused by name.
  auto no_out = ConvertConfigs({{"config_full.yaml", yaml}}, ConfigKind::kAuto, Paths());
  ASSERT_FALSE(no_out.ok());
  EXPECT_NE(std::string(no_out.status().message()).find("`chat_template` (dataset.template)"), std::string::npos)
      << no_out.status().message();
}

// LLaMA-Factory was not a kind: cutoff_len, max_samples and template were dropped.
TEST(ConfigConvertTest, LlamaFactoryIsAKindOfItsOwn) {
  const std::string yaml = R"(
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
stage: sft
finetuning_type: full
dataset: identity,alpaca_en_demo
template: qwen3_nothink
cutoff_len: 2048
max_samples: 1000
plot_loss: true
output_dir: saves/qwen3-4b/full/sft
per_device_train_batch_size: 1
learning_rate: 1.0e-5
)";
  ConvertOverrides o = Paths();
  o.job_file = "/srv/jobs/qwen3.yaml";
  auto job = ConvertConfigs({{"qwen3_full_sft.yaml", yaml}}, ConfigKind::kAuto, o);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->kinds, std::vector<std::string>{"llamafactory"});
  const auto spec = Read(*job);
  EXPECT_EQ(spec.dataset().max_seq_length(), 2048);
  EXPECT_EQ(spec.dataset().max_samples(), 1000);
  EXPECT_EQ(spec.dataset().paths(0), "/srv/d.jsonl") << "--dataset replaces the registry names";
  EXPECT_EQ(spec.dataset().paths_size(), 1);
  ASSERT_EQ(job->files.size(), 1u);
  EXPECT_NE(job->files[0].text.find("<|im_start|>"), std::string::npos) << "Qwen3's template";
  EXPECT_NE(Find(job->internals, "plot_loss"), nullptr);
  EXPECT_TRUE(job->dropped.empty()) << job->dropped[0].key;
  // Without the command line's paths, the registry names, the Hub id and the relative output_dir
  // are each refused by name.
  ConvertOverrides bare;
  bare.job_file = "/srv/jobs/qwen3.yaml";
  auto refused = ConvertConfigs({{"qwen3_full_sft.yaml", yaml}}, ConfigKind::kAuto, bare);
  ASSERT_FALSE(refused.ok());
  const std::string m(refused.status().message());
  for (const char* named : {"`model_name_or_path` (model.path): 'Qwen/Qwen3-4B-Instruct-2507' is a Hugging Face Hub id",
                            "`dataset` (dataset.paths): 'identity' is a name in LLaMA-Factory",
                            "`dataset` (dataset.paths): 'alpaca_en_demo'", "`output_dir` (output_dir): 'saves/"}) {
    EXPECT_NE(m.find(named), std::string::npos) << named << "\n" << m;
  }
  auto unknown = ConvertConfigs({{"lf.yaml", "stage: sft\ntemplate: vicuna_v9\n"}}, ConfigKind::kAuto, o);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(std::string(unknown.status().message()).find("no chat template named 'vicuna_v9' (known: chatml"),
            std::string::npos)
      << unknown.status().message();
}

// An Axolotl ShareGPT dataset became `format: messages`, and its named chat template was dropped.
TEST(ConfigConvertTest, AxolotlShareGptFieldMappingsAndNamedTemplate) {
  const std::string yaml = R"(
base_model: /srv/models/llama
chat_template: llama3
datasets:
  - path: /srv/data/finetome.jsonl
    type: chat_template
    field_messages: conversations
    message_property_mappings:
      role: from
      content: value
output_dir: /srv/out
plugins:
  - axolotl.integrations.liger.LigerPlugin
liger_rope: true
special_tokens:
  pad_token: <|finetune_right_pad_id|>
)";
  ConvertOverrides o;
  o.job_file = "/srv/jobs/ax.yaml";
  auto job = ConvertConfigs({{"ax.yml", yaml}}, ConfigKind::kAuto, o);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  const auto spec = Read(*job);
  EXPECT_EQ(spec.dataset().format(), offloadd::v1::DATASET_FORMAT_SHAREGPT);
  ASSERT_EQ(job->files.size(), 1u);
  EXPECT_NE(job->files[0].text.find("<|start_header_id|>"), std::string::npos) << "Llama 3's template";
  EXPECT_TRUE(job->dropped.empty()) << job->dropped[0].key;
  for (const char* k : {"plugins", "liger_rope", "special_tokens"}) EXPECT_NE(Find(job->internals, k), nullptr) << k;

  // The older spelling, and messages/role/content: format messages.
  auto msgs = ConvertConfigs({{"ax.yml", "base_model: /m\noutput_dir: /o\ndatasets:\n  - path: /d.jsonl\n"
                                         "    type: chat_template\n    message_field_role: role\n"}},
                             ConfigKind::kAuto, o);
  ASSERT_TRUE(msgs.ok()) << msgs.status().ToString();
  EXPECT_EQ(Read(*msgs).dataset().format(), offloadd::v1::DATASET_FORMAT_MESSAGES);
  // A layout no reader takes is refused naming the dataset's key.
  auto other = ConvertConfigs({{"ax.yml", "base_model: /m\noutput_dir: /o\ndatasets:\n  - path: /d.jsonl\n"
                                          "    type: chat_template\n    field_messages: turns\n"}},
                              ConfigKind::kAuto, o);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(std::string(other.status().message()).find("`datasets[0].field_messages` (dataset.format): turns in "
                                                       "'turns'"),
            std::string::npos)
      << other.status().message();
}

// paged_adamw_8bit, a Hub id and pin_memory: false were passed through without comment, and
// eval_steps without an eval set; the converted files did not validate.
TEST(ConfigConvertTest, ValuesThatCouldNotValidateAreRefusedOrDroppedByName) {
  auto paged = ConvertConfigs({{"fft-8b.yaml", "base_model: NousResearch/Meta-Llama-3.1-8B\n"
                                               "optimizer: paged_adamw_8bit\noutput_dir: /o\n"
                                               "datasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n"}},
                              ConfigKind::kAuto, {});
  ASSERT_FALSE(paged.ok());
  const std::string m(paged.status().message());
  for (const char* named : {"fft-8b.yaml `optimizer` (training.optim): 'paged_adamw_8bit' is not available",
                            "fft-8b.yaml `base_model` (model.path): 'NousResearch/Meta-Llama-3.1-8B' is a Hugging "
                            "Face Hub id",
                            "fft-8b.yaml `datasets[0].path` (dataset.paths): 'tatsu-lab/alpaca' is a Hugging Face "
                            "Hub dataset"}) {
    EXPECT_NE(m.find(named), std::string::npos) << named << "\n" << m;
  }
  // --model and --dataset replace the Hub ids; the optimizer is still refused.
  auto replaced = ConvertConfigs({{"fft-8b.yaml", "base_model: NousResearch/Meta-Llama-3.1-8B\n"
                                                  "optimizer: paged_adamw_8bit\n"}},
                                 ConfigKind::kAuto, Paths());
  ASSERT_FALSE(replaced.ok());
  EXPECT_EQ(std::string(replaced.status().message()).find("Hub id"), std::string::npos);

  auto ds = ConvertConfigs({{"ds.json", R"({"zero_optimization": {"stage": 2, "offload_optimizer":
                                           {"device": "cpu", "pin_memory": false}}})"},
                            {"args.json", R"({"eval_steps": 50, "learning_rate": 1e-4})"}},
                           ConfigKind::kAuto, Paths());
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  const auto spec = Read(*ds);
  EXPECT_FALSE(spec.offload().offload_optimizer().has_pin_memory());
  EXPECT_FALSE(spec.training().has_eval_steps());
  ASSERT_NE(Find(ds->operational, "zero_optimization.offload_optimizer.pin_memory"), nullptr);
  EXPECT_NE(Find(ds->operational, "zero_optimization.offload_optimizer.pin_memory")->reason.find("pinned"),
            std::string::npos);
  ASSERT_NE(Find(ds->operational, "eval_steps"), nullptr);
}

// The "changes what is trained" list was mostly library internals, and some reasons were wrong
// ("one GPU per job": offloadd trains data parallel).
TEST(ConfigConvertTest, LibraryInternalsAreAQuietGroupWithCorrectReasons) {
  const std::string json = R"({"_n_gpu": 1, "ray_scope": "last", "use_liger_kernel": true,
    "attn_implementation": "flash_attention_2", "torch_dtype": "bfloat16", "ddp_timeout": 1800,
    "average_tokens_across_devices": true, "hub_model_id": "me/model", "report_to": ["wandb"],
    "gradient_checkpointing_kwargs": {"use_reentrant": false}, "label_smoothing_factor": 0.1})";
  auto job = ConvertConfigs({{"args.json", json}}, ConfigKind::kHuggingFace, Paths());
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_EQ(job->dropped.size(), 1u) << job->dropped[0].key;
  EXPECT_EQ(job->dropped[0].key, "label_smoothing_factor");
  for (const char* k : {"_n_gpu", "ray_scope", "use_liger_kernel", "attn_implementation", "torch_dtype",
                        "ddp_timeout", "hub_model_id", "report_to", "gradient_checkpointing_kwargs"}) {
    EXPECT_NE(Find(job->internals, k), nullptr) << k;
  }
  for (const auto* list : {&job->dropped, &job->operational, &job->internals}) {
    for (const auto& d : *list) EXPECT_EQ(d.reason.find("one GPU"), std::string::npos) << d.key << ": " << d.reason;
  }
}

}  // namespace
}  // namespace offloadd::client
