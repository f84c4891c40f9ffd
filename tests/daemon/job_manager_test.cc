#include "daemon/jobs/job_manager.h"

#include <unistd.h>

#include <condition_variable>
#include <map>
#include <filesystem>
#include <mutex>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "daemon/metrics/train_metrics.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
namespace fs = std::filesystem;

// A runner standing in for the training pipeline: `steps` steps, each reported as progress, each
// waiting for the test to open the gate, stopping when the job is asked to.
class GatedRunner : public JobRunner {
 public:
  explicit GatedRunner(int steps) : steps_(steps) {}

  Status Run(const v1::Job& job, JobControl& control) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ran_.push_back(job.spec().display_name());
    }
    cv_.notify_all();
    for (int s = 1; s <= steps_; ++s) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return open_; });
        while (!open_ && control.stop_requested() == JobControl::Stop::kNone) {
          cv_.wait_for(lock, std::chrono::milliseconds(20));
        }
      }
      if (control.stop_requested() != JobControl::Stop::kNone) return CancelledError("stopped on request");
      v1::JobProgress p;
      p.set_step(s);
      p.set_max_steps(steps_);
      p.set_loss(10.0 / s);
      control.ReportProgress(p);
      if (s == steps_ && fail_) return InternalError("boom at the last step");
    }
    return OkStatus();
  }

  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void FailAtEnd() { fail_ = true; }
  void WaitStarted(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ran_.size() >= n; });
  }
  std::vector<std::string> ran() {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_;
  }

 private:
  int steps_;
  bool fail_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::vector<std::string> ran_;
};

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_jobs_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    manager_.reset();
    fs::remove_all(dir_);
  }

  void StartManager(std::unique_ptr<JobRunner> runner, JobManager::StateCountsSink on_counts = {}) {
    auto store = JobStore::Open(dir_ + "/jobs.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto m = JobManager::Start(std::move(*store), std::move(runner), std::move(on_counts));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
  }

  v1::JobSpec Spec(const std::string& name, int priority = 0) {
    v1::JobSpec s;
    s.set_display_name(name);
    s.set_priority(priority);
    return s;
  }

  // Blocks until job `id` enters `state` (through Watch, no sleeps).
  void WaitForState(const std::string& id, v1::JobState state) {
    bool seen = false;
    const Status s = manager_->Watch(
        id, 0,
        [&](const v1::JobEvent& e) {
          if (e.has_state_change() && e.state_change().state() == state) seen = true;
          return !seen;
        },
        [] { return false; }, 20);
    ASSERT_TRUE(seen) << "job " << id << " never reached " << v1::JobState_Name(state) << " (" << s.ToString() << ")";
  }

  std::vector<v1::JobEvent> AllEvents(const std::string& id, int64_t after = 0) {
    std::vector<v1::JobEvent> out;
    EXPECT_TRUE(manager_->Watch(id, after, [&](const v1::JobEvent& e) { out.push_back(e); return true; },
                                [] { return false; }, 20).ok());
    return out;
  }

  std::string dir_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerTest, WithoutRunnerJobsAreRefused) {
  StartManager(nullptr);
  auto j = manager_->Create(Spec("a"));
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(j.status().message().find("the daemon has no job runner"), std::string::npos);
  EXPECT_EQ(j.status().message().find("issue #"), std::string::npos)
      << "no ticket in a user's message";
}

TEST_F(JobManagerTest, RunsToSuccessWithProgressEventsInOrder) {
  auto runner = std::make_unique<GatedRunner>(3);
  runner->Open();
  StartManager(std::move(runner));
  auto job = manager_->Create(Spec("a"));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  const auto events = AllEvents(job->id());
  std::vector<std::string> kinds;
  int64_t last_cursor = 0;
  for (const auto& e : events) {
    EXPECT_EQ(e.cursor(), last_cursor + 1);
    last_cursor = e.cursor();
    if (e.has_state_change()) kinds.push_back(v1::JobState_Name(e.state_change().state()));
    if (e.has_progress()) kinds.push_back("step" + std::to_string(e.progress().step()));
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "step1", "step2", "step3",
                                             "JOB_STATE_SUCCEEDED"}));
  auto done = manager_->Get(job->id());
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done->progress().step(), 3);
  EXPECT_TRUE(done->has_end_time());
  // A watcher resuming from a cursor gets only what came after it.
  const auto tail = AllEvents(job->id(), events[2].cursor());
  ASSERT_EQ(tail.size(), events.size() - 3);
  EXPECT_EQ(tail.front().cursor(), events[3].cursor());
}

