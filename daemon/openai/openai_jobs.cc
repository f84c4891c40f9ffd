#include "daemon/openai/openai_jobs.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <random>
#include <set>

namespace offloadd::daemon::openai {
namespace {

using nlohmann::json;
namespace v1 = offloadd::v1;

// What the job keeps of its request (JobSpec labels), so that it is shown as it was asked for.
constexpr const char* kModelLabel = "openai.model";
constexpr const char* kTrainingFileLabel = "openai.training_file";
constexpr const char* kValidationFileLabel = "openai.validation_file";
constexpr const char* kHyperparametersLabel = "openai.hyperparameters";
constexpr const char* kSuffixLabel = "openai.suffix";

ApiError Bad(std::string param, std::string message, std::string code = "") {
  return ApiError{400, std::move(message), std::move(param), std::move(code)};
}

std::string Label(const v1::Job& job, const char* key) {
  const auto it = job.spec().labels().find(key);
  return it == job.spec().labels().end() ? "" : it->second;
}

bool Absent(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null();
}

// The hyperparameters object: each "auto" (or absent) or a number in range.
std::optional<ApiError> ReadHyperparameters(const json& h, const std::string& at, json* out) {
  if (!h.is_object()) return Bad(at, at + " must be an object");
  for (const auto& [key, value] : h.items()) {
    const std::string param = at + "." + key;
    if (key != "n_epochs" && key != "batch_size" && key != "learning_rate_multiplier") {
      return Bad(param, "unknown hyperparameter '" + key +
                            "'; offloadd takes n_epochs, batch_size and learning_rate_multiplier");
    }
    if (value.is_null() || (value.is_string() && value.get<std::string>() == "auto")) {
      (*out)[key] = "auto";
      continue;
    }
    if (key == "learning_rate_multiplier") {
      if (!value.is_number() || !(value.get<double>() > 0) || !std::isfinite(value.get<double>()) ||
          value.get<double>() > 100) {
        return Bad(param, param + " must be \"auto\" or a number in (0, 100]");
      }
    } else {
      const int64_t max = key == "n_epochs" ? 50 : 1024;
      if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > max) {
        return Bad(param,
                   param + " must be \"auto\" or an integer in [1, " + std::to_string(max) + "]");
      }
    }
    (*out)[key] = value;
  }
  return std::nullopt;
}

bool SafeName(const std::string& s, size_t max) {
  if (s.empty() || s.size() > max || s == "." || s == "..") return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return false;
  }
  return true;
}

std::string RandomHex(int n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::string s;
  for (int i = 0; i < n; ++i) s += kHex[rd() % 16];
  return s;
}

std::optional<ApiError> ResolveModel(const std::string& model, const JobRequestContext& c,
                                     std::string* path) {
  if (model.empty()) return Bad("model", "model must name a model directory", "model_not_found");
  if (model.front() == '/') {
    *path = model;  // Submit's path policy decides whether it lies under allowed_roots
    return std::nullopt;
  }
  if (c.model_dir.empty()) {
    return Bad("model",
               "model '" + model +
                   "' is not an absolute path, and server.openai_api.model_dir "
                   "is not set to look names up in",
               "model_not_found");
  }
  if (!SafeName(model, 255)) {
    return Bad("model", "model '" + model + "' is not a name of a directory in " + c.model_dir,
               "model_not_found");
  }
  *path = c.model_dir + "/" + model;
  struct stat st {};
  if (stat(path->c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Bad("model", "model '" + model + "' does not exist: no directory " + *path,
               "model_not_found");
  }
  return std::nullopt;
}

std::optional<ApiError> ResolveFile(const JobRequestContext& c, const std::string& param,
                                    const json& value, StoredFile* file) {
  if (!value.is_string()) return Bad(param, param + " must be a file id");
  auto f = c.file(value.get<std::string>());
  if (!f.ok()) return ApiError{400, f.status().message(), param, "file_not_found"};
  if (f->purpose != "fine-tune") {
    return Bad(param, param + " " + f->id + " was uploaded with purpose '" + f->purpose +
                          "', not 'fine-tune'");
  }
  *file = *f;
  return std::nullopt;
}

int64_t Seconds(const google::protobuf::Timestamp& t) { return t.seconds(); }

}  // namespace

std::string ErrorBody(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError FromStatus(const Status& s, const std::string& param) {
  ApiError e{500, s.message(), param, "", "server_error"};
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      e.status = 400;
      e.type = "invalid_request_error";
      break;
    case StatusCode::kNotFound:
      e.status = 404;
      e.type = "invalid_request_error";
      break;
    case StatusCode::kAlreadyExists:
      e.status = 409;
      e.type = "invalid_request_error";
      break;
    case StatusCode::kPermissionDenied:
      e.status = 403;
      e.type = "invalid_request_error";
      break;
    case StatusCode::kUnauthenticated:
      e.status = 401;
      e.type = "invalid_request_error";
      break;
    case StatusCode::kResourceExhausted:
      e.status = 429;
      e.type = "rate_limit_error";
      break;
    case StatusCode::kUnavailable:
      e.status = 503;
      break;
    default:
      break;
  }
  return e;
}

