// Fuzzes the daemon's gRPC surface through the real server: GrpcServer (its Unix socket, the
// accept loop that reads SO_PEERCRED, the services) with JobServiceImpl and NodeServiceImpl over a
// real JobManager (SQLite store in memory) whose runner stands in for the executors. Each input
// is a sequence of calls, made over a real channel to the socket as a client would:
//
//   record := method (1 byte) | length (2 bytes, little-endian) | request (protobuf wire format)
//   method % 9: CreateJob, GetJob, ListJobs, CancelJob, PauseJob, ResumeJob, WatchJob,
//               ListCheckpoints, GetNodeInfo
//
// A request that does not parse as the method's message is skipped (gRPC refuses it before any
// handler). A job_id of "$0".."$9" names the n-th job this input created, so sequences reach the
// state machine (cancel a running job, resume a paused one, watch one to its end). Job specs name
// files in the sandbox of fuzz/job_sandbox.h under kRoot.
//
// Checked: no call outlives its deadline (a handler that hangs is a finding; WatchJob of a job
// that does not end is allowed to), a created job's paths are under kRoot, GetJob of a created
// job finds it, ListJobs lists every created job once, WatchJob's cursors strictly increase, and
// the server shuts down within its grace period. A server per input: nothing carries over.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>
#include <grpcpp/grpcpp.h>

#include "common/safe_path.h"
#include "daemon/daemon.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/jobs/job_store.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/grpc_server.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/job_sandbox.h"
#include "offloadd/v1/job_service.grpc.pb.h"
#include "offloadd/v1/node_service.grpc.pb.h"

namespace od = offloadd::daemon;
namespace v1 = offloadd::v1;
using Clock = std::chrono::system_clock;

