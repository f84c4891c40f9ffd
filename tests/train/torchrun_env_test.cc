// The torchrun environment read into a rank's place in its group: torchrun's own variables
// accepted, every missing, malformed or inconsistent one refused by name, one rank per host
// across hosts partitioning the states, several per host across hosts refused as not built, and
// flags that would place the rank a second time refused.
#include "train/torchrun_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace offloadd::trainer {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup Lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

// What torchrun --nnodes=1 --nproc-per-node=2 gives its second worker.
Env Torchrun() {
  return {{"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"},
          {"RANK", "1"},
          {"WORLD_SIZE", "2"},
          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "0"},
          {"GROUP_WORLD_SIZE", "1"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
}

std::string Refusal(const Env& env) {
  auto e = ReadTorchrunEnv(Lookup(env));
  EXPECT_FALSE(e.ok());
  if (e.ok()) return "";
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
  return e.status().message();
}

TEST(TorchrunEnvTest, AbsentWhenNoneIsSet) {
  auto e = ReadTorchrunEnv(Lookup({{"PATH", "/bin"}, {"GROUP_RANK", "0"}}));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_FALSE(e->has_value());
}

TEST(TorchrunEnvTest, TorchrunsWorkerIsPlacedOnItsHostAndGpu) {
  const Env env = Torchrun();
  auto e = ReadTorchrunEnv(Lookup(env));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_TRUE(e->has_value());
  EXPECT_EQ((*e)->rank, 1);
  EXPECT_EQ((*e)->local_rank, 1);
  EXPECT_EQ((*e)->local_world_size, 2);
  EXPECT_EQ((*e)->group_world_size, 1);
  EXPECT_TRUE((*e)->agent_store);
  TrainConfig c;
  c.device = "cuda";
  ASSERT_TRUE(ApplyTorchrunEnv(**e, 0, &c).ok());
  EXPECT_EQ(c.parallel.rank, 1);
  EXPECT_EQ(c.parallel.world_size, 2);
  EXPECT_EQ(c.parallel.rendezvous, "tcp://127.0.0.1:29500");
  EXPECT_EQ(c.device, "cuda:1");  // torchrun leaves every GPU visible
}

TEST(TorchrunEnvTest, WithoutTheAgentRankZeroServesTheStore) {
  // A Slurm batch script: srun starts the ranks, the script exports the variables.
  const Env env = {{"MASTER_ADDR", "node1"},
                   {"MASTER_PORT", "29400"},
                   {"RANK", "0"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_WORLD_SIZE", "4"}};
  auto e = ReadTorchrunEnv(Lookup(env));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  TrainConfig c;
  EXPECT_FALSE((*e)->agent_store);
  ASSERT_TRUE(ApplyTorchrunEnv(**e, 0, &c).ok());
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.parallel.rendezvous, "tcp://node1:29400");
}

TEST(TorchrunEnvTest, MissingAndMalformedValuesAreNamed) {
  for (const char* required : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"}) {
    Env env = Torchrun();
    env.erase(required);
    EXPECT_NE(Refusal(env).find(std::string(required) + " is not set"), std::string::npos)
        << required;
  }
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"MASTER_PORT", "0"},      {"MASTER_PORT", "70000"},
      {"MASTER_PORT", "29500x"}, {"RANK", "-1"},
      {"WORLD_SIZE", "0"},       {"WORLD_SIZE", ""},
      {"LOCAL_WORLD_SIZE", "3"}, {"LOCAL_RANK", "a"}};
  for (const auto& [name, value] : bad) {
    Env env = Torchrun();
    env[name] = value;
    const std::string m = Refusal(env);
    EXPECT_NE(m.find(name), std::string::npos) << name << "=" << value << ": " << m;
  }
  Env empty_addr = Torchrun();
  empty_addr["MASTER_ADDR"] = "";
  EXPECT_NE(Refusal(empty_addr).find("MASTER_ADDR"), std::string::npos);
}

