// offloadd_state.json of a checkpoint: TrainerState <-> JSON, the per-file checksums, and the
// Hugging Face trainer_state.json written beside it.
#include "trainer/state/checkpoint_state.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>

namespace offloadd::trainer::checkpoint_internal {
namespace {

constexpr char kFormat[] = "offloadd-checkpoint";
constexpr int kVersion = 1;

using json = nlohmann::json;

// JSON has no NaN or infinities; write them as Python's json module does, as strings.
json DoubleToJson(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// Typed access to a JSON object's keys with errors that name the file and the key.
class JsonFields {
 public:
  JsonFields(const json& obj, std::string origin) : obj_(obj), origin_(std::move(origin)) {}

  bool Has(const char* key) const { return obj_.find(key) != obj_.end(); }
  StatusOr<const json*> Get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return Bad(key, "is missing");
    return &*it;
  }
  StatusOr<int64_t> Int(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}))
      return Bad(key, "must be an integer");
    return v->get<int64_t>();
  }
  StatusOr<uint64_t> Uint(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_number_unsigned()) return Bad(key, "must be a non-negative integer");
    return v->get<uint64_t>();
  }
  StatusOr<double> Double(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (v->is_number()) return v->get<double>();
    if (*v == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (*v == "Infinity") return std::numeric_limits<double>::infinity();
    if (*v == "-Infinity") return -std::numeric_limits<double>::infinity();
    return Bad(key, "must be a number");
  }
  StatusOr<std::string> String(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_string()) return Bad(key, "must be a string");
    return v->get<std::string>();
  }
  StatusOr<JsonFields> Object(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_object()) return Bad(key, "must be an object");
    return JsonFields(*v, origin_ + ": \"" + key + "\"");
  }
  Status Bad(const char* key, const std::string& what) const {
    return DataLossError(origin_ + ": key \"" + key + "\" " + what);
  }
  const std::string& origin() const { return origin_; }

 private:
  const json& obj_;
  std::string origin_;
};

}  // namespace

json StateToJson(const TrainerState& s, int num_layers,
                 const std::map<std::string, uint64_t>& files) {
  json log = json::array();
  for (const LogEntry& e : s.log_history) {
    log.push_back({{"step", e.step},
                   {"epoch", DoubleToJson(e.epoch)},
                   {"loss", DoubleToJson(e.loss)},
                   {"learning_rate", DoubleToJson(e.learning_rate)},
                   {"grad_norm", DoubleToJson(e.grad_norm)}});
  }
  json out = {{"format", kFormat},
              {"version", kVersion},
              {"global_step", s.global_step},
              {"max_steps", s.max_steps},
              {"epoch", DoubleToJson(s.epoch)},
              {"num_input_tokens_seen", s.num_input_tokens_seen},
              {"seed", s.seed},
              {"rng_state", s.rng_state},
              {"data_cursor", s.data_cursor},
              {"lr_scheduler",
               {{"lr_scheduler_type", s.scheduler.lr_scheduler_type},
                {"learning_rate", DoubleToJson(s.scheduler.learning_rate)},
                {"warmup_steps", s.scheduler.warmup_steps},
                {"total_steps", s.scheduler.total_steps}}},
              {"model_fingerprint", s.model_fingerprint},
              {"log_history", std::move(log)},
              {"num_layers", num_layers},
              {"files", files}};
  if (s.grad_scaler) {
    out["grad_scaler"] = {{"scale", DoubleToJson(s.grad_scaler->scale)},
                          {"growth_tracker", s.grad_scaler->growth_tracker}};
  }
  out["optimizer"] = {{"state_dtype", s.state_dtype}, {"master_dtype", s.master_dtype}};
  if (s.auto_batch) {
    out["auto_batch_size"] = {{"per_device_train_batch_size", s.auto_batch->micro},
                              {"gradient_accumulation_steps", s.auto_batch->accumulation}};
  }
  return out;
}