namespace {

constexpr const char* kRoot = "/tmp/offloadd-fuzz-grpc";
constexpr int kMaxCalls = 16;
constexpr auto kCallDeadline = std::chrono::seconds(5);
constexpr auto kWatchDeadline = std::chrono::milliseconds(300);

// Stands in for the executors: reports two steps and a checkpoint (whose directory exists, so
// ListCheckpoints lists it), stopping when asked as a real run does.
class QuickRunner : public od::JobRunner {
 public:
  offloadd::Status Run(const v1::Job& job, od::JobControl& control) override {
    for (int step = 1; step <= 2; ++step) {
      if (control.stop_requested() != od::JobControl::Stop::kNone) return offloadd::CancelledError("stopped on request");
      v1::JobProgress p;
      p.set_step(step);
      p.set_max_steps(2);
      p.set_loss(1.0 / step);
      control.ReportProgress(p);
    }
    v1::Checkpoint c;
    c.set_job_id(job.id());
    c.set_step(2);
    c.set_path(std::string(kRoot) + "/out");
    control.CheckpointSaved(c);
    return offloadd::OkStatus();
  }
  offloadd::StatusOr<std::string> CheckpointForResume(const v1::Job&) override { return std::string(kRoot) + "/out"; }
};

void Init() {
  offloadd::fuzz::MakeJobSandbox(kRoot);
  offloadd::SetAllowedRoots({kRoot});
}

bool UnderRoot(const std::string& p) {
  return p.empty() || p == kRoot || p.rfind(std::string(kRoot) + "/", 0) == 0;
}

struct Daemon {
  std::unique_ptr<od::JobManager> jobs;
  std::unique_ptr<od::DaemonMetrics> metrics;
  std::unique_ptr<od::GrpcServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::string socket;
};

Daemon Start() {
  Daemon d;
  auto store = od::JobStore::Open(":memory:");
  if (!store.ok()) offloadd::fuzz::SetupFailed(store.status().ToString());
  od::DaemonConfig config;
  config.state_dir = std::string(kRoot) + "/state";
  config.allowed_roots = {kRoot};
  config.server.max_active_jobs_per_client = 8;  // reachable within one input
  config.server.max_watchers_per_client = 2;
  // Per process: libFuzzer's -fork/-jobs run several harness processes on one sandbox.
  d.socket = std::string(kRoot) + "/sock-" + std::to_string(::getpid());
  config.server.unix_socket = d.socket;
  config.storage.directories.push_back({std::string(kRoot) + "/nvme", 1.0});
  // Admission as the daemon's: its roots and node probe (JobManager::Submit).
  auto jobs = od::JobManager::Start(std::move(*store), std::make_unique<QuickRunner>(), {},
                                    od::JobManagerOptionsFor(config, /*gpus=*/0));
  if (!jobs.ok()) offloadd::fuzz::SetupFailed(jobs.status().ToString());
  d.jobs = std::move(*jobs);
  auto metrics = od::DaemonMetrics::Start("", {"fuzz", "fuzz", "none", "cpu"});
  if (!metrics.ok()) offloadd::fuzz::SetupFailed(metrics.status().ToString());
  d.metrics = std::move(*metrics);
  auto server = od::GrpcServer::Start(config, {"fuzz", "fuzz", "none", false}, d.jobs.get(), d.metrics.get());
  if (!server.ok()) offloadd::fuzz::SetupFailed(server.status().ToString());
  d.server = std::move(*server);
  d.channel = grpc::CreateChannel("unix:" + d.socket, grpc::InsecureChannelCredentials());
  return d;
}

// A job_id "$n" is the n-th job this input created (else the id as given).
std::string Resolve(const std::string& id, const std::vector<std::string>& created) {
  if (id.size() == 2 && id[0] == '$' && id[1] >= '0' && id[1] <= '9') {
    const size_t n = static_cast<size_t>(id[1] - '0');
    if (n < created.size()) return created[n];
  }
  return id;
}

template <typename Req>
bool Parse(Req* req, const uint8_t* p, size_t n, const std::vector<std::string>& created) {
  if (!req->ParseFromArray(p, static_cast<int>(n))) return false;
  if constexpr (requires { req->job_id(); }) req->set_job_id(Resolve(req->job_id(), created));
  return true;
}

void SetDeadline(grpc::ClientContext* ctx, Clock::duration d) { ctx->set_deadline(Clock::now() + d); }

void CheckNotHung(const grpc::Status& s, const char* method) {
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::fprintf(stderr, "grpc_handlers: %s did not answer within %lld s\n", method,
                 static_cast<long long>(kCallDeadline.count()));
    std::abort();
  }
}

