#include "jobspec/job_defaults.h"

#include "jobspec/training_rules.h"

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

ResolvedJob ResolveJobDefaults(const v1::JobSpec& spec, const JobDefaults& defaults) {
  ResolvedJob r;
  r.spec = spec;
  v1::JobSpec& s = r.spec;
  // The daemon's storage.aio before job.proto's own defaults, which would fill them otherwise.
  v1::AioConfig* aio = s.mutable_offload()->mutable_aio();
  if (!aio->has_block_size() && defaults.aio_block_size > 0) {
    aio->set_block_size(defaults.aio_block_size);
  }
  if (!aio->has_queue_depth() && defaults.aio_queue_depth > 0) {
    aio->set_queue_depth(defaults.aio_queue_depth);
  }
  ApplyJobDefaults(&s);
  // Updates before the clipping norm is known pay off on a GPU; on the CPU, never is also the
  // bitwise-reproducible choice. Resolved here so that the job record names the policy in force.
  if (s.offload().speculation() == v1::SPECULATION_UNSPECIFIED) {
    s.mutable_offload()->set_speculation(defaults.has_gpu ? v1::SPECULATION_AUTO
                                                          : v1::SPECULATION_NEVER);
  }
  const v1::ResourceLimits& res = s.resources();
  r.host_memory_limit =
      res.host_memory_limit() ? res.host_memory_limit() : defaults.host_memory_limit;
  r.gpu_memory_limit = res.gpu_memory_limit() ? res.gpu_memory_limit() : defaults.gpu_memory_limit;
  return r;
}

}  // namespace offloadd::daemon
