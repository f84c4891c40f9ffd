// The model card of an exported model (trainer/state/export_files.h): front matter as Hugging
// Face's Trainer writes it, and the facts of the run.
#include "trainer/state/export_files.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>

namespace offloadd::trainer {
namespace {

ModelCardFacts Facts() {
  ModelCardFacts f;
  f.model_dir = "/models/Qwen3-0.6B/";
  f.config_json = R"({"_name_or_path": "Qwen/Qwen3-0.6B", "model_type": "qwen3"})";
  f.datasets = {"/data/alpaca.jsonl", "/data/more: yes.jsonl"};
  f.eval_datasets = {"/data/held_out.jsonl"};
  f.hyperparameters = {{"learning_rate", "2e-05"}, {"train_batch_size", "8"}, {"seed", "42"}};
  f.steps = 120;
  f.tokens = 245760;
  f.final_loss = 1.23456;
  f.eval_loss = 1.5;
  return f;
}

std::string FrontMatter(const std::string& card) {
  EXPECT_EQ(card.rfind("---\n", 0), 0u) << card;
  const size_t end = card.find("\n---\n", 4);
  EXPECT_NE(end, std::string::npos) << card;
  return card.substr(4, end - 4);
}

TEST(ModelCard, FrontMatterNamesLibraryBaseModelTagsAndData) {
  const std::string card = ModelCard(Facts());
  const YAML::Node meta = YAML::Load(FrontMatter(card));
  EXPECT_EQ(meta["library_name"].as<std::string>(), "transformers");
  EXPECT_EQ(meta["base_model"].as<std::string>(), "Qwen/Qwen3-0.6B");
  ASSERT_TRUE(meta["tags"].IsSequence());
  EXPECT_EQ(meta["tags"][0].as<std::string>(), "offloadd");
  EXPECT_EQ(meta["datasets"][1].as<std::string>(), "more: yes.jsonl");  // quoted: read back as text
}

TEST(ModelCard, BodyHasHyperparametersStepsLossesAndVersion) {
  const std::string card = ModelCard(Facts());
  for (const char* want :
       {"[Qwen/Qwen3-0.6B](https://huggingface.co/Qwen/Qwen3-0.6B)", "`/data/alpaca.jsonl`",
        "- learning_rate: 2e-05\n", "- train_batch_size: 8\n", "- Steps: 120\n",
        "- Tokens trained on: 245760\n", "- Final training loss: 1.2346\n",
        "- Evaluation loss: 1.5000\n", "(`/data/held_out.jsonl`):\n- Loss: 1.5000\n"}) {
    EXPECT_NE(card.find(want), std::string::npos) << want << "\n" << card;
  }
  EXPECT_NE(card.find("- offloadd " + ModelCardFacts::OffloaddVersion() + "\n"), std::string::npos) << card;
  EXPECT_NE(ModelCardFacts::OffloaddVersion(), "unknown");
}

TEST(ModelCard, LocalBaseModelIsNamedByItsDirectoryAndMissingLossesSaySo) {
  ModelCardFacts f = Facts();
  f.config_json = R"({"_name_or_path": "/home/me/ckpt/run-3"})";  // a path, not a Hub id
  f.eval_loss.reset();
  f.final_loss.reset();
  const std::string card = ModelCard(f);
  EXPECT_EQ(YAML::Load(FrontMatter(card))["base_model"].as<std::string>(), "Qwen3-0.6B");
  EXPECT_EQ(card.find("huggingface.co"), std::string::npos) << card;
  EXPECT_EQ(card.find("Evaluation loss"), std::string::npos) << card;
  EXPECT_NE(card.find("- Final training loss: none (no step ran)"), std::string::npos) << card;
}

}  // namespace
}  // namespace offloadd::trainer