void Call(uint8_t method, const uint8_t* p, size_t n, v1::JobService::Stub& jobs, v1::NodeService::Stub& node,
          std::vector<std::string>* created) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, kCallDeadline);
  v1::Job job;
  switch (method % 9) {
    case 0: {
      v1::CreateJobRequest req;
      if (!Parse(&req, p, n, *created)) return;
      const grpc::Status s = jobs.CreateJob(&ctx, req, &job);
      CheckNotHung(s, "CreateJob");
      if (!s.ok()) return;
      FUZZ_CHECK(UnderRoot(job.spec().model().path()));
      FUZZ_CHECK(UnderRoot(job.spec().tokenizer().path()));
      FUZZ_CHECK(UnderRoot(job.spec().output_dir()));
      for (const std::string& path : job.spec().dataset().paths()) FUZZ_CHECK(UnderRoot(path));
      if (!req.validate_only() && std::find(created->begin(), created->end(), job.id()) == created->end()) {
        created->push_back(job.id());
      }
      return;
    }
    case 1: {
      v1::GetJobRequest req;
      if (!Parse(&req, p, n, *created)) return;
      const grpc::Status s = jobs.GetJob(&ctx, req, &job);
      CheckNotHung(s, "GetJob");
      const bool ours = std::find(created->begin(), created->end(), req.job_id()) != created->end();
      FUZZ_CHECK(!ours || s.ok());
      FUZZ_CHECK(!s.ok() || job.id() == req.job_id());
      return;
    }
    case 2: {
      v1::ListJobsRequest req;
      v1::ListJobsResponse resp;
      if (!Parse(&req, p, n, *created)) return;
      CheckNotHung(jobs.ListJobs(&ctx, req, &resp), "ListJobs");
      return;
    }
    case 3: {
      v1::CancelJobRequest req;
      if (!Parse(&req, p, n, *created)) return;
      CheckNotHung(jobs.CancelJob(&ctx, req, &job), "CancelJob");
      return;
    }
    case 4: {
      v1::PauseJobRequest req;
      if (!Parse(&req, p, n, *created)) return;
      CheckNotHung(jobs.PauseJob(&ctx, req, &job), "PauseJob");
      return;
    }
    case 5: {
      v1::ResumeJobRequest req;
      if (!Parse(&req, p, n, *created)) return;
      CheckNotHung(jobs.ResumeJob(&ctx, req, &job), "ResumeJob");
      return;
    }
    case 6: {
      v1::WatchJobRequest req;
      if (!Parse(&req, p, n, *created)) return;
      grpc::ClientContext wctx;  // a paused or queued job's stream may last: a short deadline
      SetDeadline(&wctx, kWatchDeadline);
      auto reader = jobs.WatchJob(&wctx, req);
      v1::JobEvent e;
      int64_t last = req.after_cursor() > 0 ? req.after_cursor() : 0;
      while (reader->Read(&e)) {
        FUZZ_CHECK(e.cursor() > last);
        last = e.cursor();
      }
      (void)reader->Finish();
      return;
    }
    case 7: {
      v1::ListCheckpointsRequest req;
      v1::ListCheckpointsResponse resp;
      if (!Parse(&req, p, n, *created)) return;
      CheckNotHung(jobs.ListCheckpoints(&ctx, req, &resp), "ListCheckpoints");
      return;
    }
    default: {
      v1::GetNodeInfoRequest req;
      v1::NodeInfo resp;
      if (!Parse(&req, p, n, *created)) return;
      CheckNotHung(node.GetNodeInfo(&ctx, req, &resp), "GetNodeInfo");
      return;
    }
  }
}

// Every job the input created is listed, once, across ListJobs pages.
void CheckListed(v1::JobService::Stub& jobs, const std::vector<std::string>& created) {
  std::multiset<std::string> seen;
  v1::ListJobsRequest req;
  req.set_page_size(3);  // several pages
  for (int pages = 0; pages < 100; ++pages) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, kCallDeadline);
    v1::ListJobsResponse resp;
    const grpc::Status s = jobs.ListJobs(&ctx, req, &resp);
    CheckNotHung(s, "ListJobs");
    FUZZ_CHECK(s.ok());
    for (const auto& j : resp.jobs()) seen.insert(j.id());
    if (resp.next_page_token().empty()) break;
    req.set_page_token(resp.next_page_token());
  }
  for (const std::string& id : created) FUZZ_CHECK(seen.count(id) == 1);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in parsed strings is logged otherwise
  Init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Daemon d = Start();
  auto jobs = v1::JobService::NewStub(d.channel);
  auto node = v1::NodeService::NewStub(d.channel);
  std::vector<std::string> created;
  size_t at = 0;
  for (int calls = 0; calls < kMaxCalls && at + 3 <= size; ++calls) {
    const uint8_t method = data[at];
    size_t n = static_cast<size_t>(data[at + 1]) | (static_cast<size_t>(data[at + 2]) << 8);
    at += 3;
    n = std::min(n, size - at);
    Call(method, data + at, n, *jobs, *node, &created);
    at += n;
  }
  CheckListed(*jobs, created);
  const auto t0 = std::chrono::steady_clock::now();
  d.jobs->Shutdown();
  d.server->Shutdown(1.0);
  FUZZ_CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  return 0;
}