TEST_F(JobManagerTest, FailureIsRecordedWithItsError) {
  auto runner = std::make_unique<GatedRunner>(1);
  runner->Open();
  runner->FailAtEnd();
  StartManager(std::move(runner));
  auto job = manager_->Create(Spec("a"));
  ASSERT_TRUE(job.ok());
  WaitForState(job->id(), v1::JOB_STATE_FAILED);
  auto failed = manager_->Get(job->id());
  EXPECT_EQ(failed->error().message(), "boom at the last step");
  EXPECT_EQ(failed->error().code(), static_cast<int>(StatusCode::kInternal));
}

TEST_F(JobManagerTest, CancelQueuedAndRunning) {
  auto runner = std::make_unique<GatedRunner>(5);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner));
  auto first = manager_->Create(Spec("first"));
  auto second = manager_->Create(Spec("second"));
  ASSERT_TRUE(first.ok() && second.ok());
  r->WaitStarted(1);
  auto c2 = manager_->Cancel(second->id(), "not needed");
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->state(), v1::JOB_STATE_CANCELLED);
  auto c1 = manager_->Cancel(first->id(), "");
  ASSERT_TRUE(c1.ok());
  EXPECT_EQ(c1->state(), v1::JOB_STATE_CANCELLING);
  WaitForState(first->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(r->ran(), std::vector<std::string>{"first"});
  auto again = manager_->Cancel(first->id(), "");
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

// The reason a user gives stays the job's: its last transition and its error, queued or running.
TEST_F(JobManagerTest, CancelKeepsTheReasonInTheRecordAndTheError) {
  auto runner = std::make_unique<GatedRunner>(5);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner));
  auto first = manager_->Create(Spec("first"));
  auto second = manager_->Create(Spec("second"));
  ASSERT_TRUE(first.ok() && second.ok());
  r->WaitStarted(1);
  ASSERT_TRUE(manager_->Cancel(second->id(), "wrong dataset").ok());
  ASSERT_TRUE(manager_->Cancel(first->id(), "sequence length too long").ok());
  WaitForState(first->id(), v1::JOB_STATE_CANCELLED);
  for (const auto& [id, why] : {std::pair{first->id(), std::string("sequence length too long")},
                                std::pair{second->id(), std::string("wrong dataset")}}) {
    auto job = manager_->Get(id);
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->error().message(), why);
    EXPECT_EQ(job->error().code(), static_cast<int>(StatusCode::kCancelled));
    ASSERT_FALSE(job->transitions().empty());
    EXPECT_EQ(job->transitions().rbegin()->reason(), why);
  }
}