std::variant<v1::JobSpec, ApiError> SpecFromRequest(const std::string& text,
                                                    const JobRequestContext& c) {
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object())
    return Bad("", "the request body is not a JSON object");
  static const std::set<std::string> kKnown = {
      "model", "training_file", "validation_file", "hyperparameters", "suffix",
      "seed",  "method",        "integrations",    "metadata"};
  for (const auto& [key, value] : body.items()) {
    if (!kKnown.count(key)) return Bad(key, "unknown parameter '" + key + "'");
  }
  for (const char* unsupported : {"integrations", "metadata"}) {
    const auto it = body.find(unsupported);
    if (it != body.end() && !it->is_null() && !it->empty()) {
      return Bad(unsupported, std::string(unsupported) + " is not supported by offloadd");
    }
  }
  if (Absent(body, "model") || !body["model"].is_string())
    return Bad("model", "model is required (a string)");
  if (Absent(body, "training_file")) return Bad("training_file", "training_file is required");
  const std::string model = body["model"].get<std::string>();
  std::string model_path;
  if (auto e = ResolveModel(model, c, &model_path)) return *e;
  StoredFile training, validation;
  if (auto e = ResolveFile(c, "training_file", body["training_file"], &training)) return *e;
  const bool has_validation = !Absent(body, "validation_file");
  if (has_validation) {
    if (auto e = ResolveFile(c, "validation_file", body["validation_file"], &validation)) return *e;
  }
  json hyper = {{"n_epochs", "auto"}, {"batch_size", "auto"}, {"learning_rate_multiplier", "auto"}};
  if (!Absent(body, "hyperparameters")) {
    if (auto e = ReadHyperparameters(body["hyperparameters"], "hyperparameters", &hyper)) return *e;
  }
  if (!Absent(body, "method")) {
    const json& m = body["method"];
    if (!m.is_object()) return Bad("method", "method must be an object");
    for (const auto& [key, value] : m.items()) {
      if (key != "type" && key != "supervised" && key != "dpo" && key != "reinforcement") {
        return Bad("method." + key, "unknown parameter 'method." + key + "'");
      }
    }
    // json::value throws on a present non-string: the type is checked before it is read.
    if (m.contains("type") && !m["type"].is_null() && !m["type"].is_string())
      return Bad("method.type", "method.type must be a string");
    const std::string type =
        m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : std::string();
    if (type != "supervised") {
      return Bad("method.type", "method.type '" + type +
                                    "' is not supported; offloadd fine-tunes "
                                    "with method.type 'supervised' only");
    }
    if (m.contains("dpo") || m.contains("reinforcement")) {
      return Bad("method",
                 "method.dpo and method.reinforcement do not go with method.type 'supervised'");
    }
    if (m.contains("supervised") && !m["supervised"].is_null()) {
      const json& s = m["supervised"];
      if (!s.is_object()) return Bad("method.supervised", "method.supervised must be an object");
      for (const auto& [key, value] : s.items()) {
        if (key != "hyperparameters") {
          return Bad("method.supervised." + key,
                     "unknown parameter 'method.supervised." + key + "'");
        }
      }
      if (s.contains("hyperparameters") && !s["hyperparameters"].is_null()) {
        if (!Absent(body, "hyperparameters")) {
          return Bad("hyperparameters",
                     "give hyperparameters or method.supervised.hyperparameters, not both");
        }
        if (auto e = ReadHyperparameters(s["hyperparameters"], "method.supervised.hyperparameters",
                                         &hyper)) {
          return *e;
        }
      }
    }
  }
  std::string suffix;
  if (!Absent(body, "suffix")) {
    if (!body["suffix"].is_string() || !SafeName(body["suffix"].get<std::string>(), 64)) {
      return Bad("suffix", "suffix must be 1 to 64 of the characters A-Z a-z 0-9 - _ .");
    }
    suffix = body["suffix"].get<std::string>();
  }
  v1::JobSpec spec;
  const std::string base = model.substr(model.find_last_of('/') + 1);
  spec.set_display_name("ft:" + base + (suffix.empty() ? "" : ":" + suffix));
  spec.mutable_model()->set_path(model_path);
  v1::DatasetSpec* data = spec.mutable_dataset();
  data->add_paths(training.path);
  data->set_format(v1::DATASET_FORMAT_MESSAGES);
  if (has_validation) data->add_eval_paths(validation.path);
  v1::TrainingArguments* t = spec.mutable_training();
  if (!Absent(body, "seed")) {
    if (!body["seed"].is_number_integer() || body["seed"].get<int64_t>() < 0 ||
        body["seed"].get<int64_t>() > 2147483647) {
      return Bad("seed", "seed must be an integer in [0, 2147483647]");
    }
    t->set_seed(body["seed"].get<int64_t>());
  }
  if (hyper["n_epochs"].is_number()) t->set_num_train_epochs(hyper["n_epochs"].get<double>());
  if (hyper["batch_size"].is_number()) {
    t->set_per_device_train_batch_size(hyper["batch_size"].get<int32_t>());
    // A checkpoint at the end of every epoch, the last three kept: OpenAI's checkpoints.
    const int64_t batch = hyper["batch_size"].get<int64_t>();
    const int64_t steps_per_epoch = std::max<int64_t>(1, (training.records + batch - 1) / batch);
    t->set_save_steps(steps_per_epoch);
    if (has_validation) t->set_eval_steps(steps_per_epoch);
  } else {
    t->set_auto_find_batch_size(true);
  }
  t->set_save_total_limit(3);
  t->set_logging_steps(1);  // a metrics event every step, as OpenAI's
  const double multiplier = hyper["learning_rate_multiplier"].is_number()
                                ? hyper["learning_rate_multiplier"].get<double>()
                                : 1.0;
  t->set_learning_rate(c.base_learning_rate * multiplier);
  spec.set_output_dir(c.output_root + "/ft-" + (SafeName(base, 64) ? base : "model") +
                      (suffix.empty() ? "" : "-" + suffix) + "-" + RandomHex(8));
  auto& labels = *spec.mutable_labels();
  labels[kModelLabel] = model.substr(0, 256);
  labels[kTrainingFileLabel] = training.id;
  if (has_validation) labels[kValidationFileLabel] = validation.id;
  labels[kHyperparametersLabel] = hyper.dump();
  if (!suffix.empty()) labels[kSuffixLabel] = suffix;
  return spec;
}

