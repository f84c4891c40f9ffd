// Load test of the real gRPC server stack, in process, over its Unix socket: 1000 jobs queued
// behind one that the runner holds, 1000 concurrent WatchJob streams (one per job), then the
// runner lets every job through. Every stream must see its job end SUCCEEDED, and Health,
// GetJob and ListJobs paging must keep answering while the streams are open. A liveness test with
// generous bounds, not a benchmark; timings go to the log for whoever wants them.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <sys/stat.h>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/jobs/job_manager.h"
#include "daemon/jobs/job_store.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/grpc_server.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "offloadd/v1/job_service.grpc.pb.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

constexpr int kJobs = 1000;
constexpr int kChannels = 20;             // 50 streams per connection, as from a few busy clients
constexpr auto kCallBound = seconds(10);  // a unary call slower than this means the server choked

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU time of this process (server and clients), user + system.
double CpuSeconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

int ThreadCount() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// Holds the first job until Release(); every job then reports one step and succeeds.
class HeldRunner final : public JobRunner {
 public:
  Status Run(const v1::Job&, JobControl& control) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++started_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    v1::JobProgress p;
    p.set_step(1);
    p.set_max_steps(1);
    control.ReportProgress(p);
    return OkStatus();
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool WaitStarted(std::chrono::seconds bound) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, bound, [&] { return started_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int started_ = 0;
  bool released_ = false;
};

// Counts streams that have seen their first event and streams that have ended.
struct Tally {
  std::mutex mu;
  std::condition_variable cv;
  int opened = 0;
  int done = 0;
  bool WaitFor(int Tally::*field, int n, Clock::duration bound) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, bound, [&] { return this->*field >= n; });
  }
  void Bump(int Tally::*field) {
    std::lock_guard<std::mutex> lock(mu);
    ++(this->*field);
    cv.notify_all();
  }
};