// Delete removes an ended job's record and events; a job that has not ended is refused.
TEST_F(JobManagerTest, DeleteRemovesAnEndedJobAndRefusesARunningOne) {
  auto runner = std::make_unique<GatedRunner>(5);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner));
  auto first = manager_->Create(Spec("first"));
  auto second = manager_->Create(Spec("second"));
  ASSERT_TRUE(first.ok() && second.ok());
  r->WaitStarted(1);
  auto running = manager_->Delete(first->id());
  EXPECT_EQ(running.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(running.status().message().find("cancel it first"), std::string::npos) << running.status().ToString();
  auto queued = manager_->Delete(second->id());
  EXPECT_EQ(queued.status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(manager_->Cancel(second->id(), "not needed").ok());
  auto deleted = manager_->Delete(second->id());
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  EXPECT_EQ(deleted->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(manager_->Get(second->id()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(manager_->Delete(second->id()).status().code(), StatusCode::kNotFound);
  auto page = manager_->List({}, 10, "");
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->jobs.size(), 1u);
  EXPECT_EQ(page->jobs[0].id(), first->id());
  ASSERT_TRUE(manager_->Cancel(first->id(), "").ok());
  WaitForState(first->id(), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, PauseAndResumeRunningJob) {
  auto runner = std::make_unique<GatedRunner>(2);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner));
  auto job = manager_->Create(Spec("p"));
  ASSERT_TRUE(job.ok());
  r->WaitStarted(1);
  auto pausing = manager_->Pause(job->id());
  ASSERT_TRUE(pausing.ok());
  EXPECT_EQ(pausing->state(), v1::JOB_STATE_PAUSING);
  WaitForState(job->id(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(manager_->Resume(job->id())->state(), v1::JOB_STATE_QUEUED);
  r->Open();
  WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(r->ran(), (std::vector<std::string>{"p", "p"}));
  EXPECT_EQ(manager_->Resume(job->id()).status().code(), StatusCode::kFailedPrecondition);
}

// Issue #18 defect 9: after a clean SIGTERM the running job stayed PAUSED on restart, although
// jobs continue by themselves after a restart; one a user had paused stays paused.
TEST_F(JobManagerTest, ShutdownRequeuesTheRunningJobAndARestartRunsIt) {
  auto runner = std::make_unique<GatedRunner>(2);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner));
  auto job = manager_->Create(Spec("interrupted"));
  ASSERT_TRUE(job.ok());
  r->WaitStarted(1);
  manager_->Shutdown();
  auto stopped = manager_->Get(job->id());
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state(), v1::JOB_STATE_QUEUED);
  EXPECT_NE(stopped->transitions(stopped->transitions_size() - 1).reason().find("continues when the daemon restarts"),
            std::string::npos);
  manager_.reset();
  auto again = std::make_unique<GatedRunner>(1);
  again->Open();
  StartManager(std::move(again));
  WaitForState(job->id(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobManagerTest, AJobTheUserPausedStaysPausedAcrossShutdown) {
  auto runner = std::make_unique<GatedRunner>(2);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner));
  auto job = manager_->Create(Spec("paused"));
  ASSERT_TRUE(job.ok());
  r->WaitStarted(1);
  ASSERT_TRUE(manager_->Pause(job->id()).ok());
  manager_->Shutdown();
  EXPECT_EQ(manager_->Get(job->id())->state(), v1::JOB_STATE_PAUSED);
}

TEST_F(JobManagerTest, HigherPriorityRunsFirstThenSubmissionOrder) {
  auto runner = std::make_unique<GatedRunner>(1);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner));
  auto blocker = manager_->Create(Spec("blocker"));
  r->WaitStarted(1);
  auto low1 = manager_->Create(Spec("low1", 0));
  auto low2 = manager_->Create(Spec("low2", 0));
  auto high = manager_->Create(Spec("high", 5));
  ASSERT_TRUE(low1.ok() && low2.ok() && high.ok());
  r->Open();
  WaitForState(low2->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(r->ran(), (std::vector<std::string>{"blocker", "high", "low1", "low2"}));
}

