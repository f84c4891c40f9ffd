#pragma once
// The one place where a job's own value and the default that stands in for it are chosen: the
// Hugging Face / DeepSpeed defaults of job.proto (ApplyJobDefaults), the node's (storage.aio, the
// speculation policy of a node with or without a GPU) and the daemon's memory budgets. Job
// validation (job_validator.h) resolves a spec with it before checking it, and the trainer's
// configuration (train_job_config.h) is made from a spec resolved with it, so what validation
// checked is what the job runs with. A new defaulted JobSpec field gets its default here, once.
// Torch-free and daemon-free (proto and common only). Thread-safe: pure functions.

#include <cstdint>

#include "offloadd/v1/job.pb.h"

namespace offloadd::daemon {

// What the node and the daemon's configuration supply where a job sets nothing.
struct JobDefaults {
  bool has_gpu = false;          // jobs here train on a GPU
  uint64_t aio_block_size = 0;   // storage.aio.block_size; 0: job.proto's default (1 MiB)
  uint32_t aio_queue_depth = 0;  // storage.aio.queue_depth; 0: job.proto's default (32)
  uint64_t host_memory_limit =
      0;  // memory.host_memory_limit; 0: 80% of RAM (DefaultHostMemoryLimit)
  uint64_t gpu_memory_limit = 0;  // memory.gpu_memory_limit; 0: the GPU's memory
};

// A job as it runs: its spec with every default written in, and the budgets that apply to it.
struct ResolvedJob {
  offloadd::v1::JobSpec spec;
  // resources.*_memory_limit when the job sets them, else the daemon's; 0 as in JobDefaults.
  // Kept beside the spec, not written into it, so that the job record shows what the job asked.
  uint64_t host_memory_limit = 0;
  uint64_t gpu_memory_limit = 0;
};

// Idempotent: a resolved spec resolves to itself. An enum value out of range (a newer client's)
// is left for validation to name.
ResolvedJob ResolveJobDefaults(const offloadd::v1::JobSpec& spec, const JobDefaults& defaults);

}  // namespace offloadd::daemon
