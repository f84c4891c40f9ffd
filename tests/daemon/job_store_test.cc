#include "daemon/jobs/job_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>

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

}  // namespace
}  // namespace offloadd::daemon
