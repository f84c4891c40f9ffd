// JobManager's scheduler on nodes with several GPUs: jobs hold the GPUs they need
// (resources.gpus), run side by side while GPUs are free, wait in strict FIFO order when they do
// not fit, and a node without GPUs runs one job at a time. A fake runner stands in for the
// executors.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <stdlib.h>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/jobs/job_manager.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

// Records the GPUs each job got and holds it running until the test releases it (or it is asked
// to stop).
class HoldingRunner : public JobRunner {
 public:
  Status Run(const v1::Job& job, JobControl& control) override {
    const std::string name = job.spec().display_name();
    std::unique_lock<std::mutex> lock(mu_);
    started_[name] = control.gpus();
    order_.push_back(name);
    ++running_;
    max_running_ = std::max(max_running_, running_);
    cv_.notify_all();
    while (released_.count(name) == 0 && control.stop_requested() == JobControl::Stop::kNone) {
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    --running_;
    if (released_.count(name) == 0) return CancelledError("stopped");
    return OkStatus();
  }
  void Release(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    released_.insert(name);
    cv_.notify_all();
  }
  std::vector<int> WaitStarted(const std::string& name) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(20), [&] { return started_.count(name) > 0; }))
        << name << " never started";
    return started_[name];
  }
  bool Started(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    return started_.count(name) > 0;
  }
  std::vector<std::string> order() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }
  int max_running() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_running_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<int>> started_;
  std::vector<std::string> order_;
  std::set<std::string> released_;
  int running_ = 0, max_running_ = 0;
};

class JobSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_sched_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    manager_.reset();
    std::filesystem::remove_all(dir_);
  }
  HoldingRunner* Start(int gpus) {
    auto runner = std::make_unique<HoldingRunner>();
    HoldingRunner* r = runner.get();
    auto store = JobStore::Open(dir_ + "/jobs.db");
    EXPECT_TRUE(store.ok());
    JobManager::Options options;
    options.gpus = gpus;
    auto m = JobManager::Start(std::move(*store), std::move(runner), {}, options);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
    return r;
  }
  std::string Create(const std::string& name, uint32_t gpus = 0, int gpu_index = -2) {
    v1::JobSpec s;
    s.set_display_name(name);
    s.mutable_resources()->set_gpus(gpus);
    if (gpu_index > -2) s.mutable_resources()->set_gpu_index(gpu_index);
    auto job = manager_->Create(s);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job->id();
  }
  // Blocks until job `id` is in `state` (through Watch, no sleeps).
  void WaitForState(const std::string& id, v1::JobState state) {
    bool seen = false;
    (void)manager_->Watch(
        id, 0,
        [&](const v1::JobEvent& e) {
          if (e.has_state_change() && e.state_change().state() == state) seen = true;
          return !seen;
        },
        [] { return false; }, 20);
    ASSERT_TRUE(seen) << id << " never reached " << v1::JobState_Name(state);
  }
  std::string dir_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobSchedulerTest, TwoOneGpuJobsRunAtOnceOnTwoGpus) {
  HoldingRunner* r = Start(2);
  const std::string a = Create("a"), b = Create("b");
  EXPECT_EQ(r->WaitStarted("a"), std::vector<int>{0});
  EXPECT_EQ(r->WaitStarted("b"), std::vector<int>{1});
  EXPECT_EQ(r->max_running(), 2);
  const auto on = manager_->GpuAssignments();
  EXPECT_EQ(on, (std::map<int, std::string>{{0, a}, {1, b}}));
  auto job = manager_->Get(b);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->transitions(job->transitions_size() - 1).reason(), "started on GPU 1");
  r->Release("a");
  r->Release("b");
  WaitForState(a, v1::JOB_STATE_SUCCEEDED);
  WaitForState(b, v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobSchedulerTest, ABigJobWaitsForItsGpusAndSmallOnesDoNotOvertakeIt) {
  HoldingRunner* r = Start(2);
  const std::string small = Create("small");
  r->WaitStarted("small");
  const std::string big = Create("big", 2);
  const std::string later = Create("later", 1);
  // GPU 1 is free, but "later" waits behind "big" (FIFO: no starvation of the big job).
  auto job = manager_->Get(later);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  EXPECT_FALSE(r->Started("later"));
  r->Release("small");
  EXPECT_EQ(r->WaitStarted("big"), (std::vector<int>{0, 1}));
  EXPECT_FALSE(r->Started("later"));
  r->Release("big");
  EXPECT_EQ(r->WaitStarted("later"), std::vector<int>{0});
  r->Release("later");
  WaitForState(later, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(r->order(), (std::vector<std::string>{"small", "big", "later"}));
}

TEST_F(JobSchedulerTest, APinnedJobGetsItsGpu) {
  HoldingRunner* r = Start(2);
  Create("pinned", 1, 1);
  EXPECT_EQ(r->WaitStarted("pinned"), std::vector<int>{1});
  Create("any");
  EXPECT_EQ(r->WaitStarted("any"), std::vector<int>{0});
  r->Release("pinned");
  r->Release("any");
}

TEST_F(JobSchedulerTest, AJobNeedingMoreGpusThanTheNodeHasFails) {
  HoldingRunner* r = Start(2);
  const std::string huge = Create("huge", 3);
  const std::string next = Create("next");
  WaitForState(huge, v1::JOB_STATE_FAILED);
  auto job = manager_->Get(huge);
  EXPECT_NE(job->error().message().find("needs 3 GPUs (resources.gpus); this node has 2"), std::string::npos)
      << job->error().message();
  r->WaitStarted("next");  // the queue goes on
  r->Release("next");
}

TEST_F(JobSchedulerTest, ANodeWithoutGpusRunsOneJobAtATime) {
  HoldingRunner* r = Start(0);
  const std::string a = Create("a", 2);  // two CPU executors
  const std::string b = Create("b");
  EXPECT_EQ(r->WaitStarted("a"), std::vector<int>{});
  EXPECT_FALSE(r->Started("b"));
  EXPECT_TRUE(manager_->GpuAssignments().empty());
  r->Release("a");
  r->WaitStarted("b");
  r->Release("b");
  WaitForState(b, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(r->max_running(), 1);
}

TEST_F(JobSchedulerTest, CancelAndPauseReachTheRightJob) {
  HoldingRunner* r = Start(2);
  const std::string a = Create("a"), b = Create("b");
  r->WaitStarted("a");
  r->WaitStarted("b");
  ASSERT_TRUE(manager_->Cancel(b, "").ok());
  WaitForState(b, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(manager_->Get(a)->state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(manager_->Pause(a).ok());
  WaitForState(a, v1::JOB_STATE_PAUSED);
}

TEST_F(JobSchedulerTest, ShutdownQueuesEveryRunningJobAgain) {
  HoldingRunner* r = Start(2);
  const std::string a = Create("a"), b = Create("b");
  r->WaitStarted("a");
  r->WaitStarted("b");
  manager_->Shutdown();
  EXPECT_EQ(manager_->Get(a)->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(manager_->Get(b)->state(), v1::JOB_STATE_QUEUED);
}

}  // namespace
}  // namespace offloadd::daemon

namespace offloadd::daemon {
namespace {

// A part of a job another daemon coordinates holds its GPU like a running job: it is only
// admitted now (never queued), the scheduler's jobs do not get its GPU, and its release lets the
// queue go on. On a node without GPUs it holds the node.
TEST_F(JobSchedulerTest, AHostPartHoldsItsGpuLikeAJob) {
  HoldingRunner* r = Start(2);
  EXPECT_EQ(manager_->ReserveHostPart("job-x rank 1", 1), std::vector<int>{0});
  EXPECT_FALSE(manager_->ReserveHostPart("job-x rank 1", 1)) << "one hold per part";
  const std::string a = Create("a");
  EXPECT_EQ(r->WaitStarted("a"), std::vector<int>{1});
  EXPECT_FALSE(manager_->ReserveHostPart("job-y rank 1", 1)) << "both GPUs are busy";
  const std::string b = Create("b");
  manager_->ReleaseHostPart("job-x rank 1");
  EXPECT_EQ(r->WaitStarted("b"), std::vector<int>{0});
  r->Release("a");
  r->Release("b");
  WaitForState(b, v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobSchedulerTest, AHostPartHoldsANodeWithoutGpus) {
  HoldingRunner* r = Start(0);
  EXPECT_EQ(manager_->ReserveHostPart("job-x rank 1", 1), std::vector<int>{});
  const std::string a = Create("a");
  auto job = manager_->Get(a);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  manager_->ReleaseHostPart("job-x rank 1");
  r->WaitStarted("a");
  EXPECT_FALSE(manager_->ReserveHostPart("job-y rank 1", 1)) << "the node runs a job";
  r->Release("a");
  WaitForState(a, v1::JOB_STATE_SUCCEEDED);
}

// A job across hosts holds resources.gpus_per_host GPUs of the coordinator's host (its host 0's
// ranks); a peer's part holds as many, all or none.
TEST_F(JobSchedulerTest, AJobAcrossHostsHoldsGpusPerHostHere) {
  HoldingRunner* r = Start(3);
  v1::JobSpec s;
  s.set_display_name("across");
  s.mutable_resources()->set_hosts(2);
  s.mutable_resources()->set_gpus_per_host(2);
  auto job = manager_->Create(s);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(r->WaitStarted("across"), (std::vector<int>{0, 1}));
  EXPECT_FALSE(manager_->ReserveHostPart("job-x rank 1", 2)) << "one GPU is free, not two";
  EXPECT_EQ(manager_->ReserveHostPart("job-x rank 1", 1), std::vector<int>{2});
  r->Release("across");
  WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace offloadd::daemon