TEST_F(JobManagerTest, RestartRequeuesInterruptedJobsAndKeepsHistory) {
  std::string id;
  {
    auto store = JobStore::Open(dir_ + "/jobs.db");
    ASSERT_TRUE(store.ok());
    v1::Job job;
    job.set_id("job-crashed");
    job.set_state(v1::JOB_STATE_RUNNING);
    ASSERT_TRUE((*store)->Insert(job).ok());
    v1::Job pausing;
    pausing.set_id("job-pausing");
    pausing.set_state(v1::JOB_STATE_PAUSING);
    ASSERT_TRUE((*store)->Insert(pausing).ok());
  }
  StartManager(nullptr);
  auto crashed = manager_->Get("job-crashed");
  ASSERT_TRUE(crashed.ok());
  EXPECT_EQ(crashed->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(crashed->transitions(0).reason(), "daemon restarted");
  EXPECT_EQ(manager_->Get("job-pausing")->state(), v1::JOB_STATE_PAUSED);
}

// Issue #29 item 8: request ids are idempotency keys of one client. Bob reusing Alice's id gets
// a job of his own (it used to be Alice's, and his was never created); each retry, also after a
// restart, returns the retrying client's own job.
TEST_F(JobManagerTest, RequestIdsArePerClientAndSurviveRestart) {
  StartManager(std::make_unique<GatedRunner>(1000));
  auto alice = manager_->Create(Spec("alice"), "nightly-1", "token:alice");
  ASSERT_TRUE(alice.ok()) << alice.status().ToString();
  auto bob = manager_->Create(Spec("bob"), "nightly-1", "token:bob");
  ASSERT_TRUE(bob.ok()) << bob.status().ToString();
  EXPECT_NE(bob->id(), alice->id()) << "Bob received Alice's job";
  EXPECT_EQ(bob->submitted_by(), "token:bob");
  EXPECT_EQ(bob->spec().display_name(), "bob");
  EXPECT_EQ(bob->request_id(), "nightly-1") << "the record keeps the id as the client gave it";
  EXPECT_EQ(manager_->Create(Spec("alice"), "nightly-1", "token:alice")->id(), alice->id());
  // A different spec under one's own id is a conflict; under another client's id it is not.
  auto conflict = manager_->Create(Spec("other"), "nightly-1", "token:alice");
  EXPECT_EQ(conflict.status().code(), StatusCode::kAlreadyExists) << conflict.status().ToString();
  manager_.reset();
  StartManager(std::make_unique<GatedRunner>(1000));
  EXPECT_EQ(manager_->Create(Spec("alice"), "nightly-1", "token:alice")->id(), alice->id());
  EXPECT_EQ(manager_->Create(Spec("bob"), "nightly-1", "token:bob")->id(), bob->id());
  auto carol = manager_->Create(Spec("carol"), "nightly-1", "unix:uid=1000");
  ASSERT_TRUE(carol.ok()) << carol.status().ToString();
  EXPECT_NE(carol->id(), alice->id());
  EXPECT_NE(carol->id(), bob->id());
}

// A key recorded before request ids were per client (no client in it) still answers its own
// submitter's retry, and nobody else's.
TEST_F(JobManagerTest, ARequestIdRecordedBeforeItWasPerClientAnswersOnlyItsSubmitter) {
  {
    auto store = JobStore::Open(dir_ + "/jobs.db");
    ASSERT_TRUE(store.ok());
    v1::Job old;
    old.set_id("job-old");
    old.set_state(v1::JOB_STATE_PAUSED);
    old.set_submitted_by("");  // Insert then recorded the plain request id
    old.set_request_id("r-1");
    ASSERT_TRUE((*store)->Insert(old).ok());
    old.set_submitted_by("token:alice");
    ASSERT_TRUE((*store)->Update(old).ok());
  }
  StartManager(std::make_unique<GatedRunner>(1000));
  auto retry = manager_->Create(v1::JobSpec(), "r-1", "token:alice");
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_EQ(retry->id(), "job-old");
  auto other = manager_->Create(v1::JobSpec(), "r-1", "token:bob");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE(other->id(), "job-old");
}

// offloadd_jobs{state} as the daemon's registry exposes it: state label -> value.
std::map<std::string, double> JobsGauge(prometheus::Registry& registry) {
  std::map<std::string, double> out;
  for (const auto& family : registry.Collect()) {
    if (family.name != "offloadd_jobs") continue;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "state") out[label.value] = metric.gauge.value;
      }
    }
  }
  return out;
}

// Every state at 0 but those given.
std::map<std::string, double> Gauge(std::map<std::string, double> nonzero) {
  std::map<std::string, double> all = {{"validating", 0}, {"queued", 0},     {"running", 0},
                                       {"pausing", 0},    {"paused", 0},     {"cancelling", 0},
                                       {"cancelled", 0},  {"succeeded", 0},  {"failed", 0}};
  for (const auto& [state, n] : nonzero) all[state] = n;
  return all;
}