TEST(TorchrunEnvTest, InconsistentValuesAreNamed) {
  Env env = Torchrun();
  env["RANK"] = "2";
  EXPECT_NE(Refusal(env).find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos);
  env = Torchrun();
  env["LOCAL_RANK"] = "0";
  EXPECT_NE(Refusal(env).find("LOCAL_RANK=0 disagrees with RANK=1"), std::string::npos);
  env = Torchrun();
  env["GROUP_WORLD_SIZE"] = "2";
  EXPECT_NE(Refusal(env).find("GROUP_WORLD_SIZE=2 disagrees"), std::string::npos);
  env = {{"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"},      {"RANK", "2"},
         {"WORLD_SIZE", "4"},  {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"}};
  EXPECT_NE(Refusal(env).find("GROUP_RANK=0 disagrees with RANK=2 (expected GROUP_RANK=1"),
            std::string::npos);
  env = {{"MASTER_ADDR", "a"},
         {"MASTER_PORT", "1"},
         {"RANK", "0"},
         {"WORLD_SIZE", "6"},
         {"LOCAL_WORLD_SIZE", "4"}};
  EXPECT_NE(Refusal(env).find("LOCAL_WORLD_SIZE=4 does not divide WORLD_SIZE=6"),
            std::string::npos);
}

TEST(TorchrunEnvTest, OneRankPerHostAcrossHostsPartitionsTheStates) {
  // Without LOCAL_WORLD_SIZE (a PyTorchJob's pods) every rank is its own host.
  const Env env{{"MASTER_ADDR", "m"}, {"MASTER_PORT", "23456"}, {"RANK", "1"}, {"WORLD_SIZE", "2"}};
  auto e = ReadTorchrunEnv(Lookup(env));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->group_world_size, 2);
  EXPECT_EQ((*e)->group_rank, 1);
  TrainConfig c;
  ASSERT_TRUE(ApplyTorchrunEnv(**e, 0, &c).ok());
  EXPECT_EQ(c.parallel.world_size, 2);
  EXPECT_EQ(c.parallel.rank, 1);
  EXPECT_EQ(c.parallel.hosts, 2);
  EXPECT_EQ(c.parallel.rendezvous, "tcp://m:23456");
}

TEST(TorchrunEnvTest, SeveralRanksPerHostAcrossHostsSpanTheHosts) {
  const Env env{{"MASTER_ADDR", "m"}, {"MASTER_PORT", "23456"},  {"RANK", "5"},
                {"WORLD_SIZE", "8"},  {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}};
  auto e = ReadTorchrunEnv(Lookup(env));
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ((*e)->local_rank, 1);
  TrainConfig c;
  const Status s = ApplyTorchrunEnv(**e, 0, &c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.parallel.world_size, 8);  // 2 hosts x 4 ranks, numbered host by host
  EXPECT_EQ(c.parallel.rank, 5);
  EXPECT_EQ(c.parallel.hosts, 2);
}

TEST(TorchrunEnvTest, FlagsThatPlaceTheRankAgainAreRefused) {
  const Env env = Torchrun();
  auto e = ReadTorchrunEnv(Lookup(env));
  ASSERT_TRUE(e.ok());
  TrainConfig c;
  EXPECT_NE(ApplyTorchrunEnv(**e, 2, &c).message().find("--gpus"), std::string::npos);
  c.parallel.rendezvous = "file:///tmp/x";
  EXPECT_NE(ApplyTorchrunEnv(**e, 0, &c).message().find("--rendezvous"), std::string::npos);
  c = TrainConfig();
  c.parallel.world_size = 4;  // a job file's resources.gpus: 4
  EXPECT_NE(ApplyTorchrunEnv(**e, 0, &c).message().find("asks for 4 ranks"), std::string::npos);
  c.parallel.world_size = 2;  // the same count is fine
  EXPECT_TRUE(ApplyTorchrunEnv(**e, 0, &c).ok());
}

}  // namespace
}  // namespace offloadd::trainer
