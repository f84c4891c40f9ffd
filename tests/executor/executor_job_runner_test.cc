// ExecutorJobRunner against a fake executor that speaks the real protocol (fake_executor_main.cc):
// events are relayed, an executor that dies restarts the job up to max_restarts and then fails it
// with the cause, a training error fails it at once, stop requests reach the executors, and the
// others of a data-parallel group are stopped when one fails.
#include "daemon/jobs/executor_job_runner.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/event_fd.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

class FakeControl : public JobControl {
 public:
  FakeControl() {
    auto fd = ipc::MakeEventFd();
    EXPECT_TRUE(fd.ok());
    fd_ = std::move(*fd);
  }
  void ReportProgress(const v1::JobProgress& p) override {
    std::lock_guard<std::mutex> lock(mu_);
    steps.push_back(p.step());
  }
  void Log(v1::LogLevel, const std::string& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    logs.push_back(message);
  }
  void CheckpointSaved(const v1::Checkpoint& c) override {
    std::lock_guard<std::mutex> lock(mu_);
    checkpoints.push_back(c.step());
  }
  Stop stop_requested() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }
  int stop_fd() const override { return fd_.get(); }
  bool force_stop() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return force_;
  }
  std::vector<int> gpus() const override { return gpus_; }
  void RecordMetrics(const v1::StepMetrics& row) override {
    std::lock_guard<std::mutex> lock(mu_);
    rows.push_back(row);
  }
  StatusOr<std::vector<v1::StepMetrics>> RecordedMetrics() override { return history; }

  void RequestStop(Stop s, bool force = false) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = s;
      force_ = force_ || force;
    }
    ipc::SignalEventFd(fd_.get());
  }
  std::vector<std::string> Logs() {
    std::lock_guard<std::mutex> lock(mu_);
    return logs;
  }
  int CountLogs(const std::string& part) {
    int n = 0;
    for (const auto& l : Logs()) n += l.find(part) != std::string::npos;
    return n;
  }

  std::vector<int64_t> steps, checkpoints;
  std::vector<std::string> logs;
  std::vector<v1::StepMetrics> rows;     // recorded by the runner
  std::vector<v1::StepMetrics> history;  // handed to rank 0's StartJob
  std::vector<int> gpus_;

 private:
  mutable std::mutex mu_;
  Stop stop_ = Stop::kNone;
  bool force_ = false;
  ipc::UniqueFd fd_;
};

class ExecutorJobRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_runner_XXXXXX";
    state_ = mkdtemp(tmpl);
  }
  void TearDown() override { [[maybe_unused]] int rc = std::system(("rm -rf " + state_).c_str()); }

  Status Run(const std::string& mode, FakeControl& control, uint32_t max_restarts = 2, uint32_t gpus = 0,
             const std::function<void(ExecutorRunnerOptions&)>& tune = {}) {
    ExecutorRunnerOptions o;
    o.executor_binary = OFFLOADD_FAKE_EXECUTOR;
    o.state_dir = state_;
    o.max_restarts = max_restarts;
    o.kill_grace_seconds = 0.5;
    if (tune) tune(o);
    ExecutorJobRunner runner(o, nullptr);
    v1::Job job;
    job.set_id("job-1");
    job.mutable_spec()->set_display_name(mode);
    job.mutable_spec()->mutable_resources()->set_gpus(gpus);
    return runner.Run(job, control);
  }
  std::string state_;
};

TEST_F(ExecutorJobRunnerTest, RelaysRankZerosEventsAndItsResult) {
  FakeControl c;
  const Status s = Run("ok", c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.steps, std::vector<int64_t>{2});
  EXPECT_EQ(c.checkpoints, std::vector<int64_t>{2});
  ASSERT_EQ(c.CountLogs("executor started: pid "), 1);
  EXPECT_EQ(c.CountLogs(" rank 0 gpu cpu"), 1);
  EXPECT_EQ(c.CountLogs("rank 0 restart 0 gpu -1 world 1 rendezvous"), 1);
}