json HfStateToJson(const TrainerState& s) {
  json log = json::array();
  for (const LogEntry& e : s.log_history) {
    log.push_back({{"epoch", DoubleToJson(e.epoch)},
                   {"grad_norm", DoubleToJson(e.grad_norm)},
                   {"learning_rate", DoubleToJson(e.learning_rate)},
                   {"loss", DoubleToJson(e.loss)},
                   {"step", e.step}});
  }
  return {{"best_global_step", nullptr},
          {"best_metric", nullptr},
          {"best_model_checkpoint", nullptr},
          {"epoch", DoubleToJson(s.epoch)},
          {"eval_steps", s.hf.eval_steps},
          {"global_step", s.global_step},
          {"is_hyper_param_search", false},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"log_history", std::move(log)},
          {"logging_steps", s.hf.logging_steps},
          {"max_steps", s.max_steps},
          {"num_input_tokens_seen", s.num_input_tokens_seen},
          {"num_train_epochs", DoubleToJson(s.hf.num_train_epochs)},
          {"save_steps", s.hf.save_steps},
          {"stateful_callbacks", json::object()},
          {"total_flos", DoubleToJson(s.hf.total_flos)},
          {"train_batch_size", s.hf.train_batch_size > 0 ? json(s.hf.train_batch_size) : json(nullptr)},
          {"trial_name", nullptr},
          {"trial_params", nullptr}};
}

Status StateFromJson(const json& j, const std::string& path, TrainerState* s, int* num_layers,
                     std::map<std::string, uint64_t>* files) {
  const JsonFields f(j, path);
  ASSIGN_OR_RETURN(std::string format, f.String("format"));
  ASSIGN_OR_RETURN(int64_t version, f.Int("version"));
  if (format != kFormat || version != kVersion) {
    return FailedPreconditionError(f.origin() + ": format \"" + format + "\" version " +
                                   std::to_string(version) + ", this build reads \"" + kFormat +
                                   "\" version " + std::to_string(kVersion));
  }
  ASSIGN_OR_RETURN(s->global_step, f.Int("global_step"));
  ASSIGN_OR_RETURN(s->max_steps, f.Int("max_steps"));
  ASSIGN_OR_RETURN(s->epoch, f.Double("epoch"));
  ASSIGN_OR_RETURN(s->num_input_tokens_seen, f.Int("num_input_tokens_seen"));
  ASSIGN_OR_RETURN(s->seed, f.Uint("seed"));
  ASSIGN_OR_RETURN(s->rng_state, f.String("rng_state"));
  ASSIGN_OR_RETURN(s->data_cursor, f.String("data_cursor"));
  ASSIGN_OR_RETURN(JsonFields sched, f.Object("lr_scheduler"));
  ASSIGN_OR_RETURN(s->scheduler.lr_scheduler_type, sched.String("lr_scheduler_type"));
  ASSIGN_OR_RETURN(s->scheduler.learning_rate, sched.Double("learning_rate"));
  ASSIGN_OR_RETURN(s->scheduler.warmup_steps, sched.Int("warmup_steps"));
  ASSIGN_OR_RETURN(s->scheduler.total_steps, sched.Int("total_steps"));
  ASSIGN_OR_RETURN(s->model_fingerprint, f.String("model_fingerprint"));
  ASSIGN_OR_RETURN(const json* log, f.Get("log_history"));
  if (!log->is_array()) return f.Bad("log_history", "must be an array");
  for (size_t i = 0; i < log->size(); ++i) {
    const json& e = (*log)[i];
    const std::string origin = f.origin() + ": log_history[" + std::to_string(i) + "]";
    if (!e.is_object()) return DataLossError(origin + " must be an object");
    JsonFields ef(e, origin);
    LogEntry entry;
    ASSIGN_OR_RETURN(entry.step, ef.Int("step"));
    ASSIGN_OR_RETURN(entry.epoch, ef.Double("epoch"));
    ASSIGN_OR_RETURN(entry.loss, ef.Double("loss"));
    ASSIGN_OR_RETURN(entry.learning_rate, ef.Double("learning_rate"));
    ASSIGN_OR_RETURN(entry.grad_norm, ef.Double("grad_norm"));
    s->log_history.push_back(entry);
  }
  if (f.Has("grad_scaler")) {
    ASSIGN_OR_RETURN(JsonFields gs, f.Object("grad_scaler"));
    GradScalerState st;
    ASSIGN_OR_RETURN(double scale, gs.Double("scale"));
    st.scale = static_cast<float>(scale);
    ASSIGN_OR_RETURN(st.growth_tracker, gs.Int("growth_tracker"));
    s->grad_scaler = st;
  }
  if (f.Has("auto_batch_size")) {
    ASSIGN_OR_RETURN(JsonFields ab, f.Object("auto_batch_size"));
    TrainerState::BatchShape shape;
    ASSIGN_OR_RETURN(shape.micro, ab.Int("per_device_train_batch_size"));
    ASSIGN_OR_RETURN(shape.accumulation, ab.Int("gradient_accumulation_steps"));
    if (shape.micro < 1 || shape.micro > 1'000'000 || shape.accumulation < 1 || shape.accumulation > 1'000'000) {
      return f.Bad("auto_batch_size", "holds a batch shape out of range");
    }
    s->auto_batch = shape;
  }
  if (f.Has("optimizer")) {  // absent before optimizer modes existed: exact
    ASSIGN_OR_RETURN(JsonFields om, f.Object("optimizer"));
    ASSIGN_OR_RETURN(s->state_dtype, om.String("state_dtype"));
    ASSIGN_OR_RETURN(s->master_dtype, om.String("master_dtype"));
    const bool state_ok =
        s->state_dtype == "fp32" || s->state_dtype == "bf16" || s->state_dtype == "int8";
    const bool master_ok = s->master_dtype == "fp32" || s->master_dtype == "bf16";
    if (!state_ok || !master_ok) {
      return f.Bad("optimizer", "names an unknown optimizer mode (state_dtype \"" + s->state_dtype +
                                    "\", master_dtype \"" + s->master_dtype + "\")");
    }
  }
  ASSIGN_OR_RETURN(int64_t layers, f.Int("num_layers"));
  if (layers < 1 || layers > 1'000'000) return f.Bad("num_layers", "is out of range");
  *num_layers = static_cast<int>(layers);
  ASSIGN_OR_RETURN(JsonFields files_obj, f.Object("files"));
  ASSIGN_OR_RETURN(const json* fj, f.Get("files"));
  for (auto it = fj->begin(); it != fj->end(); ++it) {
    const std::string& name = it.key();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return f.Bad("files", "names a file outside the checkpoint: \"" + name + "\"");
    ASSIGN_OR_RETURN((*files)[name], files_obj.Uint(name.c_str()));
  }
  return OkStatus();
}

