#include "daemon/jobs/job_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
namespace fs = std::filesystem;

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("offloadd-job-store-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    db_path_ = (dir_ / "jobs.db").string();
    auto store = JobStore::Open(db_path_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    v1::Job job;
    job.set_id("job-1");
    job.set_state(v1::JOB_STATE_RUNNING);
    job.mutable_progress()->set_step(4);
    ASSERT_TRUE(store_->Insert(job).ok());
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(dir_);
  }
  // Runs SQL on a second connection to the same file, as another writer or an injected fault.
  void SqlOnTheSide(const char* sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_path_.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
    const std::string msg = err ? err : "";
    sqlite3_free(err);
    sqlite3_close(db);
    ASSERT_EQ(rc, SQLITE_OK) << msg;
  }
  static v1::JobEvent ProgressEvent(const std::string& id, int64_t step) {
    v1::JobEvent e;
    e.set_job_id(id);
    e.mutable_progress()->set_step(step);
    return e;
  }

  fs::path dir_;
  std::string db_path_;
  std::unique_ptr<JobStore> store_;
};

// SQLite's in-memory database (the grpc_handlers fuzz harness's) has no file to watch for deletion:
// it opens, stores and reads back, and its file check passes (it failed with NOT_FOUND once the
// store began to stat its file).
TEST(JobStoreInMemoryTest, AnInMemoryDatabaseHasNoFileToCheck) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  v1::Job job;
  job.set_id("job-m");
  job.set_state(v1::JOB_STATE_QUEUED);
  ASSERT_TRUE((*store)->Insert(job).ok());
  EXPECT_TRUE((*store)->CheckFile().ok());
  auto got = (*store)->Get("job-m");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ((*store)->problem(), "");
}

TEST_F(JobStoreTest, UpdateAndAppendWritesTheRecordAndTheEventTogether) {
  auto job = store_->Get("job-1");
  ASSERT_TRUE(job.ok());
  job->mutable_progress()->set_step(5);
  v1::JobEvent e = ProgressEvent("job-1", 5);
  auto cursor = store_->UpdateAndAppend(*job, &e);
  ASSERT_TRUE(cursor.ok()) << cursor.status().ToString();
  EXPECT_EQ(*cursor, 1);
  EXPECT_EQ(store_->Get("job-1")->progress().step(), 5);
  auto events = store_->Events("job-1", 0, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].progress().step(), 5);
}

// The defect this forces: the record was written, then the event in a second statement, so a
// daemon killed between the two left the record a step ahead of the log, and the resumed run did
// not report that step again. A failing event insert (a trigger here) must leave the record as it was.
TEST_F(JobStoreTest, AFailedEventAppendLeavesTheRecordUnchanged) {
  SqlOnTheSide("CREATE TRIGGER fail_events BEFORE INSERT ON events BEGIN SELECT RAISE(ABORT, 'injected fault'); END");
  auto job = store_->Get("job-1");
  ASSERT_TRUE(job.ok());
  job->mutable_progress()->set_step(5);
  v1::JobEvent e = ProgressEvent("job-1", 5);
  auto cursor = store_->UpdateAndAppend(*job, &e);
  ASSERT_FALSE(cursor.ok());
  EXPECT_NE(cursor.status().message().find("injected fault"), std::string::npos) << cursor.status().ToString();
  EXPECT_EQ(store_->Get("job-1")->progress().step(), 4);
  EXPECT_TRUE(store_->Events("job-1", 0, 10)->empty());

  // The store is usable afterwards: no transaction is left open.
  SqlOnTheSide("DROP TRIGGER fail_events");
  v1::JobEvent again = ProgressEvent("job-1", 5);
  ASSERT_TRUE(store_->UpdateAndAppend(*job, &again).ok());
  EXPECT_EQ(store_->Get("job-1")->progress().step(), 5);
  EXPECT_EQ(store_->Events("job-1", 0, 10)->size(), 1u);
}

