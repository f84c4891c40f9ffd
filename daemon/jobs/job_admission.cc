// JobManager's admission (Submit): the request_id lookup, validation against the node and the
// creation of the job, so that the gRPC handler only translates between the wire and the manager.
#include <unistd.h>

#include <algorithm>

#include "common/units.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/node/node_probe.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

// Without an injected probe: this node's memory and GPUs, nothing configured.
NodeBudget ProbeThisNode() {
  const NodeFacts facts = ProbeNodeResources({});
  NodeBudget node;
  node.host_memory_bytes = facts.memory.total_bytes;
  node.host_memory = trainer::ProbeNodeMemory();
  node.gpus = facts.gpus;
  node.gpu_driver_problem = facts.gpu_driver_problem;
  node.cpu_cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return node;
}

// The job validate_only answers with: as it would be queued.
v1::Job WouldBeJob(ValidationResult& r) {
  v1::Job job;
  *job.mutable_spec() = r.resolved;
  *job.mutable_step_estimate() = r.step_estimate;
  v1::StepEstimate* e = job.mutable_step_estimate();
  e->set_host_bytes(r.host_memory.total);
  e->set_disk_bytes(r.host_memory.disk_bytes);
  e->set_host_memory_limit(r.host_memory_limit);
  // Across hosts the prediction is one host's share (JobHostMemoryInputs).
  const uint32_t hosts = r.resolved.resources().hosts();
  e->set_host_text((hosts > 1 ? "each of the " + std::to_string(hosts) + " hosts: " : "") +
                   r.host_memory.Describe() + " within the host memory limit of " +
                   FormatByteSize(r.host_memory_limit) +
                   (r.capacity_text.empty() ? "" : "; " + r.capacity_text));
  e->set_ram_tier_host_bytes(r.ram_tier_host_bytes);
  e->set_nvme_tier_host_bytes(r.nvme_tier_host_bytes);
  e->set_nvme_tier_disk_bytes(r.nvme_tier_disk_bytes);
  job.set_state(v1::JOB_STATE_QUEUED);
  v1::ModelSummary* model = job.mutable_model();
  model->set_model_type(r.model_type);
  model->set_architecture(r.model_architecture);
  model->set_parts(r.model_parts);
  model->set_parameters(r.model_size.total_params);
  return job;
}

}  // namespace

StatusOr<v1::Job> JobManager::JobForRequestLocked(const std::string& submitted_by,
                                                  const std::string& request_id) {
  // Per client: another client's job with the same request_id is none of this one's business.
  auto existing = store_->JobForRequest(submitted_by, request_id);
  if (existing.status().code() == StatusCode::kNotFound && !submitted_by.empty()) {
    // A key recorded before request ids were per client counts only for its own submitter.
    auto legacy = store_->JobForRequest("", request_id);
    if (legacy.ok()) {
      auto prior = store_->Get(*legacy);
      if (prior.ok() && prior->submitted_by() == submitted_by) existing = std::move(legacy);
    }
  }
  if (!existing.ok()) return existing.status();
  return store_->Get(*existing);
}

StatusOr<Submission> JobManager::Submit(const SubmitRequest& request) {
  Submission out;
  ValidationOptions options;
  options.stop = request.stop;
  if (!request.request_id.empty()) {  // a retry gets its job back: its checkpoints are its own
    std::lock_guard<std::mutex> lock(mu_);
    auto prior = JobForRequestLocked(request.submitted_by, request.request_id);
    if (!prior.ok() && prior.status().code() != StatusCode::kNotFound) return prior.status();
    options.retry_of_created_job = prior.ok();
  }
  const NodeBudget node = options_.probe_node ? options_.probe_node() : ProbeThisNode();
  {
    ScopedJobFileIdentity as_client(request.identity);  // files opened as the job will open them
    out.validation = ValidateJobSpec(request.spec, paths_, node, options);
  }
  ValidationResult& r = out.validation;
  if (!r.stopped.ok()) return out;
  if (request.request_id.size() > kMaxRequestIdBytes) {
    r.violations.push_back({"request_id", std::to_string(request.request_id.size()) +
                                              " bytes, more than the " +
                                              std::to_string(kMaxRequestIdBytes) + " allowed"});
  }
  if (!r.ok()) return out;
  if (request.validate_only) {
    out.job = WouldBeJob(r);
    return out;
  }
  if (request.quota != nullptr) RETURN_IF_ERROR(request.quota->Reserve());
  auto created = Create(r.resolved, request.request_id, request.submitted_by);
  if (!created.ok()) {
    if (request.quota != nullptr) request.quota->Release();
    return created.status();
  }
  if (request.quota != nullptr) request.quota->Commit(created->id());
  out.job = std::move(*created);
  return out;
}

}  // namespace offloadd::daemon
