// The job validator against the model's positions and the output directory's checkpoints.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/job/job_validator_fixture.h"

namespace offloadd::daemon {
namespace {

namespace fs = std::filesystem;
namespace v1 = offloadd::v1;
using testing_fixture::JobValidatorTest;

TEST_F(JobValidatorTest, SequenceLengthBeyondTheModelsPositionsIsRefusedNamingBoth) {
  const std::string llama =
      R"({"model_type": "llama", "vocab_size": 50257, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 512)";
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc) << llama << "}";
  v1::JobSpec s = ValidSpec();
  s.mutable_dataset()->set_max_seq_length(8192);
  ValidationResult r = Validate(s);
  const FieldViolation* w = Find(r, "dataset.max_seq_length");
  ASSERT_NE(w, nullptr) << Describe(r);
  EXPECT_NE(w->description.find("8192 tokens"), std::string::npos) << w->description;
  EXPECT_NE(w->description.find("max_position_embeddings is 512"), std::string::npos) << w->description;
  s.mutable_dataset()->set_max_seq_length(512);
  r = Validate(s);
  EXPECT_EQ(Find(r, "dataset.max_seq_length"), nullptr) << Describe(r);
  // Left unset, the default (1024) gives way to the model's 512 positions.
  s.mutable_dataset()->clear_max_seq_length();
  r = Validate(s);
  EXPECT_EQ(Find(r, "dataset.max_seq_length"), nullptr) << Describe(r);
  EXPECT_EQ(r.resolved.dataset().max_seq_length(), 512);

  // Linear scaling stretches the positions by its factor: 512 x 4 = 2048.
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << llama << R"(, "rope_scaling": {"rope_type": "linear", "factor": 4.0}})";
  s.mutable_dataset()->set_max_seq_length(2048);
  r = Validate(s);
  EXPECT_EQ(Find(r, "dataset.max_seq_length"), nullptr) << Describe(r);
  s.mutable_dataset()->set_max_seq_length(2049);
  r = Validate(s);
  w = Find(r, "dataset.max_seq_length");
  ASSERT_NE(w, nullptr) << Describe(r);
  EXPECT_NE(w->description.find("linear RoPE scaling = 2048"), std::string::npos) << w->description;

  // YaRN extends original_max_position_embeddings by its factor: 256 x 8 = 2048.
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << llama << R"(, "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                     "original_max_position_embeddings": 256}})";
  s.mutable_dataset()->set_max_seq_length(2048);
  r = Validate(s);
  EXPECT_EQ(Find(r, "dataset.max_seq_length"), nullptr) << Describe(r);
}

// max_seq_length up to the model's positions is accepted when the GPU budget holds it at batch
// 1; under a budget that does not, the refusal names the largest length that fits, which is then
// accepted (8 tokens more are not).
TEST_F(JobValidatorTest, LongSequenceFitsTheBudgetOrNamesTheLargestThatFits) {
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << R"({"model_type": "llama", "vocab_size": 50257, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 32768})";
  GpuFacts gpu;
  gpu.name = "test GPU";
  gpu.total_memory_bytes = 80ull << 30;
  node_.gpus.push_back(gpu);
  v1::JobSpec s = ValidSpec();
  s.mutable_training()->set_per_device_train_batch_size(1);
  s.mutable_resources()->set_gpu_memory_limit(80ull << 30);
  s.mutable_dataset()->set_max_seq_length(8192);
  const uint64_t floor_8k = Validate(s).memory_floor.gpu_bytes;
  s.mutable_dataset()->set_max_seq_length(32768);
  ValidationResult r = Validate(s);
  EXPECT_EQ(Find(r, "dataset.max_seq_length"), nullptr) << Describe(r);
  EXPECT_EQ(Find(r, "resources.gpu_memory_limit"), nullptr) << Describe(r);
  ASSERT_GT(r.memory_floor.gpu_bytes, floor_8k);

  s.mutable_resources()->set_gpu_memory_limit(floor_8k);
  r = Validate(s);
  const FieldViolation* g = Find(r, "resources.gpu_memory_limit");
  ASSERT_NE(g, nullptr) << Describe(r);
  const std::string said = "the largest dataset.max_seq_length that fits at batch 1 is ";
  const size_t at = g->description.find(said);
  ASSERT_NE(at, std::string::npos) << g->description;
  const int64_t fits = std::stoll(g->description.substr(at + said.size()));
  EXPECT_GE(fits, 8192 - 8) << g->description;
  EXPECT_LT(fits, 32768) << g->description;
  s.mutable_dataset()->set_max_seq_length(static_cast<int32_t>(fits));
  r = Validate(s);
  EXPECT_EQ(Find(r, "resources.gpu_memory_limit"), nullptr) << Describe(r);
  s.mutable_dataset()->set_max_seq_length(static_cast<int32_t>(fits + 8));
  EXPECT_NE(Find(Validate(s), "resources.gpu_memory_limit"), nullptr);
}

// An output_dir holding another run's checkpoints passed validation and failed once the job had
// started. Now it is refused at validation unless resume_from_checkpoint (latest: the newest) or
// overwrite_output_dir says what to do with them, as Hugging Face's TrainingArguments do.
TEST_F(JobValidatorTest, OutputDirWithCheckpointsIsRefusedResumedOrOverwritten) {
  v1::JobSpec s = ValidSpec();
  const fs::path out = root_ / "out" / "run1";
  fs::create_directories(out / "checkpoint-5");
  fs::create_directories(out / "checkpoint-40");
  fs::create_directories(out / "checkpoint-x");  // not a checkpoint name
  ValidationResult r = Validate(s);
  const FieldViolation* w = Find(r, "output_dir");
  ASSERT_NE(w, nullptr) << Describe(r);
  EXPECT_NE(w->description.find("2 checkpoint(s) (newest checkpoint-40)"), std::string::npos) << w->description;
  EXPECT_NE(w->description.find("resume_from_checkpoint: latest"), std::string::npos) << w->description;
  EXPECT_NE(w->description.find("overwrite_output_dir: true"), std::string::npos) << w->description;

  s.set_overwrite_output_dir(true);
  r = Validate(s);
  EXPECT_TRUE(r.ok()) << Describe(r);

  // latest resolves to the newest by step (40, not 5), which is then opened as a checkpoint: these
  // empty directories are not, and the reader says so under resume_from_checkpoint.
  s.set_overwrite_output_dir(false);
  s.set_resume_from_checkpoint("latest");
  r = Validate(s);
  EXPECT_EQ(Find(r, "output_dir"), nullptr) << Describe(r);
  ASSERT_NE(Find(r, "resume_from_checkpoint"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "resume_from_checkpoint")->description.find("checkpoint-40"), std::string::npos)
      << Describe(r);
  s.set_overwrite_output_dir(true);
  r = Validate(s);
  EXPECT_NE(Find(r, "overwrite_output_dir"), nullptr) << Describe(r);

  fs::remove_all(out);
  s = ValidSpec();
  s.set_resume_from_checkpoint("latest");
  r = Validate(s);
  w = Find(r, "resume_from_checkpoint");
  ASSERT_NE(w, nullptr) << Describe(r);
  EXPECT_NE(w->description.find("holds no checkpoint"), std::string::npos) << w->description;
}

}  // namespace
}  // namespace offloadd::daemon
