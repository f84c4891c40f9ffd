#include "trainer/pipeline/host_gather.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace offloadd::trainer {
namespace {

// The host optimizer as the gather thread sees it: per block the step its slice is updated to,
// set by the test (in any order), and the gathers run.
class FakeHost {
 public:
  explicit FakeHost(int n) : updated_(static_cast<size_t>(n), 0) {}
  void Update(int b, uint64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    updated_[static_cast<size_t>(b)] = step;
    cv_.notify_all();
  }
  void Fail(Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = st;
    cv_.notify_all();
  }
  HostGather::Hooks Hooks(const std::vector<uint64_t>* skipped = nullptr) {
    HostGather::Hooks h;
    h.wait_updated = [this](int b, uint64_t step) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return updated_[static_cast<size_t>(b)] >= step || !error_.ok(); });
      return updated_[static_cast<size_t>(b)] >= step ? OkStatus() : error_;
    };
    h.gather = [this](int b) {
      std::lock_guard<std::mutex> lock(mu_);
      gathers_.push_back(b);
      return OkStatus();
    };
    if (skipped) {
      h.skipped = [skipped](uint64_t step) -> StatusOr<bool> {
        for (uint64_t s : *skipped) {
          if (s == step) return true;
        }
        return false;
      };
    }
    return h;
  }
  std::vector<int> gathers() {
    std::lock_guard<std::mutex> lock(mu_);
    return gathers_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> updated_;
  std::vector<int> gathers_;
  Status error_;
};

TEST(HostGatherTest, EachBlockIsGatheredOnceItsOwnUpdateIsDone) {
  constexpr int n = 4;
  FakeHost host(n);
  HostGather g(n, host.Hooks());
  ASSERT_TRUE(g.Submit(1).ok());
  // Block 0's update is done, the others' are not: block 0 is gathered (and the next forward of
  // block 0 may run) without waiting for the rest of the step.
  host.Update(0, 1);
  ASSERT_TRUE(g.WaitGathered(0, 1).ok());
  EXPECT_EQ(host.gathers(), std::vector<int>({0}));
  // The others finish in another order (as held updates on several workers may): the gathers
  // still run in block order, as on every other rank.
  for (int b = n - 1; b >= 1; --b) host.Update(b, 1);
  ASSERT_TRUE(g.WaitAll(1).ok());
  EXPECT_EQ(host.gathers(), std::vector<int>({0, 1, 2, 3}));
  EXPECT_EQ(g.gathered_order(), std::vector<int>({0, 1, 2, 3}));
  EXPECT_TRUE(g.WaitGathered(2, 0).ok());  // step 0: nothing to wait for
  EXPECT_FALSE(g.WaitGathered(n, 1).ok());
}

TEST(HostGatherTest, ABlockOfTheNextStepWaitsForItsGatherNotTheUpdate) {
  constexpr int n = 3;
  FakeHost host(n);
  HostGather g(n, host.Hooks());
  for (int b = 0; b < n; ++b) host.Update(b, 1);
  ASSERT_TRUE(g.Submit(1).ok());
  ASSERT_TRUE(g.WaitAll(1).ok());
  // Step 2's updates of blocks 0 and 1 are done before step 2 is submitted: nothing is gathered
  // for step 2 until it is (the gathers follow the step loop's submissions).
  host.Update(0, 2);
  host.Update(1, 2);
  ASSERT_TRUE(g.Submit(2).ok());
  ASSERT_TRUE(g.WaitGathered(1, 2).ok());
  host.Update(2, 2);
  ASSERT_TRUE(g.WaitAll(2).ok());
  EXPECT_EQ(host.gathers(), std::vector<int>({0, 1, 2, 0, 1, 2}));
}

TEST(HostGatherTest, ASkippedStepGathersNothing) {
  constexpr int n = 3;
  FakeHost host(n);
  const std::vector<uint64_t> skipped{2};
  HostGather g(n, host.Hooks(&skipped));
  for (int b = 0; b < n; ++b) host.Update(b, 1);
  ASSERT_TRUE(g.Submit(1).ok());
  ASSERT_TRUE(g.Submit(2).ok());  // skipped: no update ran, the weights are step 1's
  ASSERT_TRUE(g.WaitAll(2).ok());
  EXPECT_EQ(host.gathers(), std::vector<int>({0, 1, 2}));
}

TEST(HostGatherTest, ARestoreGathersEveryBlockAtOnceAndEarlierGathersNoLongerCount) {
  constexpr int n = 2;
  FakeHost host(n);
  HostGather g(n, host.Hooks());
  for (int b = 0; b < n; ++b) host.Update(b, 3);
  ASSERT_TRUE(g.Submit(3).ok());
  ASSERT_TRUE(g.WaitAll(3).ok());
  // Resumed at step 2 (an earlier checkpoint): no update of step 2 is waited for.
  ASSERT_TRUE(g.Submit(2, /*restored=*/true).ok());
  ASSERT_TRUE(g.WaitAll(2).ok());
  EXPECT_EQ(host.gathers(), std::vector<int>({0, 1, 0, 1}));
}

TEST(HostGatherTest, AFailedUpdateReachesEveryWaiterAndLaterSubmissions) {
  constexpr int n = 3;
  FakeHost host(n);
  HostGather g(n, host.Hooks());
  ASSERT_TRUE(g.Submit(1).ok());
  host.Update(0, 1);
  host.Fail(UnavailableError("host 1 lost"));
  EXPECT_TRUE(g.WaitGathered(0, 1).ok());
  const Status st = g.WaitGathered(2, 1);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.ToString().find("host 1 lost"), std::string::npos) << st.ToString();
  EXPECT_FALSE(g.WaitAll(1).ok());
  EXPECT_FALSE(g.Submit(2).ok());
  EXPECT_EQ(host.gathers(), std::vector<int>({0}));
}

TEST(HostGatherTest, StopFinishesTheQueuedGathers) {
  constexpr int n = 2;
  FakeHost host(n);
  auto g = std::make_unique<HostGather>(n, host.Hooks());
  ASSERT_TRUE(g->Submit(1).ok());
  for (int b = 0; b < n; ++b) host.Update(b, 1);
  g->Stop();  // the other ranks run the same collectives: a rank must not stop halfway
  EXPECT_EQ(host.gathers(), std::vector<int>({0, 1}));
  EXPECT_FALSE(g->Submit(2).ok());
}

}  // namespace
}  // namespace offloadd::trainer
