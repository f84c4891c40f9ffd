// The automatic batch size's candidates and choice (job/batch_planner.h).
#include "job/batch_planner.h"

#include <gtest/gtest.h>

namespace offloadd::trainer {
namespace {

std::vector<std::pair<int, int>> Shapes(const std::vector<BatchCandidate>& cs) {
  std::vector<std::pair<int, int>> out;
  for (const auto& c : cs) out.emplace_back(c.micro, c.accumulation);
  return out;
}

TEST(BatchCandidatesTest, PowersOfTwoUpToTheCapWithTheJobsAccumulation) {
  auto cs = BatchCandidates(24, 0, 2);
  ASSERT_TRUE(cs.ok()) << cs.status().ToString();
  EXPECT_EQ(Shapes(*cs), (std::vector<std::pair<int, int>>{{1, 2}, {2, 2}, {4, 2}, {8, 2}, {16, 2}, {24, 2}}));
  cs = BatchCandidates(1, 0, 1);
  ASSERT_TRUE(cs.ok());
  EXPECT_EQ(Shapes(*cs), (std::vector<std::pair<int, int>>{{1, 1}}));
}

TEST(BatchCandidatesTest, AGlobalBatchIsSplitIntoItsDivisors) {
  auto cs = BatchCandidates(8, 12, 1);
  ASSERT_TRUE(cs.ok()) << cs.status().ToString();
  EXPECT_EQ(Shapes(*cs), (std::vector<std::pair<int, int>>{{1, 12}, {2, 6}, {3, 4}, {4, 3}, {6, 2}}));
  cs = BatchCandidates(64, 7, 1);  // a prime: micro 1 x 7 or 7 x 1
  ASSERT_TRUE(cs.ok());
  EXPECT_EQ(Shapes(*cs), (std::vector<std::pair<int, int>>{{1, 7}, {7, 1}}));
}

TEST(BatchCandidatesTest, BadSettingsNameTheField) {
  EXPECT_NE(BatchCandidates(0, 0, 1).status().message().find("cap must be at least 1"), std::string::npos);
  EXPECT_NE(BatchCandidates(8, 0, 0).status().message().find("gradient_accumulation_steps"), std::string::npos);
  EXPECT_NE(BatchCandidates(8, -4, 1).status().message().find("train_batch_size"), std::string::npos);
}

BatchCandidate Priced(int micro, double step_s, bool feasible = true) {
  BatchCandidate c;
  c.micro = micro;
  c.accumulation = 1;
  c.feasible = feasible;
  c.why_not = feasible ? "" : "needs 30 GiB of GPU memory";
  c.plan.predicted_s = step_s;
  c.plan.bound = "GPU";
  c.tokens_per_s = CandidateTokensPerSecond(c, 1000);
  return c;
}

TEST(ChooseBatchTest, TheMostTokensPerSecondAndTheSmallerWithinTwoPercent) {
  // 1000-token rows: 1 -> 1000/s, 2 -> 2000/s, 4 -> 4000/s, 8 -> 4050/s (within 2% of 4).
  std::vector<BatchCandidate> cs = {Priced(1, 1.0), Priced(2, 1.0), Priced(4, 1.0), Priced(8, 8000.0 / 4050)};
  EXPECT_NEAR(cs[3].tokens_per_s, 4050, 1e-6);
  auto c = ChooseBatch(cs);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 2);
  cs[3] = Priced(8, 8000.0 / 4200);  // 5% faster: taken
  EXPECT_EQ(*ChooseBatch(cs), 3);
  cs[3] = Priced(8, 1.0, false);  // infeasible: never taken, and named in the description
  EXPECT_EQ(*ChooseBatch(cs), 2);
  const std::string d = DescribeBatchChoice(cs, 2, 1000);
  EXPECT_NE(d.find("micro-batch 4 x 1 accumulation (4 sequences of 1000 tokens per step): predicted 4.00k"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("8x1: does not fit (needs 30 GiB of GPU memory)"), std::string::npos) << d;
}

TEST(ChooseBatchTest, NoneFeasibleSaysWhyTheSmallestDoesNotFit) {
  auto c = ChooseBatch({Priced(1, 1.0, false), Priced(2, 1.0, false)});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("no micro-batch fits: at 1 needs 30 GiB"), std::string::npos)
      << c.status().ToString();
}

}  // namespace
}  // namespace offloadd::trainer