// trainer_state.json's "crc32c": {file: "8 hex digits"}, which must cover exactly "files". Absent
// in checkpoints written before checksums existed: `crcs` stays empty then.
Status ChecksumsFromJson(const json& j, const std::string& path,
                         const std::map<std::string, uint64_t>& files,
                         std::map<std::string, uint32_t>* crcs) {
  auto it = j.find("crc32c");
  if (it == j.end()) return OkStatus();
  if (!it->is_object()) return DataLossError(path + ": key \"crc32c\" must be an object");
  for (auto e = it->begin(); e != it->end(); ++e) {
    const std::string text = e->is_string() ? e->get<std::string>() : "";
    char* end = nullptr;
    const unsigned long v = std::strtoul(text.c_str(), &end, 16);
    if (text.size() != 8 || *end != '\0' || !files.count(e.key())) {
      return DataLossError(path + ": \"crc32c\" entry \"" + e.key() +
                           "\" is not 8 hex digits for a file listed in \"files\"");
    }
    (*crcs)[e.key()] = static_cast<uint32_t>(v);
  }
  for (const auto& [name, bytes] : files) {
    if (!crcs->count(name)) return DataLossError(path + ": \"crc32c\" does not list " + name);
  }
  return OkStatus();
}

}  // namespace offloadd::trainer::checkpoint_internal