TEST_F(JobStoreTest, AnUnknownJobAppendsNoEvent) {
  v1::Job ghost;
  ghost.set_id("job-2");
  v1::JobEvent e = ProgressEvent("job-2", 1);
  auto cursor = store_->UpdateAndAppend(ghost, &e);
  ASSERT_FALSE(cursor.ok());
  EXPECT_EQ(cursor.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(store_->Events("job-2", 0, 10)->empty());
}

TEST_F(JobStoreTest, AnEventOfAnotherJobIsRefused) {
  auto job = store_->Get("job-1");
  ASSERT_TRUE(job.ok());
  v1::JobEvent e = ProgressEvent("job-9", 1);
  auto cursor = store_->UpdateAndAppend(*job, &e);
  ASSERT_FALSE(cursor.ok());
  EXPECT_EQ(cursor.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_->Events("job-9", 0, 10)->empty());
}

// The metrics history: a row per step, read back in step order a page at a time, with every row
// exactly once over the pages (step 0, an evaluation before training, included).
class JobStoreMetricsTest : public JobStoreTest {
 protected:
  static v1::StepMetrics TrainRow(int64_t step) {
    v1::StepMetrics m;
    m.set_step(step);
    m.set_epoch(0.25 * static_cast<double>(step));
    m.set_loss(10.0 / static_cast<double>(step));
    m.set_learning_rate(1e-3);
    m.set_grad_norm(0.5 + static_cast<double>(step));
    m.set_tokens_per_second(100.0 * static_cast<double>(step));
    return m;
  }
  static v1::StepMetrics EvalRow(int64_t step, double loss) {
    v1::StepMetrics m;
    m.set_step(step);
    m.set_eval_loss(loss);
    return m;
  }
  std::vector<v1::StepMetrics> AllRows(int limit) {
    std::vector<v1::StepMetrics> out;
    std::optional<int64_t> after;
    while (true) {
      auto page = store_->Metrics("job-1", after, limit);
      EXPECT_TRUE(page.ok()) << page.status().ToString();
      if (!page.ok()) return out;
      EXPECT_LE(static_cast<int>(page->rows.size()), limit);
      for (const auto& r : page->rows) out.push_back(r);
      if (!page->has_more) return out;
      EXPECT_FALSE(page->rows.empty());
      after = page->rows.back().step();
    }
  }
};

TEST_F(JobStoreMetricsTest, PagesCoverEveryRowOnceInStepOrder) {
  ASSERT_TRUE(store_->RecordMetrics("job-1", EvalRow(0, 3.5)).ok());
  for (int64_t step = 1; step <= 10; ++step)
    ASSERT_TRUE(store_->RecordMetrics("job-1", TrainRow(step)).ok());
  ASSERT_TRUE(store_->RecordMetrics("job-1", EvalRow(5, 2.5)).ok());
  for (int limit : {1, 3, 11, 100}) {
    const auto rows = AllRows(limit);
    ASSERT_EQ(rows.size(), 11u) << "limit " << limit;
    for (int64_t step = 0; step <= 10; ++step) EXPECT_EQ(rows[step].step(), step);
  }
  const auto rows = AllRows(100);
  EXPECT_FALSE(rows[0].has_loss());
  EXPECT_EQ(rows[0].eval_loss(), 3.5);
  EXPECT_EQ(rows[5].loss(), 2.0);  // the step's training values and its evaluation in one row
  EXPECT_EQ(rows[5].eval_loss(), 2.5);
  EXPECT_FALSE(rows[6].has_eval_loss());
  EXPECT_EQ(rows[7].tokens_per_second(), 700.0);
  EXPECT_FALSE(rows[7].has_aux_loss());
  // after_step past the last row: an empty last page.
  auto past = store_->Metrics("job-1", 10, 5);
  ASSERT_TRUE(past.ok());
  EXPECT_TRUE(past->rows.empty());
  EXPECT_FALSE(past->has_more);
}

TEST_F(JobStoreMetricsTest, AReplayedStepKeepsItsFirstValues) {
  ASSERT_TRUE(store_->RecordMetrics("job-1", TrainRow(3)).ok());
  v1::StepMetrics again = TrainRow(3);
  again.set_loss(99);
  again.set_aux_loss(0.01);  // a value the row lacks is still added
  ASSERT_TRUE(store_->RecordMetrics("job-1", again).ok());
  ASSERT_TRUE(store_->RecordMetrics("job-1", EvalRow(3, 1.25)).ok());
  ASSERT_TRUE(store_->RecordMetrics("job-1", EvalRow(3, 7.0)).ok());
  const auto rows = AllRows(10);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].loss(), 10.0 / 3);
  EXPECT_EQ(rows[0].aux_loss(), 0.01);
  EXPECT_EQ(rows[0].eval_loss(), 1.25);
}

TEST_F(JobStoreMetricsTest, RowsSurviveAReopenAndGoWithTheJob) {
  for (int64_t step = 1; step <= 4; ++step)
    ASSERT_TRUE(store_->RecordMetrics("job-1", TrainRow(step)).ok());
  store_.reset();  // the daemon stops
  auto reopened = JobStore::Open(db_path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  store_ = std::move(*reopened);
  auto rows = AllRows(2);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[3].grad_norm(), 4.5);
  ASSERT_TRUE(store_->Delete("job-1").ok());
  auto gone = store_->Metrics("job-1", std::nullopt, 10);
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->rows.empty());
  // A new job of the same id starts an empty history, and the count of rows starts again.
  v1::Job job;
  job.set_id("job-1");
  ASSERT_TRUE(store_->Insert(job).ok());
  store_->set_max_metric_rows(1);
  EXPECT_TRUE(store_->RecordMetrics("job-1", TrainRow(1)).ok());
}

TEST_F(JobStoreMetricsTest, PastTheCapNewStepsAreRefusedByNameAndTheHistoryIsCapped) {
  store_->set_max_metric_rows(3);
  for (int64_t step = 1; step <= 3; ++step)
    ASSERT_TRUE(store_->RecordMetrics("job-1", TrainRow(step)).ok());
  const Status refused = store_->RecordMetrics("job-1", TrainRow(4));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("job job-1 keeps at most 3 steps of metrics history; step 4"),
            std::string::npos)
      << refused.message();
  // A row it has still takes its evaluation.
  EXPECT_TRUE(store_->RecordMetrics("job-1", EvalRow(3, 1.5)).ok());
  auto page = store_->Metrics("job-1", std::nullopt, 10);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->rows.size(), 3u);
  EXPECT_TRUE(page->capped);
  EXPECT_EQ(page->rows[2].eval_loss(), 1.5);
  // The cap holds across a reopen (the rows are counted from the database).
  store_.reset();
  auto reopened = JobStore::Open(db_path_);
  ASSERT_TRUE(reopened.ok());
  store_ = std::move(*reopened);
  store_->set_max_metric_rows(3);
  EXPECT_EQ(store_->RecordMetrics("job-1", TrainRow(5)).code(), StatusCode::kResourceExhausted);
}

TEST_F(JobStoreMetricsTest, MetricsOfAnUnknownJobOrANegativeStepAreRefused) {
  EXPECT_EQ(store_->RecordMetrics("nope", TrainRow(1)).code(), StatusCode::kNotFound);
  EXPECT_EQ(store_->RecordMetrics("job-1", TrainRow(-1)).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offloadd::daemon
