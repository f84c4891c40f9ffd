#include "daemon/openai/openai_jobs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "common/file.h"

namespace offloadd::daemon::openai {
namespace {

using nlohmann::json;
namespace v1 = offloadd::v1;

class OpenAiJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/openai_jobs_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_TRUE(MakeDirs(dir_ + "/models/tiny-llama").ok());
    context_.model_dir = dir_ + "/models";
    context_.output_root = dir_ + "/out";
    context_.base_learning_rate = 1e-4;
    context_.file = [this](const std::string& id) -> StatusOr<StoredFile> {
      if (id == "file-train")
        return StoredFile{id, 100, 1, "t.jsonl", "fine-tune", "x", 10, dir_ + "/t.jsonl"};
      if (id == "file-valid")
        return StoredFile{id, 50, 1, "v.jsonl", "fine-tune", "x", 4, dir_ + "/v.jsonl"};
      if (id == "file-batch")
        return StoredFile{id, 50, 1, "b.jsonl", "batch", "x", 4, dir_ + "/b.jsonl"};
      return NotFoundError("no such file: '" + id + "'");
    };
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  v1::JobSpec Spec(const json& body) {
    auto r = SpecFromRequest(body.dump(), context_);
    if (auto* e = std::get_if<ApiError>(&r)) {
      ADD_FAILURE() << body.dump() << " -> " << e->param << ": " << e->message;
      return {};
    }
    return std::get<v1::JobSpec>(r);
  }
  ApiError Refusal(const json& body) {
    auto r = SpecFromRequest(body.dump(), context_);
    if (auto* e = std::get_if<ApiError>(&r)) return *e;
    ADD_FAILURE() << body.dump() << " was accepted";
    return ApiError(0, "");
  }

