// Dataset files in validation: gzip-compressed files previewed in their inflated text (bad records
// named file:line as in the plain file, truncated streams refused naming the file), and
// dataset.eval_split.

#include <cmath>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "job/job_validator.h"
#include "tests/common/gzip_test_util.h"
#include "tests/job/job_validator_fixture.h"

namespace offloadd::daemon {
namespace {

namespace fs = std::filesystem;
namespace v1 = offloadd::v1;
using testing_fixture::JobValidatorTest;

using test_util::Gzip;

TEST_F(JobValidatorTest, GzipDatasetsArePreviewedInflated) {
  const std::string good = R"({"instruction": "Say hi", "input": "", "output": "hi"})"
                           "\n";
  std::ofstream(root_ / "good.jsonl.gz", std::ios::binary) << Gzip(good + good);
  const std::string bad = good + "{\"instruction\": \"x\"}\n";
  std::ofstream(root_ / "bad.jsonl.gz", std::ios::binary) << Gzip(bad);
  const std::string whole = Gzip(good + good + good);
  std::ofstream(root_ / "cut.jsonl.gz", std::ios::binary) << whole.substr(0, whole.size() - 6);

  v1::JobSpec s = ValidSpec();
  s.mutable_dataset()->set_paths(0, root_ / "good.jsonl.gz");
  ValidationResult r = Validate(s);
  EXPECT_EQ(Find(r, "dataset.paths[0]"), nullptr) << Describe(r);

  s.mutable_dataset()->set_paths(0, root_ / "bad.jsonl.gz");
  r = Validate(s);
  const FieldViolation* refused = Find(r, "dataset.paths[0]");
  ASSERT_NE(refused, nullptr) << Describe(r);
  EXPECT_NE(refused->description.find("bad.jsonl.gz:2"), std::string::npos) << refused->description;

  s.mutable_dataset()->set_paths(0, root_ / "cut.jsonl.gz");
  r = Validate(s);
  const FieldViolation* cut = Find(r, "dataset.paths[0]");
  ASSERT_NE(cut, nullptr) << Describe(r);
  EXPECT_NE(cut->description.find("cut.jsonl.gz: truncated gzip stream"), std::string::npos)
      << cut->description;
}

TEST_F(JobValidatorTest, EvalSplitIsAFractionUpToHalfAndNotBesideEvalPaths) {
  v1::JobSpec s = ValidSpec();
  s.mutable_dataset()->set_eval_split(0.05);
  ValidationResult r = Validate(s);
  EXPECT_TRUE(r.violations.empty()) << Describe(r);
  // eval_steps defaults to logging_steps, as with eval_paths.
  EXPECT_EQ(r.resolved.training().eval_steps(), r.resolved.training().logging_steps());
  for (const double bad : {0.0, -0.1, 0.6, std::nan("")}) {
    s.mutable_dataset()->set_eval_split(bad);
    r = Validate(s);
    const FieldViolation* v = Find(r, "dataset.eval_split");
    ASSERT_NE(v, nullptr) << bad << ": " << Describe(r);
    EXPECT_NE(v->description.find("must be in (0, 0.5]"), std::string::npos) << v->description;
  }
  s.mutable_dataset()->set_eval_split(0.1);
  s.mutable_dataset()->add_eval_paths(root_ / "data.jsonl");
  r = Validate(s);
  const FieldViolation* both = Find(r, "dataset.eval_split");
  ASSERT_NE(both, nullptr) << Describe(r);
  EXPECT_NE(both->description.find("dataset.eval_paths"), std::string::npos) << both->description;
  // eval_steps without either is still refused, naming both ways to give held-out records.
  v1::JobSpec none = ValidSpec();
  none.mutable_training()->set_eval_steps(10);
  r = Validate(none);
  const FieldViolation* steps = Find(r, "training.eval_steps");
  ASSERT_NE(steps, nullptr) << Describe(r);
  EXPECT_NE(steps->description.find("dataset.eval_split"), std::string::npos) << steps->description;
}

}  // namespace
}  // namespace offloadd::daemon
