// The job database deleted under a running daemon is recreated from
// the open one; a job record is bounded, listed in pages bounded by bytes, and a progress report
// writes its progress, not the record; a job end the store refuses shows in GetJob and in health.
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/jobs/job_manager.h"
#include "daemon/jobs/job_store.h"
#include "job/job_validator.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
namespace fs = std::filesystem;

// Bytes this process passed to write(2) and friends so far (/proc/self/io wchar); -1 if unknown.
int64_t BytesWritten() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "wchar:") return value;
  }
  return -1;
}

ino_t Inode(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A spec of about `bytes` bytes: dataset and eval paths of 4 KB each (within the per-path limits).
v1::JobSpec BigSpec(const std::string& name, size_t bytes) {
  v1::JobSpec s;
  s.set_display_name(name);
  const std::string path = "/data/" + std::string(4000, 'p');
  for (size_t i = 0; s.ByteSizeLong() + path.size() + 8 < bytes; ++i) {
    *(i % 2 ? s.mutable_dataset()->add_eval_paths() : s.mutable_dataset()->add_paths()) = path + std::to_string(i);
  }
  return s;
}

class DurabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("offloadd-durability-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    db_ = (dir_ / "jobs.db").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<JobStore> OpenStore() {
    auto store = JobStore::Open(db_);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }
  static v1::Job Job(const std::string& id, v1::JobSpec spec = {}) {
    v1::Job job;
    job.set_id(id);
    job.set_state(v1::JOB_STATE_QUEUED);
    *job.mutable_spec() = std::move(spec);
    return job;
  }
  static v1::JobEvent Log(const std::string& id, const std::string& text) {
    v1::JobEvent e;
    e.set_job_id(id);
    e.mutable_log()->set_message(text);
    return e;
  }

  fs::path dir_;
  std::string db_;
};

// Item 7: jobs went on into the unlinked file, and after a restart every job was gone.
TEST_F(DurabilityTest, ADeletedDatabaseIsRecreatedWithEveryJobAndEvent) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->Insert(Job("job-1")).ok());
  v1::JobEvent before = Log("job-1", "before the deletion");
  ASSERT_TRUE(store->AppendEvent(&before).ok());
  const ino_t first = Inode(db_);
  ASSERT_EQ(::unlink(db_.c_str()), 0);

  // The next write notices, recreates the file from the open database, and goes into the new one.
  ASSERT_TRUE(store->Insert(Job("job-2")).ok());
  EXPECT_EQ(store->recreated(), 1);
  EXPECT_EQ(store->problem(), "");
  ASSERT_TRUE(fs::exists(db_));
  EXPECT_NE(Inode(db_), first);
  v1::JobEvent after = Log("job-1", "after the deletion");
  ASSERT_TRUE(store->AppendEvent(&after).ok());
  EXPECT_EQ(after.cursor(), 2);
  EXPECT_TRUE(store->CheckFile().ok());
  EXPECT_EQ(store->recreated(), 1);  // once, not at every check

  store.reset();  // the daemon restarts
  store = OpenStore();
  ASSERT_TRUE(store);
  auto page = store->List({}, 10, "");
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->jobs.size(), 2u);
  EXPECT_EQ(page->jobs[0].id(), "job-1");
  EXPECT_EQ(page->jobs[1].id(), "job-2");
  auto events = store->Events("job-1", 0, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].log().message(), "before the deletion");
  EXPECT_EQ((*events)[1].log().message(), "after the deletion");
}

// While it cannot be recreated (here its directory is gone), the store says so, naming the file,
// keeps serving from the open database, and recreates it once it can.
TEST_F(DurabilityTest, ADatabaseThatCannotBeRecreatedIsReportedUntilItIs) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->Insert(Job("job-1")).ok());
  fs::remove_all(dir_);
  const Status s = store->CheckFile();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(store->problem().find(db_), std::string::npos) << store->problem();
  EXPECT_NE(store->problem().find("cannot be recreated"), std::string::npos) << store->problem();
  EXPECT_TRUE(store->Get("job-1").ok());  // reads go on from the open database

  fs::create_directories(dir_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!store->CheckFile().ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the store retries at its own pace
  }
  EXPECT_EQ(store->problem(), "");
  store.reset();
  store = OpenStore();
  ASSERT_TRUE(store);
  EXPECT_TRUE(store->Get("job-1").ok());
}

