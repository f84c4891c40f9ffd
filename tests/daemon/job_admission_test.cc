// JobManager::Submit: admission outside the gRPC handler, with the node probe injected.
#include <atomic>

#include "daemon/jobs/job_manager.h"
#include "tests/job/job_validator_fixture.h"

namespace offloadd::daemon::testing_fixture {
namespace {

// Jobs it is handed wait until they are asked to stop: they stay where Submit put them.
class WaitingRunner : public JobRunner {
 public:
  Status Run(const v1::Job&, JobControl& control) override {
    while (control.stop_requested() == JobControl::Stop::kNone) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return CancelledError("stopped");
  }
};

class JobAdmissionTest : public JobValidatorTest {
 protected:
  std::unique_ptr<JobManager> Manager() {
    auto store = JobStore::Open((root_ / "jobs.db").string());
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    JobManager::Options options;
    options.allowed_roots = {root_.string()};
    options.probe_node = [this] {
      ++probes_;
      return node_;
    };
    auto m = JobManager::Start(std::move(*store), std::make_unique<WaitingRunner>(), {}, options);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }
  SubmitRequest Request(const std::string& request_id = "") const {
    SubmitRequest r;
    r.spec = ValidSpec();
    r.request_id = request_id;
    r.submitted_by = "unix:uid=1000";
    return r;
  }
  std::atomic<int> probes_{0};
};

TEST_F(JobAdmissionTest, ValidateOnlyAnswersTheJobAsItWouldBeQueuedAndCreatesNone) {
  auto jobs = Manager();
  ASSERT_NE(jobs, nullptr);
  SubmitRequest r = Request();
  r.validate_only = true;
  auto s = jobs->Submit(r);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->admitted()) << Describe(s->validation);
  EXPECT_EQ(s->job.state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(s->job.id().empty());
  EXPECT_EQ(s->job.spec().training().learning_rate(), 5e-5);  // resolved
  EXPECT_EQ(s->job.model().model_type(), "gpt2");
  EXPECT_GT(s->job.step_estimate().host_memory_limit(), 0u);
  EXPECT_EQ(probes_.load(), 1);  // the injected probe, asked once
  auto page = jobs->List({}, 10, "");
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->jobs.empty());
}

TEST_F(JobAdmissionTest, ViolationsAreTheResultAndNothingIsCreated) {
  auto jobs = Manager();
  ASSERT_NE(jobs, nullptr);
  node_.gpu_driver_problem = "driver 470 is older than CUDA 12.8 needs";  // seen via the probe
  SubmitRequest r = Request(std::string(kMaxRequestIdBytes + 1, 'x'));
  r.spec.mutable_training()->set_learning_rate(7);
  auto s = jobs->Submit(r);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE(s->admitted());
  EXPECT_NE(Find(s->validation, "training.learning_rate"), nullptr) << Describe(s->validation);
  EXPECT_NE(Find(s->validation, "resources"), nullptr) << Describe(s->validation);
  EXPECT_NE(Find(s->validation, "request_id"), nullptr) << Describe(s->validation);
  auto page = jobs->List({}, 10, "");
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->jobs.empty());
}

// A retry of a request that created a job gets that job back, though its output_dir now holds
// the job's own checkpoints; a new request for the same output_dir is refused for them.
TEST_F(JobAdmissionTest, ARetryIsLookedUpByRequestIdBeforeValidation) {
  auto jobs = Manager();
  ASSERT_NE(jobs, nullptr);
  auto first = jobs->Submit(Request("req-1"));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->admitted()) << Describe(first->validation);
  ASSERT_FALSE(first->job.id().empty());
  fs::create_directories(root_ / "out" / "run1" / "checkpoint-5");  // the job saved one

  auto retry = jobs->Submit(Request("req-1"));
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  ASSERT_TRUE(retry->admitted()) << Describe(retry->validation);
  EXPECT_EQ(retry->job.id(), first->job.id());

  auto other = jobs->Submit(Request("req-2"));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(other->admitted());
  EXPECT_NE(Find(other->validation, "output_dir"), nullptr) << Describe(other->validation);

  // Another client's equal request_id is another request.
  SubmitRequest theirs = Request("req-1");
  theirs.submitted_by = "unix:uid=1001";
  auto s = jobs->Submit(theirs);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_NE(Find(s->validation, "output_dir"), nullptr) << Describe(s->validation);
  ASSERT_TRUE(jobs->Cancel(first->job.id(), "test over").ok());
}

// The quota is held around the creation: reserved, then committed with the job's id.
TEST_F(JobAdmissionTest, TheQuotaIsReservedBeforeTheJobIsRecorded) {
  struct Quota : SubmitQuota {
    Status Reserve() override {
      return full ? ResourceExhaustedError("3 active jobs") : OkStatus();
    }
    void Commit(const std::string& id) override { committed = id; }
    void Release() override { ++released; }
    bool full = false;
    std::string committed;
    int released = 0;
  } quota;
  auto jobs = Manager();
  ASSERT_NE(jobs, nullptr);
  SubmitRequest r = Request();
  r.quota = &quota;
  quota.full = true;
  auto refused = jobs->Submit(r);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  quota.full = false;
  auto s = jobs->Submit(r);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(quota.committed, s->job.id());
  EXPECT_EQ(quota.released, 0);
  ASSERT_TRUE(jobs->Cancel(s->job.id(), "test over").ok());
}

}  // namespace
}  // namespace offloadd::daemon::testing_fixture
