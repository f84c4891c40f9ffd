#include "executor/trainer_state_file.h"

#include <nlohmann/json.hpp>

#include "common/safe_path.h"
#include "job/executor_protocol.h"

namespace offloadd::executor {

namespace v1 = offloadd::v1;
using nlohmann::ordered_json;

void LogHistory::Add(const v1::StepMetrics& row) {
  auto [it, inserted] = rows_.try_emplace(row.step(), row);
  if (!inserted) daemon::MergeStepMetrics(row, &it->second);
}

std::string TrainerStateJson(const LogHistory& history, const TrainerStateFacts& f) {
  // Keys in Hugging Face's order (sorted, as its json.dumps(sort_keys=True) writes them).
  ordered_json log = ordered_json::array();
  for (const auto& [step, m] : history.rows()) {
    if (m.has_loss()) {
      ordered_json e;
      e["epoch"] = m.epoch();
      if (m.has_grad_norm()) e["grad_norm"] = m.grad_norm();
      if (m.has_learning_rate()) e["learning_rate"] = m.learning_rate();
      e["loss"] = m.loss();
      e["step"] = step;
      log.push_back(std::move(e));
    }
    if (m.has_eval_loss()) {
      log.push_back(
          ordered_json{{"epoch", m.epoch()}, {"eval_loss", m.eval_loss()}, {"step", step}});
    }
  }
  ordered_json out;
  out["best_global_step"] = nullptr;
  out["best_metric"] = nullptr;
  out["best_model_checkpoint"] = nullptr;
  out["epoch"] = f.epoch;
  out["eval_steps"] = f.eval_steps;
  out["global_step"] = f.global_step;
  out["is_hyper_param_search"] = false;
  out["is_local_process_zero"] = true;
  out["is_world_process_zero"] = true;
  out["log_history"] = std::move(log);
  out["logging_steps"] = f.logging_steps;
  out["max_steps"] = f.max_steps;
  out["num_input_tokens_seen"] = f.num_input_tokens_seen;
  out["save_steps"] = f.save_steps;
  out["total_flos"] = 0;
  out["train_batch_size"] = f.train_batch_size;
  out["trial_name"] = nullptr;
  out["trial_params"] = nullptr;
  return out.dump(2) + "\n";
}

Status WriteTrainerState(const std::string& dir, const LogHistory& history,
                         const TrainerStateFacts& facts) {
  const std::string path = dir + "/trainer_state.json";
  return WriteFileAtomically(path, TrainerStateJson(history, facts)).WithContext("writing " + path);
}

}  // namespace offloadd::executor
