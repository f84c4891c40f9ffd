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
  for (const char* k : {"report_to", "dataloader_num_workers", "local_rank"}) {
    EXPECT_NE(Find(job->operational, k), nullptr) << k;
  }
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
output_dir: ./outputs/out
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
  EXPECT_EQ(spec.output_dir(), "./outputs/out");
  // LoRA and an unsupported prompt strategy change what is trained: listed with their reason.
  ASSERT_NE(Find(job->dropped, "adapter"), nullptr);
  EXPECT_NE(Find(job->dropped, "adapter")->reason.find("every weight"), std::string::npos);
  EXPECT_NE(Find(job->dropped, "lora_r"), nullptr);
  ASSERT_NE(Find(job->dropped, "datasets[1]"), nullptr);
  EXPECT_NE(Find(job->dropped, "datasets[1]")->reason.find("alpaca:chatml"), std::string::npos);
  EXPECT_NE(Find(job->operational, "flash_attention"), nullptr);
  EXPECT_NE(Find(job->operational, "model_type"), nullptr);
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
    EXPECT_NE(Find(job->operational, k), nullptr) << k;
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

}  // namespace
}  // namespace offloadd::client