std::string ParamOfField(const std::string& field) {
  static const std::pair<const char*, const char*> kParams[] = {
      {"model", "model"},
      {"tokenizer", "model"},
      {"dataset.eval_paths", "validation_file"},
      {"dataset", "training_file"},
      {"training.per_device_train_batch_size", "hyperparameters.batch_size"},
      {"training.num_train_epochs", "hyperparameters.n_epochs"},
      {"training.learning_rate", "hyperparameters.learning_rate_multiplier"},
      {"training.seed", "seed"},
  };
  for (const auto& [prefix, param] : kParams) {
    if (field.rfind(prefix, 0) == 0) return param;
  }
  return field;
}

std::string OpenAiStatus(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_VALIDATING:
      return "validating_files";
    case v1::JOB_STATE_QUEUED:
      return "queued";
    case v1::JOB_STATE_RUNNING:
    case v1::JOB_STATE_PAUSING:
      return "running";
    case v1::JOB_STATE_PAUSED:
      return "paused";
    case v1::JOB_STATE_CANCELLING:  // stops within jobs.cancel_grace_seconds
    case v1::JOB_STATE_CANCELLED:
      return "cancelled";
    case v1::JOB_STATE_SUCCEEDED:
      return "succeeded";
    case v1::JOB_STATE_FAILED:
      return "failed";
    default:
      return "queued";
  }
}

