#pragma once
// The fixture of the job validator's tests (job_validator_test.cc,
// job_validator_positions_test.cc).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include <gtest/gtest.h>

#include "job/job_validator.h"
#include "job/shape_profile.h"

namespace offloadd::daemon::testing_fixture {

namespace fs = std::filesystem;
namespace v1 = offloadd::v1;

// A tiny GPT-2 checkpoint directory with the real GPT-2 tokenizer from ../shared/data, an Alpaca
// dataset, and an allowed root around them.
class JobValidatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
    shared_ = fs::path(src ? src : ".") / ".." / "shared" / "data";
    if (!fs::exists(shared_ / "tokenizers" / "gpt2" / "tokenizer.json")) {
      GTEST_SKIP() << "../shared/data (real tokenizers) not present";
    }
    char tmpl[] = "/tmp/offloadd_validator_XXXXXX";
    root_ = mkdtemp(tmpl);
    fs::create_directories(root_ / "model");
    std::ofstream(root_ / "model" / "config.json")
        << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4,
              "n_positions": 256})";
    std::ofstream(root_ / "model" / "model.safetensors") << "x";
    fs::copy_file(shared_ / "tokenizers" / "gpt2" / "tokenizer.json", root_ / "model" / "tokenizer.json");
    std::ofstream(root_ / "data.jsonl") << R"({"instruction": "Say hi", "input": "", "output": "hi"})" << "\n"
                                        << R"({"instruction": "Add", "input": "1+1", "output": "2"})" << "\n";
    node_.host_memory_bytes = 64ull << 30;
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  v1::JobSpec ValidSpec() const {
    v1::JobSpec s;
    s.mutable_model()->set_path(root_ / "model");
    s.mutable_dataset()->add_paths(root_ / "data.jsonl");
    s.mutable_dataset()->set_max_seq_length(128);
    s.mutable_training()->set_per_device_train_batch_size(2);
    s.set_output_dir(root_ / "out" / "run1");
    s.set_dropout(v1::DROPOUT_MODE_DISABLE);  // GPT-2's transformers defaults are 0.1
    return s;
  }

  ValidationResult Validate(const v1::JobSpec& s) const { return ValidateJobSpec(s, PathPolicy({root_}), node_); }

  static std::string Describe(const ValidationResult& r) {
    std::string out;
    for (const auto& v : r.violations) out += v.field + ": " + v.description + "\n";
    return out;
  }

  static const FieldViolation* Find(const ValidationResult& r, const std::string& field) {
    for (const auto& v : r.violations) {
      if (v.field == field) return &v;
    }
    return nullptr;
  }

  fs::path shared_;
  fs::path root_;
  NodeBudget node_;
};

}  // namespace offloadd::daemon::testing_fixture
