#pragma once
// gRPC NodeService: translates the node probe into offloadd.v1.NodeInfo.

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "daemon/metrics/metrics.h"
#include "daemon/node/node_probe.h"
#include "offloadd/v1/node_service.grpc.pb.h"

namespace offloadd::daemon {

struct BuildFacts {
  std::string version;
  std::string revision;
  std::string torch_version;
  bool cuda = false;
};

class NodeServiceImpl final : public offloadd::v1::NodeService::Service {
 public:
  NodeServiceImpl(BuildFacts build, std::vector<StoreDirInput> store_dirs, DaemonMetrics* metrics);

  grpc::Status GetNodeInfo(grpc::ServerContext* context, const offloadd::v1::GetNodeInfoRequest* request,
                           offloadd::v1::NodeInfo* response) override;
  // workers.adamw_kernel, resolved per call into NodeInfo.cpu.adamw_kernel.
  void set_adamw_kernel(std::string request) { adamw_kernel_ = std::move(request); }
  // Where jobs cache the node profile (trainer/plan/node_profile.h); shown as NodeInfo.bandwidths.
  void set_profile_dir(std::string dir) { profile_dir_ = std::move(dir); }
  // The daemon's memory.host_memory_limit (0: what the node can give safely,
  // trainer::DefaultHostMemoryLimit), shown as the default a job gets.
  void set_host_memory_limit(uint64_t bytes) { host_memory_limit_ = bytes; }
  // Which job runs on which GPU (JobManager::GpuAssignments), shown as GpuInfo.job_id.
  void set_gpu_jobs(std::function<std::map<int, std::string>()> gpu_jobs) { gpu_jobs_ = std::move(gpu_jobs); }
  // Why health is NOT_SERVING (JobManager::HealthProblem), shown as NodeInfo.serving_problem.
  void set_serving_problem(std::function<std::string()> problem) { serving_problem_ = std::move(problem); }

 private:
  BuildFacts build_;
  std::vector<StoreDirInput> store_dirs_;
  DaemonMetrics* metrics_;
  int64_t start_unix_seconds_;
  std::string adamw_kernel_ = "auto";
  std::string profile_dir_;
  uint64_t host_memory_limit_ = 0;
  std::function<std::map<int, std::string>()> gpu_jobs_;
  std::function<std::string()> serving_problem_;
};

// Fills NodeInfo.bandwidths from the node profile cached in `dir` (problem set when none is).
void FillBandwidths(const std::string& dir, offloadd::v1::Bandwidths* out);
// The shape profiles cached under <dir>/shapes (job/shape_profile.h), newest first.
void FillShapeProfiles(const std::string& dir, offloadd::v1::NodeInfo* out);
// Each listed store directory's own rates from the node profile under `dir` (none when absent).
void FillStoreRates(const std::string& dir, offloadd::v1::NodeInfo* out);

// Exposed for tests: fills `out` from probed facts.
void FillNodeInfo(const NodeFacts& facts, const BuildFacts& build, offloadd::v1::NodeInfo* out);

}  // namespace offloadd::daemon
