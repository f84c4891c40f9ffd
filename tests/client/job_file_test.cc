#include "client/cpp/job_file.h"

#include <gtest/gtest.h>

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

TEST(JobFileTest, UnknownFieldIsNamed) {
  auto spec = ParseJobSpec("training: {learning_rat: 1e-4}\n", "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("learning_rat"), std::string::npos) << spec.status().message();
  EXPECT_NE(spec.status().message().find("job.yaml"), std::string::npos);
}

TEST(JobFileTest, BadEnumAndBadYamlAreErrors) {
  EXPECT_FALSE(ParseJobSpec("dataset: {format: parquet}\n", "j").ok());
  EXPECT_FALSE(ParseJobSpec("model: [\n", "j").ok());
  EXPECT_FALSE(ParseJobSpec("- a\n- b\n", "j").ok());
  EXPECT_EQ(LoadJobFile("/nonexistent/job.yaml").status().code(), StatusCode::kNotFound);
}

// Issue #18 defect 19: a 300-byte alias bomb made offloadctl abort (9^9 values on expansion).
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
