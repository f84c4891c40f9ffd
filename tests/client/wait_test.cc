// Client::Wait against an in-process fake JobService on a Unix socket: the stream is broken on
// purpose, and Wait must resume after the last cursor it delivered.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <vector>

#include "client/cpp/offloadd_client.h"
#include "offloadd/v1/job_service.grpc.pb.h"

namespace offloadd::client {
namespace {

namespace v1 = offloadd::v1;
using std::chrono::milliseconds;

// Serves one job's scripted events. Each WatchJob call sends the events after its cursor; the
// first `break_after` sends stop early with UNAVAILABLE, as a restarting daemon would.
class FakeJobService final : public v1::JobService::Service {
 public:
  std::vector<v1::JobEvent> events;
  v1::JobState final_state = v1::JOB_STATE_SUCCEEDED;
  int break_calls = 0;       // how many calls break
  int break_after = 0;       // events sent before a breaking call breaks
  bool hang_at_end = false;  // keep the stream open after the events (a job still running)
  grpc::Status refuse = grpc::Status::OK;  // answer every WatchJob with this error instead

  grpc::Status WatchJob(grpc::ServerContext* ctx, const v1::WatchJobRequest* req,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    int call;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cursors_.push_back(req->after_cursor());
      call = static_cast<int>(cursors_.size());
    }
    if (!refuse.ok()) return refuse;
    int sent = 0;
    for (const auto& e : events) {
      if (e.cursor() <= req->after_cursor()) continue;
      if (call <= break_calls && sent == break_after)
        return {grpc::StatusCode::UNAVAILABLE, "connection reset (test)"};
      writer->Write(e);
      ++sent;
    }
    if (call <= break_calls) return {grpc::StatusCode::UNAVAILABLE, "connection reset (test)"};
    while (hang_at_end && !ctx->IsCancelled()) std::this_thread::sleep_for(milliseconds(5));
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::Job* job) override {
    job->set_id(req->job_id());
    job->set_state(final_state);
    return grpc::Status::OK;
  }

  std::vector<int64_t> cursors() {
    std::lock_guard<std::mutex> lock(mu_);
    return cursors_;
  }

 private:
  std::mutex mu_;
  std::vector<int64_t> cursors_;
};

class WaitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_wait_XXXXXX";
    dir_ = mkdtemp(tmpl);
    for (int c = 1; c <= 5; ++c) {
      v1::JobEvent e;
      e.set_cursor(c);
      e.set_job_id("job-1");
      if (c == 1)
        e.mutable_state_change()->set_state(v1::JOB_STATE_RUNNING);
      else if (c == 5)
        e.mutable_state_change()->set_state(v1::JOB_STATE_SUCCEEDED);
      else
        e.mutable_progress()->set_step(c - 1);
      service_.events.push_back(e);
    }
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Client> Start(milliseconds reconnect_window = milliseconds(10000)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + dir_ + "/fake.sock", grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_TRUE(server_) << "fake JobService did not start";
    ConnectOptions options;
    options.target = "unix://" + dir_ + "/fake.sock";
    options.reconnect_window = reconnect_window;
    auto c = Client::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return std::move(*c);
  }

  std::string dir_;
  FakeJobService service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(WaitTest, ResumesAfterTheLastCursorWhenTheStreamBreaks) {
  service_.break_calls = 2;  // two breaks: after 2 events, then again after 1 more
  service_.break_after = 2;
  auto client = Start();
  std::vector<int64_t> seen;
  auto job = client->Wait("job-1", [&](const v1::JobEvent& e) { seen.push_back(e.cursor()); });
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4, 5})) << "every event once, in order";
  EXPECT_EQ(service_.cursors(), (std::vector<int64_t>{0, 2, 4}));
}

TEST_F(WaitTest, TimeoutIsDeadlineExceededNamingTheJob) {
  service_.events.pop_back();  // never reaches a final state
  service_.hang_at_end = true;
  auto client = Start();
  const auto start = std::chrono::steady_clock::now();
  // The events that came before the deadline: all 4, or fewer on a loaded machine.
  int64_t seen = 0;
  auto job = client->Wait(
      "job-1", [&](const v1::JobEvent& e) { seen = e.cursor(); }, milliseconds(300));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kDeadlineExceeded);
  const std::string last = seen >= 1 ? "RUNNING" : "no state";  // cursor 1 is the only state change
  EXPECT_NE(job.status().message().find("job-1 did not finish within 0.3 s (last seen " + last +
                                        ", cursor " + std::to_string(seen) + ")"),
            std::string::npos)
      << job.status().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(WaitTest, OtherErrorsReturnAtOnce) {
  service_.refuse = grpc::Status(grpc::StatusCode::NOT_FOUND, "job 'nope' does not exist");
  auto client = Start();
  auto job = client->Wait("nope");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(service_.cursors().size(), 1u) << "not retried";
}

TEST_F(WaitTest, GivesUpAfterTheReconnectWindowNamingTheCursor) {
  service_.break_calls = 1000;  // every call breaks before sending anything
  auto client = Start(milliseconds(400));
  auto job = client->Wait("job-1");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(job.status().message().find(
                "could not resume it for 0.4 s (watch again with after_cursor=0)"),
            std::string::npos)
      << job.status().message();
  EXPECT_GE(service_.cursors().size(), 3u) << "retried with backoff before giving up";
}

TEST_F(WaitTest, StreamThatEndsBeforeTheJobIsFinalIsReopened) {
  service_.final_state = v1::JOB_STATE_RUNNING;  // GetJob disagrees with the ended stream
  auto client = Start(milliseconds(300));
  auto job = client->Wait("job-1");
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("ended while the job was RUNNING"), std::string::npos)
      << job.status().message();
}

}  // namespace
}  // namespace offloadd::client
