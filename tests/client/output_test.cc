// -o json|yaml output and the exit-code mapping of offloadctl.
#include "client/offloadctl/output.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "client/offloadctl/exit_codes.h"
#include "offloadd/v1/job.pb.h"

namespace offloadctl {
namespace {

offloadd::v1::Job SampleJob() {
  offloadd::v1::Job j;
  j.set_id("job-7");
  j.set_state(offloadd::v1::JOB_STATE_RUNNING);
  j.mutable_spec()->set_display_name("yes");  // a word YAML 1.1 reads as a boolean
  j.mutable_spec()->set_output_dir("/srv/out: 1");
  return j;
}

TEST(OffloadctlOutput, JsonKeepsProtoFieldNames) {
  const std::string pretty = ToJson(SampleJob());
  EXPECT_NE(pretty.find("\"display_name\": \"yes\""), std::string::npos) << pretty;
  EXPECT_EQ(pretty.back(), '\n');
  const std::string line = ToJson(SampleJob(), /*one_line=*/true);
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
}

TEST(OffloadctlOutput, YamlReadsBackAsTheSameStrings) {
  const std::string yaml = ToYaml(SampleJob());
  const YAML::Node n = YAML::Load(yaml);
  EXPECT_EQ(n["id"].as<std::string>(), "job-7");
  EXPECT_EQ(n["state"].as<std::string>(), "running");
  EXPECT_EQ(n["spec"]["display_name"].Tag(), "!") << yaml;  // quoted: not a boolean
  EXPECT_EQ(n["spec"]["output_dir"].as<std::string>(), "/srv/out: 1");
  EXPECT_NE(yaml.find("id: job-7"), std::string::npos) << yaml;  // plain where that is safe
}

// The table and the SDK say `running` and count in numbers; so does -o json, with zeros present.
TEST(OffloadctlOutput, JsonSpellsStatesLowerCaseAndNumbersAsNumbers) {
  offloadd::v1::Job j = SampleJob();
  j.mutable_progress()->set_step(12);
  j.mutable_progress()->set_tokens_seen(int64_t{1} << 40);
  auto* t = j.add_transitions();
  t->set_state(offloadd::v1::JOB_STATE_CANCELLED);
  const auto tree = nlohmann::json::parse(ToJson(j));
  EXPECT_EQ(tree["state"], "running");
  EXPECT_EQ(tree["transitions"][0]["state"], "cancelled");
  EXPECT_TRUE(tree["progress"]["step"].is_number_integer()) << tree.dump();
  EXPECT_EQ(tree["progress"]["step"].get<int64_t>(), 12);
  EXPECT_EQ(tree["progress"]["tokens_seen"].get<int64_t>(), int64_t{1} << 40);
  ASSERT_TRUE(tree["progress"].contains("max_steps")) << tree.dump();  // zero, present
  EXPECT_EQ(tree["progress"]["max_steps"].get<int64_t>(), 0);
  EXPECT_FALSE(tree["spec"].contains("model")) << tree.dump();  // an unset message stays absent
  // A job file reads the short spellings back (spec_reader): the spec's enums round-trip.
  offloadd::v1::JobSpec spec;
  spec.mutable_dataset()->set_format(offloadd::v1::DATASET_FORMAT_SHAREGPT);
  EXPECT_EQ(nlohmann::json::parse(ToJson(spec))["dataset"]["format"], "sharegpt");
  const YAML::Node y = YAML::Load(ToYaml(j));
  EXPECT_EQ(y["progress"]["step"].Tag(), "?") << ToYaml(j);  // plain: a number, not a string
}

TEST(OffloadctlOutput, JsonToYamlKeepsOrderTypesAndEmptyObjects) {
  EXPECT_EQ(JsonToYaml("{\"b\": 1, \"a\": [true, null, \"12\"]}"),
            "b: 1\na:\n  - true\n  - ~\n  - \"12\"\n");
  EXPECT_EQ(JsonToYaml("{}"), "{}\n");
  EXPECT_EQ(JsonToYaml("{not json"), "");
}

TEST(OffloadctlOutput, ParseOutputFormat) {
  EXPECT_EQ(ParseOutputFormat("json"), OutputFormat::kJson);
  EXPECT_EQ(ParseOutputFormat("yaml"), OutputFormat::kYaml);
  EXPECT_EQ(ParseOutputFormat("table"), OutputFormat::kTable);
  EXPECT_FALSE(ParseOutputFormat("xml").has_value());
}

TEST(OffloadctlExitCodes, StatusCodes) {
  using offloadd::StatusCode;
  EXPECT_EQ(ExitCodeFor(StatusCode::kNotFound), 4);
  EXPECT_EQ(ExitCodeFor(StatusCode::kUnavailable), 5);
  EXPECT_EQ(ExitCodeFor(StatusCode::kDeadlineExceeded), 5);
  EXPECT_EQ(ExitCodeFor(StatusCode::kInvalidArgument), 6);
  EXPECT_EQ(ExitCodeFor(StatusCode::kPermissionDenied), 7);
  EXPECT_EQ(ExitCodeFor(StatusCode::kInternal), 7);
}

TEST(OffloadctlExitCodes, JobStates) {
  EXPECT_EQ(ExitCodeForJobState(offloadd::v1::JOB_STATE_SUCCEEDED), 0);
  EXPECT_EQ(ExitCodeForJobState(offloadd::v1::JOB_STATE_FAILED), 1);
  EXPECT_EQ(ExitCodeForJobState(offloadd::v1::JOB_STATE_CANCELLED), 3);
}

}  // namespace
}  // namespace offloadctl