// Every step and evaluation rank 0 reports becomes a row of the job's metrics history (tokens per
// second as its progress has them), and rank 0 starts with the rows recorded before.
TEST_F(ExecutorJobRunnerTest, RecordsEveryStepAndEvaluationAndHandsTheHistoryToRankZero) {
  FakeControl c;
  c.history.resize(2);
  c.history[0].set_step(0);
  c.history[0].set_eval_loss(3.0);
  c.history[1].set_step(1);
  c.history[1].set_loss(2.0);
  const Status s = Run("ok", c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(c.rows.size(), 2u);
  EXPECT_EQ(c.rows[0].step(), 2);
  EXPECT_EQ(c.rows[0].loss(), 1.5);
  EXPECT_EQ(c.rows[0].tokens_per_second(), 200.0);
  EXPECT_FALSE(c.rows[0].has_eval_loss());
  EXPECT_FALSE(c.rows[0].has_aux_loss());
  EXPECT_TRUE(c.rows[0].has_time());
  EXPECT_EQ(c.rows[1].step(), 2);
  EXPECT_EQ(c.rows[1].eval_loss(), 1.25);
  EXPECT_FALSE(c.rows[1].has_loss());
  EXPECT_EQ(c.CountLogs("history rows 2 first step 0"), 1) << ::testing::PrintToString(c.Logs());
}

TEST_F(ExecutorJobRunnerTest, ADeadExecutorRestartsTheJobFromItsCheckpoint) {
  FakeControl c;
  const Status s = Run("die-once", c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.CountLogs("executor started: pid "), 2);
  ASSERT_EQ(c.CountLogs("killed by signal 9 (Killed); restarting the job from its last checkpoint (restart 1 of 2)"), 1)
      << ::testing::PrintToString(c.Logs());
  EXPECT_EQ(c.CountLogs("rank 0 restart 1"), 1);
  EXPECT_EQ(c.steps, (std::vector<int64_t>{1, 3}));  // the second attempt's report
}

TEST_F(ExecutorJobRunnerTest, AfterTheLastRestartTheJobFailsWithTheCause) {
  FakeControl c;
  const Status s = Run("always-die", c, /*max_restarts=*/1);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("executor rank 0 (pid "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("killed by signal 9"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("restarted 1 time(s) (jobs.max_executor_restarts: 1)"), std::string::npos);
  EXPECT_EQ(c.CountLogs("executor started"), 2);
  FakeControl none;
  const Status at_once = Run("always-die", none, /*max_restarts=*/0);
  EXPECT_NE(at_once.message().find("killed by signal 9 (Killed) (jobs.max_executor_restarts is 0)"), std::string::npos)
      << at_once.message();
  FakeControl exit3;
  const Status code3 = Run("exit-3", exit3, 0);
  EXPECT_NE(code3.message().find("exited with code 3"), std::string::npos) << code3.message();
}

TEST_F(ExecutorJobRunnerTest, ATrainingErrorFailsTheJobWithoutARestart) {
  FakeControl c;
  const Status s = Run("fail", c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad record");
  EXPECT_EQ(c.CountLogs("executor started"), 1);
}

// A device failure reported by the executor (not its death) restarts the job like a death does.
TEST_F(ExecutorJobRunnerTest, ACudaErrorRestartsTheJobFromItsCheckpoint) {
  FakeControl c;
  const Status s = Run("cuda-error-once", c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.CountLogs("executor started: pid "), 2);
  EXPECT_EQ(c.CountLogs("CUDA error: an illegal memory access was encountered; restarting the job from its last "
                        "checkpoint (restart 1 of 2)"),
            1)
      << ::testing::PrintToString(c.Logs());
}

TEST(IsDeviceFailureTest, DeviceErrorsAreRetriedOthersAreNot) {
  EXPECT_TRUE(IsDeviceFailure(InternalError("training step: CUDA error: an illegal memory access was encountered")));
  EXPECT_TRUE(IsDeviceFailure(ResourceExhaustedError("CUDA out of memory. Tried to allocate 2.00 GiB")));
  EXPECT_TRUE(IsDeviceFailure(UnavailableError("data-parallel reduce-scatter: NCCL error: remote process exited")));
  EXPECT_FALSE(IsDeviceFailure(InvalidArgumentError("CUDA error in a record's text")));  // the job's input
  EXPECT_FALSE(IsDeviceFailure(InternalError("bad record")));
  EXPECT_FALSE(IsDeviceFailure(OkStatus()));
}

TEST_F(ExecutorJobRunnerTest, AnExecutorOfAnotherProtocolVersionIsRefusedByName) {
  FakeControl c;
  const Status s = Run("old-version", c);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("offloadd-executor speaks executor protocol version 0"), std::string::npos) << s.message();
  EXPECT_EQ(c.CountLogs("executor started"), 1);
}

TEST_F(ExecutorJobRunnerTest, StopRequestsReachTheExecutor) {
  for (auto stop : {JobControl::Stop::kPause, JobControl::Stop::kCancel}) {
    FakeControl c;
    std::thread t([&] {
      while (c.CountLogs("executor started") == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      c.RequestStop(stop);
    });
    const Status s = Run("wait-stop", c);
    t.join();
    EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  }
}

TEST_F(ExecutorJobRunnerTest, OneRankFailingStopsTheOthers) {
  FakeControl c;
  c.gpus_ = {3, 5};
  const Status s = Run("rank1-fails", c, 2, /*gpus=*/2);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "rank 1 broke");
  EXPECT_EQ(c.CountLogs(" rank 0 gpu 3"), 1);
  EXPECT_EQ(c.CountLogs(" rank 1 gpu 5"), 1);
  // The per-attempt rendezvous is gone afterwards.
  EXPECT_NE(access((state_ + "/jobs/job-1").c_str(), F_OK), -1);
  EXPECT_EQ(access((state_ + "/jobs/job-1/rendezvous-0").c_str(), F_OK), -1);
}

TEST_F(ExecutorJobRunnerTest, DataParallelRanksGetTheirPlacement) {
  FakeControl c;
  c.gpus_ = {1, 0};
  ASSERT_TRUE(Run("ok", c, 2, 2).ok());
  const std::string rdv = "rendezvous file://" + state_ + "/jobs/job-1/rendezvous-0";
  EXPECT_EQ(c.CountLogs("rank 0 restart 0 gpu 1 world 2 " + rdv), 1) << ::testing::PrintToString(c.Logs());
  EXPECT_EQ(c.CountLogs("rank 1 restart 0 gpu 0 world 2 " + rdv), 1);
  EXPECT_EQ(c.steps, std::vector<int64_t>{2});  // rank 1's progress is not relayed
}

// Liveness. A stopped executor (no heartbeat) and one whose step overruns its
// deadline are killed by the watchdog; the job restarts from its checkpoint, or fails naming the
// executor and what it was doing once the restarts are spent.
void Liveness(ExecutorRunnerOptions& o) {
  o.heartbeat_seconds = 0.1;  // silent for max(1 s, 6 heartbeats) = 1 s
  o.liveness_floor_seconds = 0.2;
  o.liveness_factor = 10;
}

TEST_F(ExecutorJobRunnerTest, AStoppedExecutorIsKilledByTheWatchdogAndTheJobRestarts) {
  FakeControl c;
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = Run("stop-once", c, 2, 0, Liveness);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_EQ(c.CountLogs("executor started: pid "), 2);
  EXPECT_EQ(c.CountLogs("killed by the liveness watchdog: no heartbeat for "), 1) << ::testing::PrintToString(c.Logs());
  EXPECT_EQ(c.CountLogs("while in 'step 3'"), 1);
  EXPECT_EQ(c.CountLogs("restarting the job from its last checkpoint (restart 1 of 2)"), 1);
}

TEST_F(ExecutorJobRunnerTest, AStepOverItsDeadlineIsKilledAndAfterTheRestartsTheJobFailsNamingIt) {
  FakeControl c;
  const Status s = Run("overrun-once", c, /*max_restarts=*/0, 0, Liveness);
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_NE(s.message().find("executor rank 0 (pid "), std::string::npos) << s.message();
  // floor + max(floor, factor x expected) = 0.2 + max(0.2, 10 x 0.1) = 1.2 s
  EXPECT_NE(s.message().find("killed by the liveness watchdog: 'step 3' ran "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("over its deadline of 1.2 s"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("(jobs.max_executor_restarts is 0)"), std::string::npos) << s.message();
  FakeControl again;
  EXPECT_TRUE(Run("overrun-once", again, 2, 0, Liveness).ok());
}

TEST_F(ExecutorJobRunnerTest, ACancelTheExecutorIgnoresEndsInSigkillAfterTheGracePeriod) {
  FakeControl c;
  std::thread t([&] {
    while (c.CountLogs("executor started") == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    c.RequestStop(JobControl::Stop::kCancel);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = Run("ignore-cancel", c, 2, 0, [](ExecutorRunnerOptions& o) { o.cancel_grace_seconds = 0.3; });
  t.join();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_NE(s.message().find("did not stop within jobs.cancel_grace_seconds (0.3 s)"), std::string::npos)
      << s.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(c.CountLogs("executor started"), 1);  // a cancelled job does not restart
}

TEST_F(ExecutorJobRunnerTest, AForcedCancelKillsAtOnce) {
  FakeControl c;
  std::thread t([&] {
    while (c.CountLogs("executor started") == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    c.RequestStop(JobControl::Stop::kCancel);
    c.RequestStop(JobControl::Stop::kCancel, /*force=*/true);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = Run("ignore-cancel", c, 2, 0, [](ExecutorRunnerOptions& o) { o.cancel_grace_seconds = 3600; });
  t.join();
  EXPECT_EQ(s.code(), StatusCode::kCancelled) << s.ToString();
  EXPECT_NE(s.message().find("killed by a forced cancel"), std::string::npos) << s.message();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(c.CountLogs("cancel --force: killing the job's executors"), 1);
}

// The job's NVMe store dying restarts the job, as an executor's death does.
TEST_F(ExecutorJobRunnerTest, ADeadStoreRestartsTheJobFromItsCheckpoint) {
  FakeControl c;
  const Status s = Run("store-died-once", c);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.CountLogs("executor started: pid "), 2);
  EXPECT_EQ(c.CountLogs("offloadd-store (pid 42) died: killed by signal 9 (Killed) (offloadd-store completion ring); "
                        "restarting the job from its last checkpoint (restart 1 of 2)"),
            1)
      << ::testing::PrintToString(c.Logs());
}

TEST(IsRestartableFailureTest, DeviceFailuresAndTheStoresDeathButNotItsIoErrors) {
  EXPECT_TRUE(IsRestartableFailure(InternalError("training step: CUDA error: an illegal memory access")));
  EXPECT_TRUE(IsRestartableFailure(UnavailableError("NVMe store: offloadd-store (pid 7) died: killed by signal 9")));
  EXPECT_TRUE(IsRestartableFailure(
      UnavailableError("offloadd-store (pid 7) killed by the liveness watchdog: no I/O completed in 120 s")));
  EXPECT_FALSE(IsRestartableFailure(InternalError("NVMe store I/O 142: No space left on device")));
  EXPECT_FALSE(IsRestartableFailure(DataLossError("NVMe store I/O 61: checksum mismatch over 38400 bytes")));
  EXPECT_FALSE(IsRestartableFailure(CancelledError("offloadd-store (pid 7) died: killed by signal 9")));
  EXPECT_FALSE(IsRestartableFailure(OkStatus()));
}

// jobs.group_timeout_seconds reaches every rank's placement (the c10d store and group timeout).
TEST_F(ExecutorJobRunnerTest, TheGroupTimeoutReachesEveryRank) {
  FakeControl c;
  c.gpus_ = {0, 1};
  ASSERT_TRUE(Run("ok", c, 2, 2, [](ExecutorRunnerOptions& o) { o.group_timeout_seconds = 45; }).ok());
  EXPECT_EQ(c.CountLogs(" timeout 45"), 2) << ::testing::PrintToString(c.Logs());
}

TEST_F(ExecutorJobRunnerTest, AMissingExecutorBinaryFailsWithItsExitCause) {
  FakeControl c;
  ExecutorRunnerOptions o;
  o.executor_binary = "/nonexistent/offloadd-executor";
  o.state_dir = state_;
  o.max_restarts = 0;
  v1::Job job;
  job.set_id("job-2");
  const Status s = ExecutorJobRunner(o, nullptr).Run(job, c);
  EXPECT_NE(s.message().find("exited with code 127 (could not be executed)"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace offloadd::daemon
