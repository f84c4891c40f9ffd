#pragma once
// The OpenAI fine-tuning API's objects as offloadd's: a POST /v1/fine_tuning/jobs body becomes a
// JobSpec (the mapping is docs/openai_api.md's table), and a Job, its events and checkpoints
// become fine_tuning.job, fine_tuning.job.event and fine_tuning.job.checkpoint objects. Jobs
// created through gRPC are shown too (their model and training file are their paths). Stateless.

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>

#include "common/status.h"
#include "daemon/openai/file_store.h"
#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon::openai {

// An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  ApiError(int status_code, std::string text, std::string parameter = "",
           std::string error_code = "", std::string error_type = "invalid_request_error")
      : status(status_code),
        message(std::move(text)),
        param(std::move(parameter)),
        code(std::move(error_code)),
        type(std::move(error_type)) {}
  int status = 400;
  std::string message;
  std::string param;  // the request parameter at fault, "" for none
  std::string code;   // "" for none
  std::string type = "invalid_request_error";
};
std::string ErrorBody(const ApiError& e);
// A Status as an API error: the HTTP status of its code.
ApiError FromStatus(const Status& s, const std::string& param = "");

struct JobRequestContext {
  std::string model_dir;    // server.openai_api.model_dir ("" : absolute model paths only)
  std::string output_root;  // where fine-tuned models go (<data_dir>/models)
  double base_learning_rate = 5e-5;
  std::function<StatusOr<StoredFile>(const std::string& id)> file;  // an uploaded file by id
};

// The JobSpec a create request asks for; an ApiError naming the parameter when it is malformed,
// unknown, unsupported or names no model or file.
std::variant<offloadd::v1::JobSpec, ApiError> SpecFromRequest(const std::string& body,
                                                              const JobRequestContext& context);

// The request parameter a JobSpec field violation of such a job is about ("dataset.paths[0]" ->
// "training_file"); the field itself when none fits.
std::string ParamOfField(const std::string& field);

// "validating_files", "queued", "running", "succeeded", "failed", "cancelled"; "paused" too.
std::string OpenAiStatus(offloadd::v1::JobState state);

nlohmann::json JobJson(const offloadd::v1::Job& job);
// `id` is "ftevent-<cursor>".
nlohmann::json EventJson(const offloadd::v1::JobEvent& event);
nlohmann::json CheckpointJson(const offloadd::v1::Checkpoint& checkpoint);

}  // namespace offloadd::daemon::openai