json JobJson(const v1::Job& job) {
  const v1::JobSpec& spec = job.spec();
  const v1::TrainingArguments& t = spec.training();
  json hyper = json::parse(Label(job, kHyperparametersLabel), nullptr, false);
  if (!hyper.is_object()) {  // a job created through gRPC: its settings as they are
    hyper = {{"n_epochs", t.has_num_train_epochs() ? json(t.num_train_epochs()) : json("auto")},
             {"batch_size", t.has_per_device_train_batch_size() && !t.auto_find_batch_size()
                                ? json(t.per_device_train_batch_size())
                                : json("auto")},
             {"learning_rate_multiplier", "auto"}};
  }
  const std::string model = Label(job, kModelLabel);
  const std::string training_file = Label(job, kTrainingFileLabel);
  const std::string validation_file = Label(job, kValidationFileLabel);
  const bool ended = job.state() == v1::JOB_STATE_SUCCEEDED ||
                     job.state() == v1::JOB_STATE_FAILED || job.state() == v1::JOB_STATE_CANCELLED;
  json j = {
      {"id", job.id()},
      {"object", "fine_tuning.job"},
      {"created_at", Seconds(job.create_time())},
      {"finished_at", ended && job.has_end_time() ? json(Seconds(job.end_time())) : json(nullptr)},
      {"model", model.empty() ? spec.model().path() : model},
      {"fine_tuned_model",
       job.state() == v1::JOB_STATE_SUCCEEDED ? json(spec.output_dir()) : json(nullptr)},
      {"organization_id", "offloadd"},
      {"status", OpenAiStatus(job.state())},
      {"hyperparameters", hyper},
      {"method", {{"type", "supervised"}, {"supervised", {{"hyperparameters", hyper}}}}},
      {"training_file", !training_file.empty()
                            ? training_file
                            : (spec.dataset().paths_size() > 0 ? spec.dataset().paths(0) : "")},
      {"validation_file", !validation_file.empty() ? json(validation_file)
                          : spec.dataset().eval_paths_size() > 0
                              ? json(spec.dataset().eval_paths(0))
                              : json(nullptr)},
      {"result_files", json::array()},
      {"trained_tokens",
       job.progress().tokens_seen() > 0 ? json(job.progress().tokens_seen()) : json(nullptr)},
      {"error", nullptr},
      {"seed", t.has_seed() ? t.seed() : 42},
      {"estimated_finish", nullptr},
      {"integrations", json::array()},
      {"metadata", nullptr},
      {"user_provided_suffix",
       Label(job, kSuffixLabel).empty() ? json(nullptr) : json(Label(job, kSuffixLabel))},
  };
  if (job.state() == v1::JOB_STATE_FAILED ||
      (job.state() == v1::JOB_STATE_CANCELLED && job.has_error())) {
    json err = {{"code", job.state() == v1::JOB_STATE_FAILED ? "job_failed" : "job_cancelled"},
                {"message", job.error().message()},
                {"param", nullptr}};
    if (!job.error().field_path().empty()) err["param"] = ParamOfField(job.error().field_path());
    j["error"] = err;
  }
  if (job.state() == v1::JOB_STATE_RUNNING && job.progress().has_eta()) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    j["estimated_finish"] = now + job.progress().eta().seconds();
  }
  return j;
}

json EventJson(const v1::JobEvent& e) {
  json j = {{"id", "ftevent-" + std::to_string(e.cursor())},
            {"object", "fine_tuning.job.event"},
            {"created_at", Seconds(e.time())},
            {"level", "info"},
            {"type", "message"}};
  if (e.has_state_change()) {
    const v1::StateTransition& s = e.state_change();
    const std::string status = OpenAiStatus(s.state());
    j["message"] = "Job " +
                   (s.state() == v1::JOB_STATE_VALIDATING ? std::string("created") : status) +
                   (s.reason().empty() ? "" : ": " + s.reason());
    if (s.state() == v1::JOB_STATE_FAILED) j["level"] = "error";
    j["data"] = {{"status", status}};
  } else if (e.has_progress() && e.progress().has_eval_step() &&
             e.progress().eval_step() == e.progress().step()) {
    // An evaluation's own progress event: a message beside the step's one metrics event, as
    // OpenAI lists one metrics event per step.
    const v1::JobProgress& p = e.progress();
    j["message"] =
        "Step " + std::to_string(p.step()) + ": validation loss=" + std::to_string(p.eval_loss());
    j["data"] = {{"step", p.step()}, {"valid_loss", p.eval_loss()}};
  } else if (e.has_progress()) {
    const v1::JobProgress& p = e.progress();
    j["type"] = "metrics";
    j["message"] = "Step " + std::to_string(p.step()) + "/" + std::to_string(p.max_steps()) +
                   ": training loss=" + std::to_string(p.loss());
    j["data"] = {{"step", p.step()},
                 {"total_steps", p.max_steps()},
                 {"train_loss", p.loss()},
                 {"learning_rate", p.learning_rate()},
                 {"grad_norm", p.grad_norm()},
                 {"epoch", p.epoch()},
                 {"tokens_per_second", p.tokens_per_second()}};
  } else if (e.has_log()) {
    j["message"] = e.log().message();
    if (e.log().level() == v1::LOG_LEVEL_WARNING) j["level"] = "warn";
    if (e.log().level() == v1::LOG_LEVEL_ERROR) j["level"] = "error";
  } else if (e.has_checkpoint_saved()) {
    j["message"] = "Checkpoint created at step " + std::to_string(e.checkpoint_saved().step());
    j["data"] = {{"step", e.checkpoint_saved().step()}, {"path", e.checkpoint_saved().path()}};
  } else {
    j["message"] = "";
  }
  return j;
}

json CheckpointJson(const v1::Checkpoint& c) {
  return {{"id", c.id()},
          {"object", "fine_tuning.job.checkpoint"},
          {"created_at", Seconds(c.create_time())},
          {"fine_tuned_model_checkpoint", c.path()},
          {"fine_tuning_job_id", c.job_id()},
          {"step_number", c.step()},
          {"metrics", {{"step", c.step()}, {"train_loss", c.loss()}}}};
}

}  // namespace offloadd::daemon::openai