// One WatchJob stream driven by gRPC's callback API: no client thread per stream.
class WatchStream final : public grpc::ClientReadReactor<v1::JobEvent> {
 public:
  WatchStream(v1::JobService::Stub* stub, const std::string& job_id, Tally* tally) : tally_(tally) {
    request_.set_job_id(job_id);
    stub->async()->WatchJob(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    if (cursors_.empty()) tally_->Bump(&Tally::opened);
    cursors_.push_back(event_.cursor());
    if (event_.has_state_change()) states_.push_back(event_.state_change().state());
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    tally_->Bump(&Tally::done);
  }
  void Cancel() { context_.TryCancel(); }

  // Read only after OnDone (the tally's mutex orders it).
  const grpc::Status& status() const { return status_; }
  const std::vector<int64_t>& cursors() const { return cursors_; }
  const std::vector<v1::JobState>& states() const { return states_; }

 private:
  Tally* tally_;
  grpc::ClientContext context_;
  v1::WatchJobRequest request_;
  v1::JobEvent event_;
  grpc::Status status_;
  std::vector<int64_t> cursors_;
  std::vector<v1::JobState> states_;
};

class LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The job database's durability (an fsync per commit) is not what is measured here; keep it
    // on tmpfs where there is one so a slow CI disk does not decide the outcome.
    const std::string base = [] { struct stat st {}; return ::stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode); }() ? "/dev/shm" : "/tmp";
    std::string tmpl = base + "/offloadd_load_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto store = JobStore::Open(dir_ + "/jobs.db");
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto runner = std::make_unique<HeldRunner>();
    runner_ = runner.get();
    auto jobs = JobManager::Start(std::move(*store), std::move(runner));
    ASSERT_TRUE(jobs.ok()) << jobs.status().ToString();
    jobs_ = std::move(*jobs);
    auto metrics = DaemonMetrics::Start("", {"test", "test", "none", "cpu"});
    ASSERT_TRUE(metrics.ok()) << metrics.status().ToString();
    metrics_ = std::move(*metrics);
    DaemonConfig config;
    config.state_dir = dir_;
    config.allowed_roots = {dir_};
    if (watchers_limit_ > 0) config.server.max_watchers_per_client = watchers_limit_;
    if (threads_limit_ > 0) config.server.max_threads = threads_limit_;
    config.server.unix_socket = dir_ + "/offloadd.sock";
    auto server =
        GrpcServer::Start(config, {"test", "test", "none", false}, jobs_.get(), metrics_.get());
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    for (int i = 0; i < kChannels; ++i) {
      grpc::ChannelArguments args;
      args.SetInt("offloadd.load_test.channel", i);  // a connection of its own, not a shared one
      channels_.push_back(grpc::CreateCustomChannel("unix:" + config.server.unix_socket,
                                                    grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(v1::JobService::NewStub(channels_.back()));
    }
  }

  void TearDown() override {
    if (runner_) runner_->Release();  // a failed assertion may have left the first job held
    for (auto& w : watches_) w->Cancel();
    tally_.WaitFor(&Tally::done, static_cast<int>(watches_.size()), seconds(30));
    if (jobs_) jobs_->Shutdown();
    if (server_) server_->Shutdown(1);
    server_.reset();
    jobs_.reset();
    (void)std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  // Health, one GetJob and every page of ListJobs, each within kCallBound. Returns the jobs by
  // state.
  std::map<v1::JobState, int> CheckResponsive(const std::string& some_job) {
    std::map<v1::JobState, int> by_state;
    auto health = grpc::health::v1::Health::NewStub(channels_[0]);
    grpc::ClientContext hctx;
    hctx.set_deadline(std::chrono::system_clock::now() + kCallBound);
    grpc::health::v1::HealthCheckResponse hresp;
    const grpc::Status hs = health->Check(&hctx, {}, &hresp);
    EXPECT_TRUE(hs.ok()) << "Health: " << hs.error_message();
    EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

    grpc::ClientContext gctx;
    gctx.set_deadline(std::chrono::system_clock::now() + kCallBound);
    v1::GetJobRequest get;
    get.set_job_id(some_job);
    v1::Job job;
    const grpc::Status gs = stubs_[1]->GetJob(&gctx, get, &job);
    EXPECT_TRUE(gs.ok()) << "GetJob: " << gs.error_message();

    v1::ListJobsRequest list;
    list.set_page_size(100);
    int pages = 0;
    do {
      grpc::ClientContext lctx;
      lctx.set_deadline(std::chrono::system_clock::now() + kCallBound);
      v1::ListJobsResponse resp;
      const grpc::Status ls = stubs_[pages % kChannels]->ListJobs(&lctx, list, &resp);
      if (!ls.ok()) {
        ADD_FAILURE() << "ListJobs page " << pages << ": " << ls.error_message();
        break;
      }
      for (const auto& j : resp.jobs()) ++by_state[j.state()];
      list.set_page_token(resp.next_page_token());
      ++pages;
    } while (!list.page_token().empty() && pages < 100);
    return by_state;
  }

  std::string dir_;
  uint32_t watchers_limit_ = 0;  // server.max_watchers_per_client when set
  uint32_t threads_limit_ = 0;   // server.max_threads when set
  HeldRunner* runner_ = nullptr;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<DaemonMetrics> metrics_;
  std::unique_ptr<GrpcServer> server_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs_;
  Tally tally_;
  std::vector<std::unique_ptr<WatchStream>> watches_;
};

TEST_F(LoadTest, ThousandWatchersOfThousandQueuedJobs) {
  auto t = Clock::now();
  std::vector<std::string> ids;
  for (int i = 0; i < kJobs; ++i) {
    v1::JobSpec spec;
    spec.set_display_name("load-" + std::to_string(i));
    auto job = jobs_->Create(spec);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    ids.push_back(job->id());
  }
  ASSERT_TRUE(runner_->WaitStarted(seconds(30))) << "the first job never started";
  std::printf("[ load ] queued %d jobs in %.2f s\n", kJobs, SecondsSince(t));

  t = Clock::now();
  for (int i = 0; i < kJobs; ++i) {
    watches_.push_back(std::make_unique<WatchStream>(stubs_[i % kChannels].get(), ids[i], &tally_));
  }
  ASSERT_TRUE(tally_.WaitFor(&Tally::opened, kJobs, seconds(60)))
      << "only " << tally_.opened << " of " << kJobs
      << " WatchJob streams delivered their first event";
  std::printf("[ load ] %d WatchJob streams open in %.2f s\n", kJobs, SecondsSince(t));

  // What 1000 idle watchers cost: each sleeps until its own job has news, waking only to check
  // that its client is still there.
  const double cpu_before = CpuSeconds();
  std::this_thread::sleep_for(seconds(3));
  std::printf("[ load ] idle for 3 s with the streams open: %.2f CPU s; %d threads\n",
              CpuSeconds() - cpu_before, ThreadCount());

  t = Clock::now();
  auto states = CheckResponsive(ids[kJobs / 2]);
  std::printf("[ load ] Health + GetJob + ListJobs (%d pages) with the streams open: %.2f s\n",
              kJobs / 100 + 1, SecondsSince(t));
  EXPECT_EQ(states[v1::JOB_STATE_RUNNING], 1);
  EXPECT_EQ(states[v1::JOB_STATE_QUEUED], kJobs - 1);

  t = Clock::now();
  runner_->Release();
  ASSERT_TRUE(tally_.WaitFor(&Tally::done, kJobs, seconds(90)))
      << "only " << tally_.done << " of " << kJobs
      << " streams ended after the runner was released";
  std::printf("[ load ] %d jobs ran and every stream ended in %.2f s\n", kJobs, SecondsSince(t));

  int bad = 0;
  for (int i = 0; i < kJobs && bad < 5; ++i) {
    const WatchStream& w = *watches_[i];
    const bool good =
        w.status().ok() && !w.states().empty() && w.states().back() == v1::JOB_STATE_SUCCEEDED &&
        w.cursors() == std::vector<int64_t>{1, 2, 3, 4};  // QUEUED, RUNNING, step, SUCCEEDED
    if (!good) {
      ++bad;
      ADD_FAILURE() << "stream of " << ids[i] << ": status " << w.status().error_code() << " "
                    << w.status().error_message() << ", " << w.cursors().size()
                    << " events, last state "
                    << (w.states().empty() ? "none" : v1::JobState_Name(w.states().back()));
    }
  }
  states = CheckResponsive(ids[0]);
  EXPECT_EQ(states[v1::JOB_STATE_SUCCEEDED], kJobs);
}

// server.max_watchers_per_client through the real server: every stream here comes from one
// client (the Unix socket), over 20 connections.
class WatcherLimitTest : public LoadTest {
 protected:
  WatcherLimitTest() { watchers_limit_ = 5; }
};

TEST_F(WatcherLimitTest, OneStreamOverTheLimitIsRefusedAndAClosedOneFreesItsSlot) {
  v1::JobSpec spec;
  spec.set_display_name("watched");
  auto job = jobs_->Create(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(runner_->WaitStarted(seconds(30)));
  for (int i = 0; i < 5; ++i) {
    watches_.push_back(std::make_unique<WatchStream>(stubs_[i % kChannels].get(), job->id(), &tally_));
  }
  ASSERT_TRUE(tally_.WaitFor(&Tally::opened, 5, seconds(30)));
  watches_.push_back(std::make_unique<WatchStream>(stubs_[5].get(), job->id(), &tally_));
  ASSERT_TRUE(tally_.WaitFor(&Tally::done, 1, seconds(30))) << "the sixth stream was not refused";
  EXPECT_EQ(watches_.back()->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(watches_.back()->status().error_message().find("server.max_watchers_per_client"),
            std::string::npos)
      << watches_.back()->status().error_message();
  // One stream ends: its slot is free again once the server's handler returns, which it does
  // when it next checks for a cancelled client (every 2 s, kWatchCancelPollMs).
  watches_[0]->Cancel();
  ASSERT_TRUE(tally_.WaitFor(&Tally::done, 2, seconds(30)));
  int done = 2;
  const auto deadline = Clock::now() + seconds(10);
  while (true) {
    watches_.push_back(std::make_unique<WatchStream>(stubs_[6].get(), job->id(), &tally_));
    if (tally_.WaitFor(&Tally::opened, 6, std::chrono::milliseconds(500))) break;
    ASSERT_TRUE(tally_.WaitFor(&Tally::done, ++done, seconds(30)));
    EXPECT_EQ(watches_.back()->status().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    ASSERT_LT(Clock::now(), deadline) << "the cancelled stream's slot was not freed within 10 s";
  }
}

// server.max_threads through the real server: 40 WatchJob streams of one client against a cap of
// 16 threads, under the per-client watcher limit. The client's CreateJob and WatchJob calls are
// bounded by its share of the threads left after the reserve for short calls (6 of
// 12), so the streams beyond it are refused with RESOURCE_EXHAUSTED, and once the streams
// end the daemon answers again.
class ThreadQuotaTest : public LoadTest {
 protected:
  ThreadQuotaTest() { threads_limit_ = 16; }
};

TEST_F(ThreadQuotaTest, CallsBeyondTheCapAreRefusedAndTheDaemonRecovers) {
  v1::JobSpec spec;
  spec.set_display_name("watched");
  auto job = jobs_->Create(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(runner_->WaitStarted(seconds(30)));
  constexpr int kStreams = 40;
  for (int i = 0; i < kStreams; ++i) {
    watches_.push_back(std::make_unique<WatchStream>(stubs_[i % kChannels].get(), job->id(), &tally_));
  }
  // At most 16 threads: some streams open, the rest are refused (and end) at once.
  ASSERT_TRUE(tally_.WaitFor(&Tally::done, kStreams - 16, seconds(30))) << "no stream was refused";
  // The refusals can all end before a served stream has delivered its first event: wait for one
  // rather than count them at that instant.
  ASSERT_TRUE(tally_.WaitFor(&Tally::opened, 1, seconds(30))) << "no stream was served";
  {
    std::lock_guard<std::mutex> lock(tally_.mu);
    EXPECT_LT(tally_.opened, 16);
  }
  for (auto& w : watches_) w->Cancel();
  ASSERT_TRUE(tally_.WaitFor(&Tally::done, kStreams, seconds(30)));
  // Every stream has ended (a status is read only after its OnDone): refused, or cancelled here.
  int refused = 0;
  for (auto& w : watches_) {
    if (w->status().error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
    } else {
      EXPECT_EQ(w->status().error_code(), grpc::StatusCode::CANCELLED)
          << w->status().error_message();
    }
  }
  EXPECT_GE(refused, kStreams - 16);
  // The streams end as soon as they are cancelled; then every call is served again.
  const auto deadline = Clock::now() + seconds(15);
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    v1::ListJobsRequest list;
    v1::ListJobsResponse resp;
    const grpc::Status st = stubs_[0]->ListJobs(&ctx, list, &resp);
    if (st.ok()) break;
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    ASSERT_LT(Clock::now(), deadline) << "the daemon did not serve again after the streams ended";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // Then several calls at once, well under the cap, are all served.
  CheckResponsive(job->id());
}

}  // namespace
}  // namespace offloadd::daemon