// Item 9: eight 2.1 MB records made one ListJobs response exceed gRPC's 4 MiB limit.
TEST_F(DurabilityTest, ListPagesEndAtABudgetOfBytes) {
  auto store = OpenStore();
  ASSERT_TRUE(store);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(store->Insert(Job("job-" + std::to_string(i), BigSpec("big", 2100000))).ok());
  }
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto page = store->List({}, 50, token);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    ASSERT_FALSE(page->jobs.empty());
    size_t bytes = 0;
    for (const auto& j : page->jobs) {
      bytes += j.ByteSizeLong();
      seen.push_back(j.id());
    }
    // At most the budget, or a single record larger than it.
    EXPECT_TRUE(bytes <= kListPageBytes || page->jobs.size() == 1) << bytes;
    EXPECT_LT(bytes, 4u << 20);
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_EQ(pages, 8);
  // Small records still come 50 to a page.
  for (int i = 0; i < 60; ++i) ASSERT_TRUE(store->Insert(Job("small-" + std::to_string(i))).ok());
  auto page = store->List({v1::JOB_STATE_QUEUED}, 50, std::to_string(8));
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs.size(), 50u);
}

// A runner reporting `steps` progress updates, then finishing.
class ReportingRunner : public JobRunner {
 public:
  explicit ReportingRunner(int steps) : steps_(steps) {}
  Status Run(const v1::Job&, JobControl& control) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      started_ = true;
      cv_.notify_all();
      while (!go_) {
        if (control.stop_requested() != JobControl::Stop::kNone) return CancelledError("stopped on request");
        cv_.wait_for(lock, std::chrono::milliseconds(20));
      }
    }
    for (int s = 1; s <= steps_; ++s) {
      // As the executor reports them: counts that grow, durations whose encoded size varies.
      v1::JobProgress p;
      p.set_step(s);
      p.set_max_steps(steps_);
      p.set_tokens_seen(int64_t{4096} * s * s);
      p.set_loss(2.0 / s);
      p.mutable_eta()->set_seconds(steps_ - s);
      p.mutable_eta()->set_nanos(s % 2 ? 5 : 500000000);
      control.ReportProgress(p);
    }
    std::lock_guard<std::mutex> lock(mu_);
    reported_ = true;
    cv_.notify_all();
    return OkStatus();
  }
  void WaitStarted() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_; });
  }
  void Go() {
    std::lock_guard<std::mutex> lock(mu_);
    go_ = true;
    cv_.notify_all();
  }
  void WaitReported() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return reported_; });
  }

 private:
  const int steps_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, go_ = false, reported_ = false;
};

// Health as the sink hears it, awaitable.
struct HealthLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> problems;
  JobManager::HealthSink Sink() {
    return [this](const std::string& p) {
      std::lock_guard<std::mutex> lock(mu);
      problems.push_back(p);
      cv.notify_all();
    };
  }
  // Waits until the latest problem satisfies `pred`.
  template <typename P>
  bool WaitFor(P pred, std::chrono::seconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return !problems.empty() && pred(problems.back()); });
  }
};

std::unique_ptr<JobManager> StartManager(const std::string& db, std::unique_ptr<JobRunner> runner) {
  auto store = JobStore::Open(db);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  auto m = JobManager::Start(std::move(*store), std::move(runner));
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// Item 9: each progress report rewrote the whole record, spec included: 59.7 MiB for 30 steps of
// a 2.1 MB record. Now it writes the progress row and its event.
TEST_F(DurabilityTest, ProgressReportsDoNotRewriteTheSpec) {
  if (BytesWritten() < 0) GTEST_SKIP() << "/proc/self/io is not readable here";
  auto runner = std::make_unique<ReportingRunner>(30);
  ReportingRunner* r = runner.get();
  auto m = StartManager(db_, std::move(runner));
  ASSERT_TRUE(m);
  const v1::JobSpec spec = BigSpec("big", kMaxJobSpecBytes - 4096);  // as big as CreateJob allows
  auto job = m->Create(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  r->WaitStarted();
  const int64_t before = BytesWritten();
  r->Go();
  r->WaitReported();
  const int64_t per_update = (BytesWritten() - before) / 30;
  RecordProperty("bytes_written_per_progress_update", static_cast<int>(per_update));
  std::printf("bytes written per progress update: %lld\n", static_cast<long long>(per_update));
  // A few SQLite pages (the progress row, the event, their WAL frames), not the 250 KB record.
  EXPECT_LT(per_update, 32 << 10) << per_update << " bytes written per progress update";
  auto got = m->Get(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->progress().step(), 30);
  EXPECT_EQ(got->spec().dataset().paths_size(), spec.dataset().paths_size());
  m.reset();
  // The progress survives a restart with the record.
  auto store = JobStore::Open(db_);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Get(job->id())->progress().step(), 30);
}

TEST_F(DurabilityTest, CreateRefusesARecordOverTheLimitNamingIt) {
  auto m = StartManager(db_, std::make_unique<ReportingRunner>(1));
  ASSERT_TRUE(m);
  auto job = m->Create(BigSpec("huge", 2100000));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find(std::to_string(kMaxJobSpecBytes)), std::string::npos)
      << job.status().message();
  // CreateJob's validation says it first, on the field "spec".
  PathPolicy paths({dir_.string()});
  const ValidationResult v = ValidateJobSpec(BigSpec("huge", 2100000), paths, NodeBudget{});
  bool named = false;
  for (const auto& f : v.violations) named |= f.field == "spec" && f.description.find("262144") != std::string::npos;
  EXPECT_TRUE(named) << "no violation on 'spec' naming the limit";
}

