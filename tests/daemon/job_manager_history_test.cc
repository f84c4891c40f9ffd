// JobManager's paged reads of a job's history (job_manager_history.cc): ListJobEvents' and
// ListJobMetrics' core, with a runner that reports progress, logs and metrics rows.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/jobs/job_manager.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
namespace fs = std::filesystem;

// Trains `steps` steps at once: each a metrics row, a progress event and a log line.
class ReportingRunner : public JobRunner {
 public:
  explicit ReportingRunner(int steps) : steps_(steps) {}
  Status Run(const v1::Job&, JobControl& control) override {
    for (int s = 1; s <= steps_; ++s) {
      v1::StepMetrics row;
      row.set_step(s);
      row.set_loss(10.0 / s);
      control.RecordMetrics(row);
      v1::JobProgress p;
      p.set_step(s);
      p.set_loss(10.0 / s);
      control.ReportProgress(p);
      control.Log(v1::LOG_LEVEL_INFO, "step " + std::to_string(s));
    }
    return OkStatus();
  }

 private:
  int steps_;
};

class JobManagerHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_history_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    manager_.reset();
    fs::remove_all(dir_);
  }
  // Starts a manager whose store keeps at most `max_rows` metrics rows per job, runs one job of
  // `steps` steps to its end and returns its id.
  std::string RunJob(int steps, int64_t max_rows = kMaxMetricRowsPerJob) {
    auto store = JobStore::Open(dir_ + "/jobs.db");
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    (*store)->set_max_metric_rows(max_rows);
    auto m = JobManager::Start(std::move(*store), std::make_unique<ReportingRunner>(steps));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
    v1::JobSpec spec;
    spec.set_display_name("history");
    auto job = manager_->Create(spec);
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    EXPECT_TRUE(
        manager_
            ->Watch(
                job->id(), 0, [](const v1::JobEvent&) { return true; }, [] { return false; }, 20)
            .ok());
    return job->id();
  }
  std::vector<v1::JobEvent> AllEvents(const std::string& id) {
    std::vector<v1::JobEvent> out;
    EXPECT_TRUE(manager_
                    ->Watch(
                        id, 0,
                        [&](const v1::JobEvent& e) {
                          out.push_back(e);
                          return true;
                        },
                        [] { return false; }, 20)
                    .ok());
    return out;
  }
  // Every page of ListJobEvents, following next_after.
  std::vector<v1::JobEvent> Paged(const std::string& id, int limit, bool progress, bool logs) {
    std::vector<v1::JobEvent> out;
    int64_t after = 0;
    for (int pages = 0; pages < 1000; ++pages) {
      auto page = manager_->Events(id, after, limit, progress, logs);
      EXPECT_TRUE(page.ok()) << page.status().ToString();
      if (!page.ok()) break;
      EXPECT_LE(static_cast<int>(page->events.size()), limit);
      for (const auto& e : page->events) out.push_back(e);
      EXPECT_GE(page->next_after, after);
      after = page->next_after;
      if (!page->has_more) break;
    }
    return out;
  }

  std::string dir_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerHistoryTest, EventPagesCoverEveryEventExactlyOnce) {
  const std::string id = RunJob(7);
  const auto all = AllEvents(id);
  ASSERT_GT(all.size(), 14u);  // 7 progress, 7 logs, the state changes
  for (int limit : {1, 2, 5, 100}) {
    const auto paged = Paged(id, limit, true, true);
    ASSERT_EQ(paged.size(), all.size()) << "limit " << limit;
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(paged[i].cursor(), all[i].cursor());
  }
  // Left-out kinds do not end a page early: pages of 2 still find all 7 logs.
  const auto no_progress = Paged(id, 2, false, true);
  size_t logs = 0;
  for (const auto& e : no_progress) {
    EXPECT_FALSE(e.has_progress());
    logs += e.has_log();
  }
  EXPECT_EQ(logs, 7u);
  EXPECT_EQ(no_progress.size(), all.size() - 7);
  const auto progress_only = Paged(id, 3, true, false);
  EXPECT_EQ(std::count_if(progress_only.begin(), progress_only.end(),
                          [](const v1::JobEvent& e) { return e.has_progress(); }),
            7);
  // After the last event: an empty page, nothing more.
  auto past = manager_->Events(id, all.back().cursor(), 10);
  ASSERT_TRUE(past.ok());
  EXPECT_TRUE(past->events.empty());
  EXPECT_FALSE(past->has_more);
}

TEST_F(JobManagerHistoryTest, MetricsRowsOfEveryStep) {
  const std::string id = RunJob(5);
  auto page = manager_->Metrics(id, std::nullopt, 0);
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->rows.size(), 5u);
  for (int s = 1; s <= 5; ++s) EXPECT_EQ(page->rows[s - 1].loss(), 10.0 / s);
  EXPECT_FALSE(page->has_more);
  EXPECT_FALSE(page->capped);
  auto second = manager_->Metrics(id, 2, 2);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->rows.size(), 2u);
  EXPECT_EQ(second->rows[0].step(), 3);
  EXPECT_TRUE(second->has_more);
}

TEST_F(JobManagerHistoryTest, PastTheCapTheJobsEventsSaySoOnce) {
  const std::string id = RunJob(6, /*max_rows=*/4);
  auto page = manager_->Metrics(id, std::nullopt, 100);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->rows.size(), 4u);
  EXPECT_TRUE(page->capped);
  std::vector<std::string> warnings;
  for (const auto& e : AllEvents(id)) {
    if (e.has_log() && e.log().level() == v1::LOG_LEVEL_WARNING)
      warnings.push_back(e.log().message());
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("metrics history: job " + id +
                             " keeps at most 4 steps of metrics history; step 5"),
            std::string::npos)
      << warnings[0];
}

TEST_F(JobManagerHistoryTest, BadRequestsAreRefusedByName) {
  const std::string id = RunJob(1);
  EXPECT_EQ(manager_->Metrics("no-such-job", std::nullopt, 10).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(manager_->Events("no-such-job", 0, 10).status().code(), StatusCode::kNotFound);
  const auto negative = manager_->Metrics(id, std::nullopt, -1).status();
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(negative.message().find("limit must not be negative, got -1"), std::string::npos);
  EXPECT_EQ(manager_->Events(id, -5, 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->Events(id, 0, -1).status().code(), StatusCode::kInvalidArgument);
  // Larger pages than allowed are cut to the maximum, not refused.
  EXPECT_TRUE(manager_->Events(id, 0, 1 << 30).ok());
}

}  // namespace
}  // namespace offloadd::daemon
