// CreateJob validation is bounded per request, not per rendering. Repeated
// dataset paths are checked once, the chat template renderings of all records and files share one
// step budget, an oversized template file is refused unread, and validation stops as soon as
// ValidationOptions::stop says nobody waits for it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "job/job_validator.h"
#include "text/chat_template.h"

namespace offloadd::daemon {
namespace {

namespace fs = std::filesystem;
namespace v1 = offloadd::v1;

// A tiny GPT-2 model directory with the real GPT-2 tokenizer and an Alpaca dataset of 8 records.
class ValidationBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
    const fs::path shared = fs::path(src ? src : ".") / ".." / "shared" / "data";
    if (!fs::exists(shared / "tokenizers" / "gpt2" / "tokenizer.json")) {
      GTEST_SKIP() << "../shared/data (real tokenizers) not present";
    }
    char tmpl[] = "/tmp/offloadd_vbudget_XXXXXX";
    root_ = mkdtemp(tmpl);
    fs::create_directories(root_ / "model");
    std::ofstream(root_ / "model" / "config.json")
        << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4,
              "n_positions": 256})";
    std::ofstream(root_ / "model" / "model.safetensors") << "x";
    fs::copy_file(shared / "tokenizers" / "gpt2" / "tokenizer.json",
                  root_ / "model" / "tokenizer.json");
    std::ofstream data(root_ / "data.jsonl");
    for (int i = 0; i < 8; ++i)
      data << R"({"instruction": "Say hi", "input": "", "output": "hi"})"
           << "\n";
    node_.host_memory_bytes = 64ull << 30;
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  v1::JobSpec SpecWithTemplate(const std::string& source, int copies_of_the_dataset) const {
    std::ofstream(root_ / "t.jinja") << source;
    v1::JobSpec s;
    s.mutable_model()->set_path(root_ / "model");
    for (int i = 0; i < copies_of_the_dataset; ++i)
      s.mutable_dataset()->add_paths(root_ / "data.jsonl");
    s.mutable_dataset()->set_template_(root_ / "t.jinja");
    s.mutable_dataset()->set_max_seq_length(128);
    s.mutable_training()->set_per_device_train_batch_size(2);
    s.set_output_dir(root_ / "out");
    s.set_dropout(v1::DROPOUT_MODE_DISABLE);
    return s;
  }

  ValidationResult Validate(const v1::JobSpec& s, const ValidationOptions& o = {}) const {
    return ValidateJobSpec(s, PathPolicy({root_}), node_, o);
  }

  static std::string Describe(const ValidationResult& r) {
    std::string out;
    for (const auto& v : r.violations) out += v.field + ": " + v.description + "\n";
    return out;
  }

  fs::path root_;
  NodeBudget node_;
};

// A prefix-stable template that spends ~20k steps per rendering before printing the messages.
constexpr const char* kSlowTemplate =
    "{% for i in range(10000) %}{% endfor %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";

TEST_F(ValidationBudgetTest, ARepeatedPathIsCheckedOnce) {
  // Every rendering fails: each check of the file adds a violation.
  const ValidationResult r = Validate(SpecWithTemplate("{{ raise_exception('no') }}", 64));
  ASSERT_EQ(r.violations.size(), 1u) << Describe(r);
  EXPECT_EQ(r.violations[0].field, "dataset.paths[0]");
  // The resolved spec still lists every path, as given.
  EXPECT_EQ(r.resolved.dataset().paths_size(), 64);
}

TEST_F(ValidationBudgetTest, RenderingsOfAllRecordsShareTheRequestsStepBudget) {
  const v1::JobSpec spec = SpecWithTemplate(kSlowTemplate, 1);
  ASSERT_TRUE(Validate(spec).ok()) << "within the default budget:\n" << Describe(Validate(spec));
  // 8 records, 3 renderings each (the whole conversation, and before and after the reply), each
  // well within its own RenderLimits: together more than 200k steps.
  ValidationOptions small;
  small.max_render_steps = 200'000;
  const ValidationResult r = Validate(spec, small);
  ASSERT_EQ(r.violations.size(), 1u) << Describe(r);
  EXPECT_EQ(r.violations[0].field, "dataset.paths[0]");
  EXPECT_NE(r.violations[0].description.find(
                "took more than 200000 steps in all (the budget of one CreateJob"),
            std::string::npos)
      << Describe(r);
}

TEST_F(ValidationBudgetTest, NamesOfOneFileAreCheckedOnce) {
  for (int i = 0; i < 16; ++i)
    fs::create_symlink(root_ / "data.jsonl", root_ / ("d" + std::to_string(i) + ".jsonl"));
  v1::JobSpec spec = SpecWithTemplate("{{ raise_exception('no') }}", 0);
  for (int i = 0; i < 16; ++i)
    spec.mutable_dataset()->add_paths(root_ / ("d" + std::to_string(i) + ".jsonl"));
  // Resolved, the 16 names are one file: checked once.
  EXPECT_EQ(Validate(spec).violations.size(), 1u) << Describe(Validate(spec));
}

TEST_F(ValidationBudgetTest, AnOversizedTemplateFileIsRefusedUnread) {
  const ValidationResult r =
      Validate(SpecWithTemplate(std::string(text::kMaxChatTemplateBytes + 1, 'x'), 1));
  ASSERT_EQ(r.violations.size(), 1u) << Describe(r);
  EXPECT_EQ(r.violations[0].field, "dataset.template");
  EXPECT_NE(r.violations[0].description.find("a chat template may have"), std::string::npos)
      << Describe(r);
}

TEST_F(ValidationBudgetTest, StopEndsValidationEarly) {
  // Per rendering ~3M steps (within the 4M limit): 24 renderings would take many seconds.
  const v1::JobSpec spec = SpecWithTemplate(
      "{% for i in range(1500) %}{% for j in range(1000) %}{% endfor %}{% endfor %}"
      "{% for m in messages %}{{ m['content'] }}{% endfor %}",
      1);
  std::atomic<int> asked{0};
  ValidationOptions o;
  o.stop = [&] { return ++asked > 20; };  // the client goes away during the first rendering
  const auto t0 = std::chrono::steady_clock::now();
  const ValidationResult r = Validate(spec, o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.stopped.code(), StatusCode::kCancelled) << r.stopped.ToString() << "\n"
                                                      << Describe(r);
  EXPECT_LT(took, 2.0) << "validation went on after stop()";
  // Stopped before anything is read.
  ValidationOptions at_once;
  at_once.stop = [] { return true; };
  EXPECT_EQ(Validate(spec, at_once).stopped.code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace offloadd::daemon