// Item 20: a job's end the store refuses (a full or read-only state directory, here a trigger)
// showed RUNNING in GetJob while health said SERVING.
TEST_F(DurabilityTest, AnEndTheStoreRefusesShowsInGetJobAndHealthUntilRecorded) {
  HealthLog health;  // outlives the manager, which calls it until it stops
  auto runner = std::make_unique<ReportingRunner>(2);
  ReportingRunner* r = runner.get();
  auto m = StartManager(db_, std::move(runner));
  ASSERT_TRUE(m);
  m->SetHealthSink(health.Sink());
  auto job = m->Create(v1::JobSpec());
  ASSERT_TRUE(job.ok());
  r->WaitStarted();
  sqlite3* side = nullptr;
  ASSERT_EQ(sqlite3_open(db_.c_str(), &side), SQLITE_OK);
  const auto exec = [&](const char* sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(side, sql, nullptr, nullptr, &err);
    EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
  };
  exec("CREATE TRIGGER full BEFORE UPDATE ON jobs BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END");
  r->Go();
  ASSERT_TRUE(health.WaitFor([&](const std::string& p) { return p.find(job->id()) != std::string::npos; }))
      << "health never named the job whose end is not recorded";
  EXPECT_NE(m->HealthProblem().find("SUCCEEDED"), std::string::npos) << m->HealthProblem();
  EXPECT_NE(m->HealthProblem().find("disk is full"), std::string::npos) << m->HealthProblem();
  auto shown = m->Get(job->id());
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->state(), v1::JOB_STATE_SUCCEEDED) << "GetJob shows the state the job ended in";
  auto listed = m->List({}, 10, "");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->jobs.size(), 1u);
  EXPECT_EQ(listed->jobs[0].state(), v1::JOB_STATE_SUCCEEDED);

  exec("DROP TRIGGER full");
  sqlite3_close(side);
  ASSERT_TRUE(health.WaitFor([](const std::string& p) { return p.empty(); })) << "health never SERVING again";
  m.reset();
  auto store = JobStore::Open(db_);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Get(job->id())->state(), v1::JOB_STATE_SUCCEEDED) << "the end is durable";
}

// Item 7 through the manager: health names the missing file while it cannot be recreated, and is
// SERVING again once it is.
TEST_F(DurabilityTest, HealthIsNotServingWhileTheDatabaseIsMissing) {
  HealthLog health;  // outlives the manager
  auto m = StartManager(db_, std::make_unique<ReportingRunner>(1));
  ASSERT_TRUE(m);
  m->SetHealthSink(health.Sink());
  fs::remove_all(dir_);
  (void)m->Create(v1::JobSpec());  // a write notices at once (the scheduler would within 5 s)
  ASSERT_TRUE(health.WaitFor([&](const std::string& p) { return p.find(db_) != std::string::npos; }));
  fs::create_directories(dir_);
  ASSERT_TRUE(health.WaitFor([](const std::string& p) { return p.empty(); }, std::chrono::seconds(30)));
  EXPECT_TRUE(fs::exists(db_));
}

// The record keeps the latest transitions: a job paused and resumed without end does not grow it.
TEST_F(DurabilityTest, TheRecordKeepsTheLatestTransitions) {
  auto runner = std::make_unique<ReportingRunner>(1);
  ReportingRunner* r = runner.get();
  auto m = StartManager(db_, std::move(runner));
  ASSERT_TRUE(m);
  auto first = m->Create(v1::JobSpec());  // holds the node (no GPUs: one job at a time)
  ASSERT_TRUE(first.ok());
  r->WaitStarted();
  auto second = m->Create(v1::JobSpec());
  ASSERT_TRUE(second.ok());
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(m->Pause(second->id()).ok());
    ASSERT_TRUE(m->Resume(second->id()).ok());
  }
  auto job = m->Get(second->id());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->transitions_size(), kMaxTransitionsKept);
  EXPECT_EQ(job->transitions(kMaxTransitionsKept - 1).state(), v1::JOB_STATE_QUEUED);
  r->Go();
}

}  // namespace
}  // namespace offloadd::daemon
