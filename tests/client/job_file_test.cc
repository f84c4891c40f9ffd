#include "client/cpp/job_file.h"

#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "client/cpp/spec_reader.h"

namespace offloadd::client {
namespace {

TEST(JobFileTest, ParsesFieldsAndShortEnums) {
  auto spec = ParseJobSpec(R"(
display_name: demo
model: {path: /srv/m, compute_dtype: bf16}
dataset:
  paths: [/srv/a.jsonl, /srv/b.json]
  format: alpaca
  max_seq_length: 512
  template: "0042"
training: {learning_rate: 3e-4, max_steps: 20, lr_scheduler_type: cosine}
offload:
  offload_optimizer: {device: nvme, nvme_path: /nvme0}
  activations: {mode: RECOMPUTE, layer_overrides: {0: keep}}
output_dir: /srv/out
)", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->model().compute_dtype(), offloadd::v1::COMPUTE_DTYPE_BF16);
  EXPECT_EQ(spec->dataset().paths_size(), 2);
  EXPECT_EQ(spec->dataset().format(), offloadd::v1::DATASET_FORMAT_ALPACA);
  EXPECT_EQ(spec->dataset().template_(), "0042") << "quoted scalars stay strings";
  EXPECT_DOUBLE_EQ(spec->training().learning_rate(), 3e-4);
  EXPECT_EQ(spec->training().max_steps(), 20);
  EXPECT_EQ(spec->offload().offload_optimizer().device(), offloadd::v1::OFFLOAD_DEVICE_NVME);
  EXPECT_EQ(spec->offload().activations().mode(), offloadd::v1::ACTIVATION_MODE_RECOMPUTE);
  EXPECT_EQ(spec->offload().activations().layer_overrides().at(0), offloadd::v1::ACTIVATION_MODE_KEEP);
}

// resources: {gpus: N}: the GPUs (executors) of a data-parallel job; gpu_index keeps
// its presence, so an explicit 0 pins GPU 0 while an unset one means any GPU.
TEST(JobFileTest, ResourcesGpusAndGpuIndex) {
  auto spec = ParseJobSpec("resources: {gpus: 2}\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->resources().gpus(), 2u);
  EXPECT_FALSE(spec->resources().has_gpu_index());
  auto pinned = ParseJobSpec("resources: {gpu_index: 0}\n", "job.yaml");
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  EXPECT_TRUE(pinned->resources().has_gpu_index());
  EXPECT_FALSE(ParseJobSpec("resources: {gpus: -1}\n", "job.yaml").ok());
}

TEST(JobFileTest, UnknownFieldIsNamed) {
  auto spec = ParseJobSpec("training: {learning_rat: 1e-4}\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("learning_rat"), std::string::npos) << spec.status().message();
  EXPECT_NE(spec.status().message().find("job.yaml"), std::string::npos);
}

// Pasted HF blocks took one run per unknown field. Every problem comes back from one
// read, by snake_case path, with a "did you mean" for near misses.
TEST(JobFileTest, EveryProblemAtOnceWithSnakeCasePathsAndSuggestions) {
  auto read = ReadJobSpec(R"(
trainingg: {}
packing: true
model: {path: [a, b], computeDtype: bf16}
dataset: {format: alpca, paths: /one.jsonl, max_seq_len: 512}
training:
  learning_rat: 1e-4
  max_grad_nrom: 1.0
  maxSteps: 2.5
  per_device_train_batch_size: many
  logging_steps: 10
resources: {gpu_memory_limit: 8 GX}
offload: {activations: {layer_overrides: {x: keep, 1: sometimes}}}
labels: {team: [a]}
)", "job.yaml");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  std::map<std::string, std::string> got;
  for (const FieldViolation& v : read->violations) got[v.field] = v.description;
  const std::map<std::string, std::string> want = {
      {"trainingg", "did you mean `training`?"},
      {"packing", "did you mean `dataset.packing`?"},
      {"model.path", "expected a string, got a list"},
      {"dataset.format", "unknown value 'alpca'; did you mean `alpaca`?"},
      {"dataset.paths", "expected a list"},
      {"dataset.max_seq_len", "did you mean `max_seq_length`?"},
      {"training.learning_rat", "did you mean `learning_rate`?"},
      {"training.max_grad_nrom", "did you mean `max_grad_norm`?"},
      {"training.max_steps", "expected a whole number, got '2.5'"},
      {"training.per_device_train_batch_size", "expected a whole number, got 'many'"},
      {"resources.gpu_memory_limit", "unknown size unit 'gx'"},
      {"offload.activations.layer_overrides[x]", "expected a whole number"},
      {"offload.activations.layer_overrides[1]", "unknown value 'sometimes'"},
      {"labels[team]", "expected a string, got a list"},
  };
  for (const auto& [field, text] : want) {
    ASSERT_TRUE(got.count(field)) << field << " missing; got:\n" << DescribeViolations("job.yaml", read->violations);
    EXPECT_NE(got[field].find(text), std::string::npos) << field << ": " << got[field];
  }
  EXPECT_EQ(got.size(), want.size()) << DescribeViolations("job.yaml", read->violations);
  // The unknown field lists the valid ones in snake_case.
  EXPECT_NE(got["training.learning_rat"].find("(fields of training: learning_rate, per_device_train_batch_size,"),
            std::string::npos);
  // What did read is kept: camelCase names are accepted, reported in snake_case.
  EXPECT_EQ(read->spec.model().compute_dtype(), offloadd::v1::COMPUTE_DTYPE_BF16);
  EXPECT_EQ(read->spec.training().logging_steps(), 10);
  // ParseJobSpec lists them all in its message, one per line.
  auto spec = ParseJobSpec("training: {learning_rat: 1, max_grad_nrom: 2}\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("job.yaml: 2 problems in the job spec:\n  training.learning_rat: unknown field"),
            std::string::npos)
      << spec.status().message();
}

TEST(JobFileTest, SizesAcceptUnitsEverywhere) {
  auto spec = ParseJobSpec(R"(
resources: {gpu_memory_limit: 8GiB, host_memory_limit: 500MB}
offload: {aio: {block_size: 1 MiB, queue_depth: 64}}
)", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->resources().gpu_memory_limit(), 8ull << 30);
  EXPECT_EQ(spec->resources().host_memory_limit(), 500000000u);
  EXPECT_EQ(spec->offload().aio().block_size(), 1u << 20);
  EXPECT_EQ(spec->offload().aio().queue_depth(), 64u);
  auto bytes = ParseJobSpec("resources: {gpu_memory_limit: 25769803776}\n", "j");
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(bytes->resources().gpu_memory_limit(), 24ull << 30);
  EXPECT_FALSE(ParseJobSpec("resources: {gpu_memory_limit: -1}\n", "j").ok());
  EXPECT_FALSE(ParseJobSpec("resources: {gpu_memory_limit: 1.5B}\n", "j").ok());
}

// Every uint64 field of the job spec is a byte size: a new one must decide (IsByteSizeField).
TEST(JobFileTest, EveryUint64FieldOfTheSpecIsAByteSize) {
  std::vector<const google::protobuf::Descriptor*> todo = {offloadd::v1::JobSpec::descriptor()};
  std::set<const google::protobuf::Descriptor*> seen;
  int sizes = 0;
  while (!todo.empty()) {
    const auto* d = todo.back();
    todo.pop_back();
    if (!seen.insert(d).second) continue;
    for (int i = 0; i < d->field_count(); ++i) {
      const auto* f = d->field(i);
      if (f->message_type()) todo.push_back(f->message_type());
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT64) {
        EXPECT_TRUE(IsByteSizeField(f)) << f->full_name();
        ++sizes;
      }
    }
  }
  EXPECT_EQ(sizes, 3);
}

TEST(JobFileTest, HfNamesReadAndFractionalWarmupIsARatio) {
  auto spec = ParseJobSpec(R"(
training:
  bf16: true
  fp16: false
  gradient_checkpointing: true
  optim: adamw_torch_fused
  warmup_steps: 0.1
  lr_scheduler_type: cosine_with_min_lr
  lr_scheduler_kwargs: {min_lr_rate: 0.1}
  max_length: 2048
  completion_only_loss: true
  assistant_only_loss: null
)", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& t = spec->training();
  EXPECT_TRUE(t.bf16());
  EXPECT_TRUE(t.has_fp16() && !t.fp16());
  EXPECT_TRUE(t.gradient_checkpointing());
  EXPECT_EQ(t.optim(), "adamw_torch_fused");
  EXPECT_FALSE(t.has_warmup_steps());
  EXPECT_DOUBLE_EQ(t.warmup_ratio(), 0.1);
  EXPECT_DOUBLE_EQ(t.lr_scheduler_kwargs().min_lr_rate(), 0.1);
  EXPECT_EQ(t.max_length(), 2048);
  EXPECT_FALSE(t.has_assistant_only_loss()) << "null is unset";
  auto whole = ParseJobSpec("training: {warmup_steps: 10}\n", "j");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->training().warmup_steps(), 10);
  EXPECT_FALSE(whole->training().has_warmup_ratio());
  for (const char* bad : {"training: {warmup_steps: 2.5}\n", "training: {warmup_steps: 0.1, warmup_ratio: 0.2}\n"}) {
    auto r = ParseJobSpec(bad, "j");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("training.warmup_steps"), std::string::npos) << r.status().message();
  }
}

TEST(JobFileTest, PerDeviceBatchSizeAutoIsAutoFindBatchSize) {
  auto spec = ParseJobSpec("training: {per_device_train_batch_size: auto, train_batch_size: 32}\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->training().auto_find_batch_size());
  EXPECT_FALSE(spec->training().has_per_device_train_batch_size()) << "the cap is left to its default";
  EXPECT_EQ(spec->training().train_batch_size(), 32);
  auto capped = ParseJobSpec("training: {auto_find_batch_size: true, per_device_train_batch_size: 16}\n", "j");
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->training().per_device_train_batch_size(), 16);
  auto bad = ParseJobSpec("training: {per_device_train_batch_size: auto, auto_find_batch_size: false}\n", "j");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto contradicts auto_find_batch_size"), std::string::npos)
      << bad.status().message();
  auto word = ParseJobSpec("training: {per_device_train_batch_size: automatic}\n", "j");
  ASSERT_FALSE(word.ok()) << "only auto is a word the field takes";
  EXPECT_NE(word.status().message().find("training.per_device_train_batch_size"), std::string::npos);
}

TEST(JobFileTest, NearestNameIsForNearMissesOnly) {
  const std::vector<std::string> names = {"learning_rate", "bf16", "fp16", "seed", "max_grad_norm"};
  EXPECT_EQ(NearestName("learning_rat", names), "learning_rate");
  EXPECT_EQ(NearestName("LearningRate", names), "learning_rate");
  EXPECT_EQ(NearestName("max_grad_nrom", names), "max_grad_norm");
  EXPECT_EQ(NearestName("bf61", names), "bf16");
  EXPECT_EQ(NearestName("deepspeed", names), "");
  EXPECT_EQ(NearestName("x", names), "");
  EXPECT_EQ(EditDistance("abc", "acb"), 1u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

TEST(JobFileTest, BadEnumAndBadYamlAreErrors) {
  EXPECT_FALSE(ParseJobSpec("dataset: {format: parquet}\n", "j").ok());
  EXPECT_FALSE(ParseJobSpec("model: [\n", "j").ok());
  EXPECT_FALSE(ParseJobSpec("- a\n- b\n", "j").ok());
  EXPECT_EQ(LoadJobFile("/nonexistent/job.yaml").status().code(), StatusCode::kNotFound);
}

// Found by the job_file fuzzer: a string with an invalid UTF-8 byte was accepted and serialized
// into a JobSpec that protobuf cannot parse back. It is a problem named by its path instead.
TEST(JobFileTest, InvalidUtf8InAStringIsAProblemNotABrokenSpec) {
  auto spec = ParseJobSpec("dataset:\n  paths: [/srv/a.jsonl, \"/sr\x82\xd0" "b.json\"]\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("dataset.paths[1]"), std::string::npos) << spec.status().message();
  EXPECT_NE(spec.status().message().find("not valid UTF-8"), std::string::npos) << spec.status().message();
  EXPECT_TRUE(ParseJobSpec("display_name: \"caf\xc3\xa9" "\"\n", "job.yaml").ok());  // valid UTF-8
}

// A 300-byte alias bomb made offloadctl abort (9^9 values on expansion).
TEST(JobFileTest, AliasBombIsRefusedNotExpanded) {
  std::string yaml = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    const char p = static_cast<char>(c - 1);
    yaml += std::string(1, c) + ": &" + c + " [*" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p + ", *" + p +
            ", *" + p + ", *" + p + ", *" + p + "]\n";
  }
  yaml += "display_name: bomb\n";
  ASSERT_LT(yaml.size(), 400u);
  auto spec = ParseJobSpec(yaml, "bomb.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("bomb.yaml: the job file expands to more than 100000 values"),
            std::string::npos)
      << spec.status().message();
  std::string deep = "labels: ";
  for (int i = 0; i < 100; ++i) deep += "[";
  for (int i = 0; i < 100; ++i) deep += "]";
  EXPECT_FALSE(ParseJobSpec(deep + "\n", "deep.yaml").ok());
}

}  // namespace
}  // namespace offloadd::client