TEST_F(JobManagerTest, JobsGaugeFollowsEveryTransition) {
  prometheus::Registry registry;
  TrainMetrics metrics(registry);
  auto runner = std::make_unique<GatedRunner>(2);
  GatedRunner* r = runner.get();
  StartManager(std::move(runner), [&](const JobManager::StateCounts& c) { metrics.SetJobsByState(c); });
  EXPECT_EQ(JobsGauge(registry), Gauge({})) << "every state is exported before any job exists";

  auto first = manager_->Create(Spec("first"));
  auto second = manager_->Create(Spec("second"));
  ASSERT_TRUE(first.ok() && second.ok());
  r->WaitStarted(1);
  EXPECT_EQ(JobsGauge(registry), Gauge({{"running", 1}, {"queued", 1}}));
  ASSERT_TRUE(manager_->Pause(second->id()).ok());
  EXPECT_EQ(JobsGauge(registry), Gauge({{"running", 1}, {"paused", 1}}));
  ASSERT_TRUE(manager_->Cancel(first->id(), "").ok());
  // The runner may finish the cancel before this reads the gauge: either count is right.
  const auto cancelling = JobsGauge(registry);
  EXPECT_TRUE(cancelling == Gauge({{"cancelling", 1}, {"paused", 1}}) ||
              cancelling == Gauge({{"cancelled", 1}, {"paused", 1}}));
  WaitForState(first->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(JobsGauge(registry), Gauge({{"cancelled", 1}, {"paused", 1}}));
  ASSERT_TRUE(manager_->Resume(second->id()).ok());
  r->Open();
  WaitForState(second->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(JobsGauge(registry), Gauge({{"cancelled", 1}, {"succeeded", 1}}));
}

TEST_F(JobManagerTest, JobsGaugeAfterRestartCountsTheStoredJobs) {
  {
    auto store = JobStore::Open(dir_ + "/jobs.db");
    ASSERT_TRUE(store.ok());
    const std::pair<const char*, v1::JobState> jobs[] = {
        {"running", v1::JOB_STATE_RUNNING},       {"pausing", v1::JOB_STATE_PAUSING},
        {"cancelling", v1::JOB_STATE_CANCELLING}, {"validating", v1::JOB_STATE_VALIDATING},
        {"done1", v1::JOB_STATE_SUCCEEDED},       {"done2", v1::JOB_STATE_SUCCEEDED},
        {"queued", v1::JOB_STATE_QUEUED}};
    for (const auto& [id, state] : jobs) {
      v1::Job job;
      job.set_id(id);
      job.set_state(state);
      ASSERT_TRUE((*store)->Insert(job).ok());
    }
  }
  prometheus::Registry registry;
  TrainMetrics metrics(registry);
  StartManager(nullptr, [&](const JobManager::StateCounts& c) { metrics.SetJobsByState(c); });
  // Interrupted jobs are counted in the states recovery moved them to.
  EXPECT_EQ(JobsGauge(registry),
            Gauge({{"queued", 2}, {"paused", 1}, {"cancelled", 1}, {"failed", 1}, {"succeeded", 2}}));
}

TEST_F(JobManagerTest, ListPagesAndFilters) {
  StartManager(nullptr);
  auto store = JobStore::Open(dir_ + "/jobs2.db");
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 7; ++i) {
    v1::Job j;
    j.set_id("j" + std::to_string(i));
    j.set_state(i % 2 ? v1::JOB_STATE_SUCCEEDED : v1::JOB_STATE_FAILED);
    ASSERT_TRUE((*store)->Insert(j).ok());
  }
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto page = (*store)->List({}, 3, token);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    for (const auto& j : page->jobs) seen.push_back(j.id());
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"j0", "j1", "j2", "j3", "j4", "j5", "j6"}));
  auto ok_only = (*store)->List({v1::JOB_STATE_SUCCEEDED}, 50, "");
  ASSERT_TRUE(ok_only.ok());
  EXPECT_EQ(ok_only->jobs.size(), 3u);
  EXPECT_EQ((*store)->List({}, 3, "garbage").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->Get("nope").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace offloadd::daemon
