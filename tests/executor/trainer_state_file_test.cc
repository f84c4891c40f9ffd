#include "executor/trainer_state_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace offloadd::executor {
namespace {

namespace v1 = offloadd::v1;
using nlohmann::json;

v1::StepMetrics Train(int64_t step, double loss) {
  v1::StepMetrics m;
  m.set_step(step);
  m.set_epoch(0.5 * static_cast<double>(step));
  m.set_loss(loss);
  m.set_learning_rate(1e-4 * static_cast<double>(step));
  m.set_grad_norm(0.25);
  m.set_tokens_per_second(1000);
  return m;
}

v1::StepMetrics Eval(int64_t step, double loss) {
  v1::StepMetrics m;
  m.set_step(step);
  m.set_eval_loss(loss);
  return m;
}

TEST(TrainerStateFileTest, LogHistoryHasEveryStepAndEachEvaluationAfterItsStep) {
  LogHistory h;
  h.Add(Eval(0, 4.0));  // before training
  h.Add(Train(1, 3.5));
  h.Add(Train(2, 3.25));
  h.Add(Eval(2, 3.0));
  TrainerStateFacts f;
  f.global_step = 2;
  f.max_steps = 2;
  f.epoch = 1.0;
  f.logging_steps = 1;
  f.eval_steps = 2;
  const json j = json::parse(TrainerStateJson(h, f));
  EXPECT_EQ(j["global_step"], 2);
  EXPECT_EQ(j["max_steps"], 2);
  const json want = json::parse(R"([
    {"epoch": 0.0, "eval_loss": 4.0, "step": 0},
    {"epoch": 0.5, "grad_norm": 0.25, "learning_rate": 0.0001, "loss": 3.5, "step": 1},
    {"epoch": 1.0, "grad_norm": 0.25, "learning_rate": 0.0002, "loss": 3.25, "step": 2},
    {"epoch": 1.0, "eval_loss": 3.0, "step": 2}])");
  EXPECT_EQ(j["log_history"], want) << j["log_history"].dump();
}

// A step replayed after a resume keeps the values first recorded (the daemon's rows come first).
TEST(TrainerStateFileTest, AReplayedStepKeepsItsFirstValues) {
  LogHistory h;
  h.Add(Train(3, 2.0));
  h.Add(Train(3, 9.0));
  h.Add(Eval(3, 1.5));
  ASSERT_EQ(h.rows().size(), 1u);
  EXPECT_EQ(h.rows().at(3).loss(), 2.0);
  EXPECT_EQ(h.rows().at(3).eval_loss(), 1.5);
}

TEST(TrainerStateFileTest, WritesTheFileIntoTheDirectory) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("offloadd-trainer-state-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  LogHistory h;
  h.Add(Train(1, 1.0));
  ASSERT_TRUE(WriteTrainerState(dir.string(), h, TrainerStateFacts{}).ok());
  std::ifstream in(dir / "trainer_state.json");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(json::parse(text.str())["log_history"][0]["loss"], 1.0);
  const Status missing = WriteTrainerState((dir / "no" / "such").string(), h, TrainerStateFacts{});
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("trainer_state.json"), std::string::npos) << missing.message();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace offloadd::executor