  std::string dir_;
  JobRequestContext context_;
};

// docs/openai_api.md's mapping table, field by field.
TEST_F(OpenAiJobsTest, ARequestMapsOntoTheJobSpec) {
  const v1::JobSpec s = Spec(
      {{"model", "tiny-llama"},
       {"training_file", "file-train"},
       {"validation_file", "file-valid"},
       {"hyperparameters", {{"n_epochs", 2}, {"batch_size", 4}, {"learning_rate_multiplier", 0.5}}},
       {"suffix", "demo"},
       {"seed", 7}});
  EXPECT_EQ(s.model().path(), dir_ + "/models/tiny-llama");
  ASSERT_EQ(s.dataset().paths_size(), 1);
  EXPECT_EQ(s.dataset().paths(0), dir_ + "/t.jsonl");
  EXPECT_EQ(s.dataset().format(), v1::DATASET_FORMAT_MESSAGES);
  ASSERT_EQ(s.dataset().eval_paths_size(), 1);
  EXPECT_EQ(s.dataset().eval_paths(0), dir_ + "/v.jsonl");
  EXPECT_EQ(s.training().num_train_epochs(), 2);
  EXPECT_EQ(s.training().per_device_train_batch_size(), 4);
  EXPECT_FALSE(s.training().auto_find_batch_size());
  EXPECT_DOUBLE_EQ(s.training().learning_rate(), 0.5 * 1e-4);
  EXPECT_EQ(s.training().seed(), 7);
  EXPECT_EQ(s.training().logging_steps(), 1);
  // A checkpoint per epoch (10 records in batches of 4: 3 steps), the last three kept.
  EXPECT_EQ(s.training().save_steps(), 3);
  EXPECT_EQ(s.training().eval_steps(), 3);
  EXPECT_EQ(s.training().save_total_limit(), 3);
  EXPECT_EQ(s.display_name(), "ft:tiny-llama:demo");
  EXPECT_EQ(s.output_dir().rfind(dir_ + "/out/ft-tiny-llama-demo-", 0), 0u) << s.output_dir();
  EXPECT_EQ(s.labels().at("openai.training_file"), "file-train");
  EXPECT_EQ(s.labels().at("openai.model"), "tiny-llama");

  // method.supervised.hyperparameters is the same thing; "auto" leaves the daemon's choice.
  const v1::JobSpec m =
      Spec({{"model", dir_ + "/models/tiny-llama"},
            {"training_file", "file-train"},
            {"method",
             {{"type", "supervised"},
              {"supervised", {{"hyperparameters", {{"n_epochs", 1}, {"batch_size", "auto"}}}}}}}});
  EXPECT_EQ(m.model().path(), dir_ + "/models/tiny-llama");
  EXPECT_EQ(m.training().num_train_epochs(), 1);
  EXPECT_TRUE(m.training().auto_find_batch_size());
  EXPECT_DOUBLE_EQ(m.training().learning_rate(), 1e-4);
  EXPECT_FALSE(m.training().has_seed());
  EXPECT_EQ(m.dataset().eval_paths_size(), 0);
}

TEST_F(OpenAiJobsTest, WhatIsUnknownOrUnsupportedIsRefusedNamingTheParameter) {
  const json base = {{"model", "tiny-llama"}, {"training_file", "file-train"}};
  const struct {
    json patch;
    std::string param, says;
  } cases[] = {
      {{{"learning_rate", 1e-3}}, "learning_rate", "unknown parameter 'learning_rate'"},
      {{{"model", "gpt-4o-mini"}}, "model", "does not exist"},
      {{{"model", "../etc"}}, "model", "is not a name of a directory"},
      {{{"training_file", "file-missing"}}, "training_file", "no such file"},
      {{{"training_file", "file-batch"}}, "training_file", "purpose 'batch'"},
      {{{"validation_file", "file-missing"}}, "validation_file", "no such file"},
      {{{"hyperparameters", {{"n_epochs", 0}}}}, "hyperparameters.n_epochs", "[1, 50]"},
      {{{"hyperparameters", {{"batch_size", 2.5}}}}, "hyperparameters.batch_size", "integer"},
      {{{"hyperparameters", {{"learning_rate_multiplier", -1}}}},
       "hyperparameters.learning_rate_multiplier",
       "(0, 100]"},
      {{{"hyperparameters", {{"beta", 0.1}}}}, "hyperparameters.beta", "unknown hyperparameter"},
      {{{"method", {{"type", "dpo"}}}}, "method.type", "'dpo' is not supported"},
      // A non-string type threw out of json::value and ended the process (the fuzzer's find).
      {{{"method", {{"type", {{"hyperparameters", {{"batch_size", "auto"}}}}}}}},
       "method.type",
       "must be a string"},
      {{{"method",
         {{"type", "supervised"}, {"supervised", {{"hyperparameters", {{"n_epochs", 1}}}}}}},
        {"hyperparameters", {{"n_epochs", 1}}}},
       "hyperparameters",
       "not both"},
      {{{"integrations", json::array({{{"type", "wandb"}}})}}, "integrations", "not supported"},
      {{{"metadata", {{"team", "a"}}}}, "metadata", "not supported"},
      {{{"suffix", "has space"}}, "suffix", "1 to 64"},
      {{{"seed", -1}}, "seed", "[0, 2147483647]"},
  };
  for (const auto& c : cases) {
    json body = base;
    body.update(c.patch);
    const ApiError e = Refusal(body);
    EXPECT_EQ(e.status, 400) << body.dump();
    EXPECT_EQ(e.param, c.param) << body.dump() << " -> " << e.message;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << body.dump() << " -> " << e.message;
  }
  EXPECT_EQ(Refusal({{"training_file", "file-train"}}).param, "model");
  EXPECT_EQ(Refusal({{"model", "tiny-llama"}}).param, "training_file");
  EXPECT_EQ(Refusal(json::array()).status, 400);
  context_.model_dir = "";
  EXPECT_NE(Refusal(base).message.find("server.openai_api.model_dir"), std::string::npos);
}

TEST_F(OpenAiJobsTest, JobsShowWithOpenAisStatusesAndTheirModelWhenDone) {
  v1::Job job;
  job.set_id("job-1");
  job.mutable_create_time()->set_seconds(1700000000);
  *job.mutable_spec() = Spec({{"model", "tiny-llama"},
                              {"training_file", "file-train"},
                              {"hyperparameters", {{"n_epochs", 3}}}});
  const std::pair<v1::JobState, const char*> states[] = {
      {v1::JOB_STATE_VALIDATING, "validating_files"},
      {v1::JOB_STATE_QUEUED, "queued"},
      {v1::JOB_STATE_RUNNING, "running"},
      {v1::JOB_STATE_PAUSING, "running"},
      {v1::JOB_STATE_PAUSED, "paused"},
      {v1::JOB_STATE_CANCELLING, "cancelled"},
      {v1::JOB_STATE_CANCELLED, "cancelled"},
      {v1::JOB_STATE_FAILED, "failed"},
      {v1::JOB_STATE_SUCCEEDED, "succeeded"}};
  for (const auto& [state, name] : states) {
    job.set_state(state);
    const json j = JobJson(job);
    EXPECT_EQ(j["status"], name);
    EXPECT_EQ(j["fine_tuned_model"].is_null(), state != v1::JOB_STATE_SUCCEEDED) << name;
  }
  job.mutable_end_time()->set_seconds(1700000100);
  job.mutable_progress()->set_tokens_seen(1234);
  const json j = JobJson(job);
  EXPECT_EQ(j["object"], "fine_tuning.job");
  EXPECT_EQ(j["fine_tuned_model"], job.spec().output_dir());
  EXPECT_EQ(j["model"], "tiny-llama");
  EXPECT_EQ(j["training_file"], "file-train");
  EXPECT_EQ(j["hyperparameters"]["n_epochs"], 3);
  EXPECT_EQ(j["hyperparameters"]["batch_size"], "auto");
  EXPECT_EQ(j["created_at"], 1700000000);
  EXPECT_EQ(j["finished_at"], 1700000100);
  EXPECT_EQ(j["trained_tokens"], 1234);

  job.set_state(v1::JOB_STATE_FAILED);
  job.mutable_error()->set_message("dataset.paths[0]: line 3 is bad");
  job.mutable_error()->set_field_path("dataset.paths[0]");
  const json failed = JobJson(job);
  EXPECT_EQ(failed["error"]["message"], "dataset.paths[0]: line 3 is bad");
  EXPECT_EQ(failed["error"]["param"], "training_file");

  // A job created through gRPC: its paths stand for the model and the files.
  v1::Job grpc_job;
  grpc_job.set_state(v1::JOB_STATE_QUEUED);
  grpc_job.mutable_spec()->mutable_model()->set_path("/srv/models/m");
  grpc_job.mutable_spec()->mutable_dataset()->add_paths("/srv/data/d.jsonl");
  grpc_job.mutable_spec()->mutable_training()->set_per_device_train_batch_size(8);
  const json g = JobJson(grpc_job);
  EXPECT_EQ(g["model"], "/srv/models/m");
  EXPECT_EQ(g["training_file"], "/srv/data/d.jsonl");
  EXPECT_EQ(g["hyperparameters"]["batch_size"], 8);
  EXPECT_TRUE(g["validation_file"].is_null());
}

TEST_F(OpenAiJobsTest, EventsCheckpointsAndErrorsInOpenAisShapes) {
  v1::JobEvent e;
  e.set_cursor(12);
  e.mutable_time()->set_seconds(1700000005);
  e.mutable_progress()->set_step(3);
  e.mutable_progress()->set_max_steps(10);
  e.mutable_progress()->set_loss(2.5);
  json j = EventJson(e);
  EXPECT_EQ(j["id"], "ftevent-12");
  EXPECT_EQ(j["object"], "fine_tuning.job.event");
  EXPECT_EQ(j["type"], "metrics");
  EXPECT_EQ(j["data"]["step"], 3);
  EXPECT_EQ(j["data"]["total_steps"], 10);
  EXPECT_EQ(j["data"]["train_loss"], 2.5);
  EXPECT_EQ(j["created_at"], 1700000005);

  e.mutable_log()->set_level(v1::LOG_LEVEL_WARNING);
  e.mutable_log()->set_message("careful");
  j = EventJson(e);
  EXPECT_EQ(j["level"], "warn");
  EXPECT_EQ(j["message"], "careful");
  e.mutable_state_change()->set_state(v1::JOB_STATE_FAILED);
  e.mutable_state_change()->set_reason("out of memory");
  j = EventJson(e);
  EXPECT_EQ(j["level"], "error");
  EXPECT_EQ(j["message"], "Job failed: out of memory");

  v1::Checkpoint c;
  c.set_id("checkpoint-4");
  c.set_job_id("job-1");
  c.set_step(4);
  c.set_path("/out/checkpoint-4");
  c.set_loss(1.5);
  j = CheckpointJson(c);
  EXPECT_EQ(j["object"], "fine_tuning.job.checkpoint");
  EXPECT_EQ(j["fine_tuned_model_checkpoint"], "/out/checkpoint-4");
  EXPECT_EQ(j["step_number"], 4);
  EXPECT_EQ(j["metrics"]["train_loss"], 1.5);

  const json err =
      json::parse(ErrorBody(FromStatus(NotFoundError("no such job"), "fine_tuning_job_id")));
  EXPECT_EQ(err["error"]["message"], "no such job");
  EXPECT_EQ(err["error"]["param"], "fine_tuning_job_id");
  EXPECT_TRUE(err["error"]["code"].is_null());
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");
  EXPECT_EQ(FromStatus(NotFoundError("")).status, 404);
  EXPECT_EQ(FromStatus(ResourceExhaustedError("")).status, 429);
  EXPECT_EQ(FromStatus(PermissionDeniedError("")).status, 403);
  EXPECT_EQ(FromStatus(InternalError("")).status, 500);
  // Invalid UTF-8 in a message (it may echo a file name) still makes valid JSON.
  EXPECT_NO_THROW(json::parse(ErrorBody(ApiError(400, "bad \xff name"))));
}

}  // namespace
}  // namespace offloadd::daemon::openai
